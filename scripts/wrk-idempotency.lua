-- wrk script for scripts/bench-proxy.sh: every request is a POST with a
-- fresh Idempotency-Key, so that each one reserves and completes a key (the
-- write path), never replays. Keys are unique across threads (the thread's
-- number) and across runs (the run name given after --):
--
--   wrk -t2 -c32 -d10s -s scripts/wrk-idempotency.lua http://127.0.0.1:8080/payments -- run-1
--
-- At the end it prints one line that bench-proxy.sh reads:
--
--   RESULT requests=N seconds=S rps=R p50us=P p99us=Q non2xx=E errors=F

local threads = {}
local counter = 0

function setup(thread)
  thread:set("thread_id", #threads)
  table.insert(threads, thread)
end

function init(args)
  local run = args[1] or tostring(os.time())
  prefix = run .. "-" .. thread_id .. "-"
  headers = {
    ["Content-Type"] = "application/json",
    -- idem serve scopes keys by the caller's credentials.
    ["Authorization"] = "Bearer bench",
  }
  body = '{"amount":1000,"currency":"usd"}'
end

function request()
  counter = counter + 1
  headers["Idempotency-Key"] = prefix .. counter
  return wrk.format("POST", nil, headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  local ok = summary.requests - e.status
  io.write(string.format("RESULT requests=%d seconds=%.2f rps=%.0f p50us=%d p99us=%d non2xx=%d errors=%d\n",
    summary.requests, secs, ok / secs, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
