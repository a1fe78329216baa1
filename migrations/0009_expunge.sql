-- 0009: an event's payload can be expunged (`DELETE /v1/events/{id}/payload`, `notifier tenant
-- expunge`): `payload` becomes JSON null — never a payload an event can be posted with, which
-- is always an object — and `payload_expunged_at` says when. NULL: the payload is there.
-- An ALTER of the table (partitioned or not) reaches every partition.
ALTER TABLE events ADD COLUMN IF NOT EXISTS payload_expunged_at timestamptz NULL;
