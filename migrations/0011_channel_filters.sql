-- 0011: a channel's payload filter (notifier.filters, README "Payload filters"): `filter` is the
-- filter as the API took it and shows it, `filter_path` the strict jsonpath predicate it
-- compiles to, which the fan-out evaluates (`payload @@ filter_path`, queries_events.sql).
-- Both NULL: no filter, every payload matches. Written together by the channel queries.
ALTER TABLE channels ADD COLUMN IF NOT EXISTS filter jsonb NULL;
ALTER TABLE channels ADD COLUMN IF NOT EXISTS filter_path jsonpath NULL;
ALTER TABLE channels DROP CONSTRAINT IF EXISTS channels_filter_check;
ALTER TABLE channels ADD CONSTRAINT channels_filter_check
    CHECK ((filter IS NULL) = (filter_path IS NULL));
