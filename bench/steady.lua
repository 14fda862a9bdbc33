-- wrk script for the retention benchmark: bench/ingest.lua's webhooks at a steady pace.
--
--   BENCH_DELAY_MS=10 wrk -t1 -c8 -d10s --latency -s bench/steady.lua http://127.0.0.1:PORT -- \
--       CORPUS RUN_ID
--
-- Each connection waits BENCH_DELAY_MS (default 10) after every answer before its next request,
-- so the offered load is about connections * 1000 / (BENCH_DELAY_MS + latency) per second
-- whatever the server does: a latency percentile then measures the server under a fixed load,
-- not how fast it can be driven. Run from the repository root (the script loads
-- bench/ingest.lua by that path).

dofile("bench/ingest.lua")

local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "10")

function delay()
  return delay_ms
end
