-- wrk script: POST events to notifier's ingest (or the bare baseline) with the tenant's key.
-- Environment: BENCH_KEY (API key), BENCH_PATH (/v1/events or /v1/events/batch), BENCH_BATCH
-- (events per request; 1 = a single event), BENCH_TYPE (the events' type), BENCH_PAYLOAD_BYTES
-- (size of each payload, default 1024), BENCH_DELAY_MS (a pause before each request on a
-- connection: pacing; default none), BENCH_OUT (where done() writes its figures as JSON),
-- BENCH_PAYLOAD (a JSON object every event carries as it is, instead of the generated one).

local batch = tonumber(os.getenv("BENCH_BATCH") or "1")
local event_type = os.getenv("BENCH_TYPE") or "bench.ingest"
local size = tonumber(os.getenv("BENCH_PAYLOAD_BYTES") or "1024")
local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "0")
local out = os.getenv("BENCH_OUT")
local fixed_payload = os.getenv("BENCH_PAYLOAD")

-- A payload of about `size` bytes of JSON: a few typed fields and a text that fills the rest.
local function payload(i)
  if fixed_payload and #fixed_payload > 0 then return fixed_payload end
  local head = string.format(
    '{"order_id":"ord_%08d","amount_cents":129900,"currency":"EUR","items":3,"note":"', i)
  local fill = string.rep("x", math.max(0, size - #head - 2))
  return head .. fill .. '"}'
end

local function event(i)
  return string.format('{"type":"%s","payload":%s}', event_type, payload(i))
end

local body
if batch > 1 then
  local events = {}
  for i = 1, batch do events[i] = event(i) end
  body = '{"events":[' .. table.concat(events, ",") .. ']}'
else
  body = event(1)
end

wrk.method = "POST"
wrk.path = os.getenv("BENCH_PATH") or "/v1/events"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "")

if delay_ms > 0 then
  -- uniform in [0.5, 1.5] x the mean, so that the connections do not march in lockstep
  math.randomseed(os.time())
  function delay()
    return delay_ms * (0.5 + math.random())
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local text = string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d},"latency_us":{"p50":%d,"p90":%d,"p99":%d,' ..
    '"max":%d,"mean":%.1f}}',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean)
  if out then
    local f = assert(io.open(out, "w"))
    f:write(text)
    f:close()
  else
    io.write(text .. "\n")
  end
end
