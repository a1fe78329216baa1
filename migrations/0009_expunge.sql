-- 0009: an event's payload can be expunged (`DELETE /v1/events/{id}/payload`, `notifier tenant
-- expunge`): `payload` becomes JSON null — never a payload an event can be posted with, which
-- is always an object — and `payload_expunged_at` says when. NULL: the payload is there.
-- An ALTER of the table (partitioned or not) reaches every partition.
ALTER TABLE events ADD COLUMN IF NOT EXISTS payload_expunged_at timestamptz NULL;
-- A tenant's events in time order: `notifier tenant expunge --before` walks them, a batch at a
-- time, without reading the other tenants' events.
CREATE INDEX IF NOT EXISTS events_tenant_created_idx ON events (tenant_id, created_at, id);
