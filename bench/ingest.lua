-- wrk script for the ingest benchmark: GitHub-signed `issues` webhooks from a pre-signed corpus.
--
--   wrk -t2 -c64 -d30s --latency -s bench/ingest.lua http://127.0.0.1:PORT -- \
--       CORPUS RUN_ID [DUP_EVERY] [QUOTA DONE_FILE]
--
-- CORPUS has one `<X-Hub-Signature-256>\t<body>` line per body (bench/corpus.py writes one).
-- Every request gets a fresh `X-GitHub-Delivery` id (RUN_ID-thread-n) and the next corpus body
-- with its precomputed signature. Every DUP_EVERY-th request (default 10, so 10%; 0 = none)
-- re-sends the id and body of the request sent 5 before it on the same thread: a provider's
-- retry, sometimes still in flight, that hookd must answer `duplicate: true`.
-- With QUOTA, a thread sends at most QUOTA webhooks: requests past the quota go to an unknown
-- source (a 404 that writes nothing); once the webhooks in flight are answered the thread stops
-- and creates DONE_FILE (wrk only exits at the end of -d or on SIGINT: the driver waits for the
-- file, then interrupts it). Count what the server stored: one webhook may be left unsent.
-- At the end the totals of 202s, `duplicate:true` answers and other statuses are printed.
-- HOOK_PATH (environment) names another path to post to than /hooks/github (a second source).

local threads = {}
local counter = 1

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local corpus, run = args[1], args[2]
  dup_every = tonumber(args[3] or "10")
  quota = tonumber(args[4] or "0")
  done_file = args[5]
  run_id = run or tostring(os.time())
  hook_path = os.getenv("HOOK_PATH") or "/hooks/github"
  sigs, bodies = {}, {}
  for line in io.lines(corpus) do
    local sig, body = line:match("^([^\t]+)\t(.*)$")
    sigs[#sigs + 1] = sig
    bodies[#bodies + 1] = body
  end
  assert(#bodies > 0, "empty corpus " .. corpus)
  n, sent, past_quota = 0, 0, false
  accepted, duplicates, other = 0, 0, 0
  headers = {
    ["Content-Type"] = "application/json",
    ["User-Agent"] = "GitHub-Hookshot/bench",
    ["X-GitHub-Event"] = "issues",
  }
end

function request()
  n = n + 1
  if quota > 0 and n > quota then
    return wrk.format("POST", "/hooks/-bench-quota-reached", headers, "")
  end
  sent = sent + 1
  local seq = n
  if dup_every > 0 and n % dup_every == 0 and n > 5 then
    seq = n - 5
  end
  local i = (seq % #bodies) + 1
  headers["X-GitHub-Delivery"] = run_id .. "-" .. tid .. "-" .. seq
  headers["X-Hub-Signature-256"] = sigs[i]
  return wrk.format("POST", hook_path, headers, bodies[i])
end

function response(status, headers, body)
  if status == 202 then
    accepted = accepted + 1
    if body:find('"duplicate":true', 1, true) then
      duplicates = duplicates + 1
    end
  elseif status == 404 and quota > 0 then
    past_quota = true
  else
    other = other + 1
  end
  -- Past the quota, stop once the webhooks still in flight are answered (all but one: wrk
  -- formats one request it may never send). wrk itself runs until its duration ends or it gets
  -- SIGINT: the marker file tells the driver to send that.
  if past_quota and accepted + other >= sent - 1 then
    if done_file then
      io.open(done_file, "w"):close()
      done_file = nil
    end
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local a, d, o = 0, 0, 0
  for _, thread in ipairs(threads) do
    a = a + thread:get("accepted")
    d = d + thread:get("duplicates")
    o = o + thread:get("other")
  end
  local secs = summary.duration / 1e6
  io.write(string.format(
    "BENCH accepted=%d duplicates=%d other=%d seconds=%.2f accepted_per_s=%.0f p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f max_ms=%.2f\n",
    a, d, o, secs, a / secs,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
