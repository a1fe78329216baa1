-- 0008: the history (events, deliveries, delivery_attempts) partitioned by day (UTC), so that
-- retention drops a day's partitions instead of deleting rows; idempotency keys move to a table
-- of their own (event_keys). The tables as they were are renamed `<table>_legacy` and, when they
-- hold rows, attached as one partition of each new table, from the beginning of time to this
-- migration (nothing is copied: only an index on (id, created_at) is built, and each table is
-- read once to check its rows); retention drops the three once they are `retention_days` old with
-- no delivery unfinished. Empty, they are dropped. See schema.sql and docs/architecture.md §3.

-- Takes the old tables' row types: made again below for the new tables.
DROP FUNCTION IF EXISTS notifier_worker_message(deliveries, events, jsonb, integer);

-- No foreign keys inside the history (see schema.sql).
ALTER TABLE delivery_attempts DROP CONSTRAINT IF EXISTS delivery_attempts_delivery_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_event_id_fkey;

ALTER TABLE events RENAME TO events_legacy;
ALTER TABLE deliveries RENAME TO deliveries_legacy;
ALTER TABLE delivery_attempts RENAME TO delivery_attempts_legacy;
-- Index names are the schema's: the new tables' take the old names.
DO $$
DECLARE
    ix record;
BEGIN
    FOR ix IN
        SELECT indexname FROM pg_indexes
        WHERE schemaname = current_schema()
          AND tablename IN ('events_legacy', 'deliveries_legacy', 'delivery_attempts_legacy')
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.indexname,
                       regexp_replace(ix.indexname, '^(delivery_attempts|deliveries|events)_',
                                      '\1_legacy_'));
    END LOOP;
END;
$$;
-- The attempts' ids go on from the same sequence, which the new table owns.
ALTER SEQUENCE delivery_attempts_id_seq OWNED BY NONE;
-- An old attempt's delivery time is not needed to find its partition (the legacy one holds every
-- old attempt): a constant, which Postgres adds without rewriting the table.
ALTER TABLE delivery_attempts_legacy
    ADD COLUMN delivery_created_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE delivery_attempts_legacy ALTER COLUMN delivery_created_at DROP DEFAULT;

-- The history: events, their deliveries and the deliveries' attempts, partitioned by day (UTC)
-- on the event's creation time. A delivery's `created_at` is its event's and an attempt's
-- `delivery_created_at` its delivery's, so one day of history is three partitions
-- (`events_pYYYYMMDD`, `deliveries_pYYYYMMDD`, `delivery_attempts_pYYYYMMDD`), created ahead by
-- notifier_partitions_ensure (`notifier migrate` and every maintenance pass) and dropped
-- together by retention (notifier_partition_drop) once past `retention_days` with no delivery
-- unfinished: no row is deleted one by one. There is no foreign key between the three: one to a
-- partitioned table would make every drop scan the tables that refer to it; notifier's own
-- statements write an event with its deliveries, and retention drops them together. A database
-- converted from the unpartitioned tables (migrations/0008) holds their rows in one more
-- partition of each, `<table>_legacy`, from the beginning of time to the conversion, dropped the
-- same way once the conversion is `retention_days` old. docs/architecture.md §3.
CREATE TABLE IF NOT EXISTS events (
    id               uuid NOT NULL,
    tenant_id        uuid NOT NULL
                     CONSTRAINT events_tenant_id_fkey REFERENCES tenants (id) ON DELETE CASCADE,
    type             text NOT NULL,
    recipient        text NULL,
    payload          jsonb NOT NULL,
    idempotency_key  text NULL,                  -- unique per tenant: event_keys holds it
    request_hash     text NULL,                  -- hash of the request body, to tell a replay from a conflict
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

-- An event's idempotency key, unique per tenant for as long as the event is kept: a unique index
-- of a partitioned table must hold its partition key, so the keys have a table of their own,
-- written in the same statement as their events. Maintenance deletes the keys of the days it has
-- dropped, in batches (the one row-by-row DELETE of the history: only keys, 4 small columns).
CREATE TABLE IF NOT EXISTS event_keys (
    tenant_id        uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    idempotency_key  text NOT NULL,
    event_id         uuid NOT NULL,
    created_at       timestamptz NOT NULL,       -- the event's
    PRIMARY KEY (tenant_id, idempotency_key)
);
CREATE INDEX IF NOT EXISTS event_keys_created_idx ON event_keys (created_at);

CREATE TABLE IF NOT EXISTS deliveries (
    id               uuid NOT NULL,
    event_id         uuid NOT NULL,
    channel_id       uuid NOT NULL,              -- no FK: deleting a channel keeps its delivery history
    tenant_id        uuid NOT NULL,
    channel_type     text NOT NULL,
    status           text NOT NULL DEFAULT 'PENDING'
                     CONSTRAINT deliveries_status_check
                     CHECK (status IN ('PENDING', 'RETRYING', 'DELIVERED', 'DEAD')),
    attempt          integer NOT NULL DEFAULT 0,  -- attempts made so far
    max_attempts     integer NOT NULL,
    last_error       text NULL,
    next_attempt_at  timestamptz NULL,
    delivered_at     timestamptz NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),  -- the event's created_at
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX IF NOT EXISTS deliveries_event_idx ON deliveries (event_id);
CREATE INDEX IF NOT EXISTS deliveries_list_idx ON deliveries (tenant_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS deliveries_channel_idx ON deliveries (channel_id, created_at DESC, id DESC);
-- Deliveries that are not finished yet: what an operator (and the reconciler) looks for, and
-- what retention asks a day's partition before it drops it.
CREATE INDEX IF NOT EXISTS deliveries_open_idx ON deliveries (updated_at)
    WHERE status IN ('PENDING', 'RETRYING');
-- Dead deliveries in age order, per tenant: what `GET /v1/deliveries?status=DEAD` and a replay
-- look for, without reading through every delivered one.
CREATE INDEX IF NOT EXISTS deliveries_dead_idx ON deliveries (tenant_id, created_at, id)
    WHERE status = 'DEAD';

CREATE TABLE IF NOT EXISTS delivery_attempts (
    id                   bigint NOT NULL DEFAULT nextval('delivery_attempts_id_seq'),
    delivery_id          uuid NOT NULL,
    attempt              integer NOT NULL,
    started_at           timestamptz NOT NULL,
    duration_ms          integer NOT NULL,
    outcome              text NOT NULL
                         CONSTRAINT delivery_attempts_outcome_check
                         CHECK (outcome IN ('delivered', 'retry', 'rate_limited', 'dead', 'panic',
                                            'replayed', 'deferred')),
    status_code          integer NULL,
    error                text NULL,
    response_excerpt     text NULL
                         CONSTRAINT delivery_attempts_response_excerpt_check
                         CHECK (octet_length(response_excerpt) <= 2048),
    delivery_created_at  timestamptz NOT NULL,   -- the delivery's created_at (its partition)
    PRIMARY KEY (id, delivery_created_at)
) PARTITION BY RANGE (delivery_created_at);
CREATE INDEX IF NOT EXISTS delivery_attempts_delivery_idx ON delivery_attempts (delivery_id, id);
-- A delivery's latest replay, which the worker reads with every message (delivery_states):
-- the replays alone, so a delivery never replayed costs one empty probe.
CREATE INDEX IF NOT EXISTS delivery_attempts_replays_idx ON delivery_attempts (delivery_id, attempt)
    WHERE outcome = 'replayed' AND error IS NULL;

ALTER SEQUENCE delivery_attempts_id_seq OWNED BY delivery_attempts.id;

INSERT INTO event_keys (tenant_id, idempotency_key, event_id, created_at)
SELECT tenant_id, idempotency_key, id, created_at FROM events_legacy
WHERE idempotency_key IS NOT NULL;
ALTER TABLE events_legacy DROP CONSTRAINT events_legacy_tenant_id_idempotency_key_key;
-- A partition's primary key is its table's, (id, created_at): attaching builds it.
ALTER TABLE events_legacy DROP CONSTRAINT events_legacy_pkey;
ALTER TABLE deliveries_legacy DROP CONSTRAINT deliveries_legacy_pkey;
ALTER TABLE delivery_attempts_legacy DROP CONSTRAINT delivery_attempts_legacy_pkey;

DO $$
DECLARE
    converted timestamptz := now();
    today date := (now() AT TIME ZONE 'UTC')::date;
    tab text;
BEGIN
    IF EXISTS (SELECT 1 FROM events_legacy) OR EXISTS (SELECT 1 FROM deliveries_legacy)
       OR EXISTS (SELECT 1 FROM delivery_attempts_legacy) THEN
        FOREACH tab IN ARRAY ARRAY['events', 'deliveries', 'delivery_attempts'] LOOP
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                           tab, tab || '_legacy', converted);
            -- The rest of today, after the legacy partition.
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                           tab || to_char(today, '"_p"YYYYMMDD'), tab, converted,
                           (today + 1)::timestamp AT TIME ZONE 'UTC');
        END LOOP;
    ELSE
        DROP TABLE delivery_attempts_legacy, deliveries_legacy, events_legacy;
    END IF;
END;
$$;

-- The partitions of the days `first_day` to `last_day` (UTC) of each history table, those not
-- there yet; returns how many it made. A day that overlaps a partition already there (the legacy
-- partition of a converted database ends in the middle of its day of conversion) is skipped.
CREATE OR REPLACE FUNCTION notifier_partitions_ensure(first_day date, last_day date)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    day date;
    tab text;
    made integer := 0;
BEGIN
    FOR day IN SELECT generate_series(first_day, last_day, interval '1 day')::date LOOP
        FOREACH tab IN ARRAY ARRAY['events', 'deliveries', 'delivery_attempts'] LOOP
            CONTINUE WHEN to_regclass(format('%I', tab || to_char(day, '"_p"YYYYMMDD')))
                          IS NOT NULL;
            BEGIN
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                               tab || to_char(day, '"_p"YYYYMMDD'), tab,
                               day::timestamp AT TIME ZONE 'UTC',
                               (day + 1)::timestamp AT TIME ZONE 'UTC');
                made := made + 1;
            EXCEPTION WHEN invalid_object_definition THEN  -- overlaps a partition there
                NULL;
            END;
        END LOOP;
    END LOOP;
    RETURN made;
END;
$$;

-- The days of history: each events partition (its suffix, `_pYYYYMMDD` or `_legacy`) with the
-- range it holds, oldest first.
CREATE OR REPLACE FUNCTION notifier_history_partitions()
RETURNS TABLE (suffix text, from_time timestamptz, to_time timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT substr(c.relname::text, length('events') + 1),
           CASE WHEN b.bound ~ 'FROM \(MINVALUE\)' THEN '-infinity'::timestamptz
                ELSE substring(b.bound FROM 'FROM \(''([^'']+)''\)')::timestamptz END,
           substring(b.bound FROM 'TO \(''([^'']+)''\)')::timestamptz
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid,
    LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) b
    WHERE i.inhparent = 'events'::regclass
    ORDER BY 3
$$;

-- Drop one day of history (the partitions of suffix `suffix` of the three tables) if none of its
-- deliveries is unfinished; true when dropped. The three parents are locked first, in the order
-- every statement takes them, so the check and the drop see the same rows and nothing waits in
-- a cycle; the caller bounds the wait with lock_timeout. The day's idempotency keys are left to
-- notifier_event_keys_cleanup.
CREATE OR REPLACE FUNCTION notifier_partition_drop(suffix text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    unfinished boolean;
BEGIN
    LOCK TABLE events, deliveries, delivery_attempts IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE status IN (''PENDING'', ''RETRYING''))',
                   'deliveries' || suffix)
        INTO unfinished;
    IF unfinished THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE %I, %I, %I', 'delivery_attempts' || suffix,
                   'deliveries' || suffix, 'events' || suffix);
    RETURN true;
END;
$$;

-- The worker message (notifier/messages.WorkerMessage, the one Python type for it) of delivery
-- `d` of event `e`, for attempt `attempt`, with the channel config `config`: the body of every
-- outbox row (ingest's fan-out, a replay, the reconciler). Its keys are the type's fields, no
-- more and no fewer; tests/integration/test_schema_functions.py holds the two to that.
CREATE OR REPLACE FUNCTION notifier_worker_message(
    d deliveries, e events, config jsonb, attempt integer
) RETURNS bytea
LANGUAGE sql STABLE AS $$
    SELECT convert_to(jsonb_build_object(
        'delivery_id', d.id, 'event_id', e.id, 'tenant_id', d.tenant_id,
        'channel_id', d.channel_id, 'channel_type', d.channel_type, 'channel_config', config,
        'event_type', e.type, 'recipient', e.recipient, 'payload', e.payload,
        'created_at', e.created_at, 'attempt', attempt, 'max_attempts', d.max_attempts)::text,
        'UTF8')
$$;

SELECT notifier_partitions_ensure((now() AT TIME ZONE 'UTC')::date,
                                  (now() AT TIME ZONE 'UTC')::date + 7);
