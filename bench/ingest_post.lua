-- wrk script for the ingest probe: POST /v1/events (or /v1/events/batch with BATCH > 1)
-- with a Bearer API key and ~1 KB JSON payloads. Environment: API_KEY, BATCH (default 1),
-- KEYED (1: every event carries a fresh idempotency key).
local key = os.getenv("API_KEY") or "none"
local batch = tonumber(os.getenv("BATCH") or "1")
local keyed = os.getenv("KEYED") == "1"
local filler = string.rep("x", 900)
local counter = 0
local thread_tag = tostring(math.random(1, 1e9))

local function event()
  counter = counter + 1
  local body = '{"type":"bench.x","payload":{"i":' .. counter .. ',"note":"' .. filler .. '"}'
  if keyed then
    body = body .. ',"idempotency_key":"k-' .. thread_tag .. '-' .. counter .. '"'
  end
  return body .. '}'
end

request = function()
  local path, body
  if batch > 1 then
    local events = {}
    for i = 1, batch do events[i] = event() end
    path, body = "/v1/events/batch", '{"events":[' .. table.concat(events, ",") .. ']}'
  else
    path, body = "/v1/events", event()
  end
  return wrk.format("POST", path, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. key,
  }, body)
end

local statuses = {}
response = function(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d seconds=%.3f p50_ms=%.2f p99_ms=%.2f errors=%d\n",
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e3,
    latency:percentile(99) / 1e3,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.status + summary.errors.timeout))
end
