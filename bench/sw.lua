-- wrk script for the side-by-side ingest benchmark: Standard Webhooks messages from a corpus in
-- which every message is signed (bench/corpus.py --standard-webhooks RUN).
--
--   wrk -t2 -c64 -d300s --latency -s bench/sw.lua http://127.0.0.1:PORT -- \
--       CORPUS SOURCE THREADS DUP_EVERY QUOTA DONE_FILE
--
-- Thread t of THREADS (wrk's -t) sends messages t, t + THREADS, ... of CORPUS to /hooks/SOURCE,
-- at most QUOTA of them (and never past the corpus); every DUP_EVERY-th request (10: 10%; 0 =
-- none) re-sends the message sent 5 before it on the same thread, a provider's retry. Then it
-- stops as bench/ingest.lua's quota does (DONE_FILE tells the driver to interrupt wrk). The same
-- corpus can load several receivers, each with a database of its own. Totals are printed as
-- bench/ingest.lua prints them. Run from the repository root.

dofile("bench/ingest.lua")

function init(args)
  source, threads_total = args[2], tonumber(args[3])
  dup_every, quota, done_file = tonumber(args[4]), tonumber(args[5]), args[6]
  ids, stamps, signatures, messages = {}, {}, {}, {}
  local i = 0
  for line in io.lines(args[1]) do
    i = i + 1
    if i % threads_total == tid % threads_total then
      local id, ts, sig, body = line:match("^([^\t]+)\t([^\t]+)\t([^\t]+)\t(.*)$")
      ids[#ids + 1], stamps[#stamps + 1] = id, ts
      signatures[#signatures + 1], messages[#messages + 1] = sig, body
    end
  end
  assert(#messages > 0, "no messages for this thread in " .. args[1])
  n, sent, past_quota = 0, 0, false
  accepted, duplicates, other = 0, 0, 0
  headers = {["Content-Type"] = "application/json"}
end

function request()
  n = n + 1
  local seq = n
  if dup_every > 0 and n % dup_every == 0 and n > 5 then
    seq = n - 5
  end
  if n > quota or n > #messages then
    -- A path no receiver routes: a 404 that writes nothing, and the sign the quota is reached.
    return wrk.format("GET", "/-bench-quota-reached")
  end
  sent = sent + 1
  headers["webhook-id"] = ids[seq]
  headers["webhook-timestamp"] = stamps[seq]
  headers["webhook-signature"] = signatures[seq]
  return wrk.format("POST", "/hooks/" .. source, headers, messages[seq])
end
