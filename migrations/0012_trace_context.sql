-- 0012: trace context (README, Tracing). An event keeps the W3C `traceparent` it was ingested
-- under (the caller's, or the ingest span's when tracing is on; NULL: none), and its outbox rows
-- carry it to the relay, which sends it as the AMQP header `traceparent`. Each attempt row keeps
-- the trace and span ids of its attempt span (NULL: not traced). An ALTER of the table
-- (partitioned or not) reaches every partition.
ALTER TABLE events ADD COLUMN IF NOT EXISTS traceparent text NULL;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS traceparent text NULL;
ALTER TABLE delivery_attempts ADD COLUMN IF NOT EXISTS trace_id text NULL;
ALTER TABLE delivery_attempts ADD COLUMN IF NOT EXISTS span_id text NULL;
