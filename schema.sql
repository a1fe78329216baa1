-- notifier schema: the whole current schema, for reading and for tests. `notifier migrate` does
-- not apply this file: it applies the versioned migrations in migrations/ (recorded in the
-- table schema_migrations), and a test holds the two to the same result. A change to the
-- schema goes here AND into a new migrations/NNNN_<what>.sql.

CREATE TABLE IF NOT EXISTS tenants (
    id            uuid PRIMARY KEY,
    name          text NOT NULL UNIQUE,
    api_key_hash  text NOT NULL UNIQUE,          -- hex SHA-256 of the API key; the key is shown once
    created_at    timestamptz NOT NULL DEFAULT now()
);
-- A disabled tenant (`notifier tenant disable`): its API key is refused, its events fan out to
-- no channel (migrations/0002).
ALTER TABLE tenants ADD COLUMN IF NOT EXISTS enabled boolean NOT NULL DEFAULT true;

-- Every change to a tenant (created, a key rotated, disabled or enabled, renamed, deleted), by
-- any tool, is NOTIFYed on `notifier_tenants` with the tenant's id, in the transaction that
-- makes it: each ingest process LISTENs there and forgets that tenant's cached key at once, and
-- the keys it remembered as matching no tenant (notifier.ingest.tenants; migrations/0003, the
-- new tenant since migrations/0006).
CREATE OR REPLACE FUNCTION notifier_tenant_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('notifier_tenants', NEW.id::text);
    ELSE
        PERFORM pg_notify('notifier_tenants', OLD.id::text);
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS tenants_notify ON tenants;
CREATE TRIGGER tenants_notify AFTER INSERT OR UPDATE OR DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION notifier_tenant_changed();

-- The event-type catalog (migrations/0010). A tenant may register event types, each with a
-- JSON Schema (draft 2020-12) that `POST /v1/events` (and AMQP ingest) checks the payloads of
-- that type against; with `strict_event_types` on, a type it has not registered is refused.
ALTER TABLE tenants ADD COLUMN IF NOT EXISTS strict_event_types boolean NOT NULL DEFAULT false;
CREATE TABLE IF NOT EXISTS event_types (
    tenant_id    uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name         text NOT NULL,
    description  text NOT NULL DEFAULT '',
    schema       jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);
-- A change to a tenant's catalog is NOTIFYed on `notifier_catalogs` with the tenant's id: each
-- ingest process forgets the tenant's compiled catalog at once. A channel of its own, not
-- `notifier_tenants`: that one also empties the caches of API keys (the unknown ones of every
-- tenant), which a tenant must not be able to do at will by writing its catalog.
CREATE OR REPLACE FUNCTION notifier_event_types_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('notifier_catalogs', OLD.tenant_id::text);
    ELSE
        PERFORM pg_notify('notifier_catalogs', NEW.tenant_id::text);
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS event_types_notify ON event_types;
CREATE TRIGGER event_types_notify AFTER INSERT OR UPDATE OR DELETE ON event_types
    FOR EACH ROW EXECUTE FUNCTION notifier_event_types_changed();

CREATE TABLE IF NOT EXISTS channels (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    type          text NOT NULL,
    name          text NOT NULL DEFAULT '',
    config        jsonb NOT NULL,
    recipient     text NULL,
    event_types   text[] NOT NULL DEFAULT ARRAY['*'],
    enabled       boolean NOT NULL DEFAULT true,
    max_attempts  integer NULL CHECK (max_attempts IS NULL OR max_attempts >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
-- Why and when a channel was disabled (by notifier, e.g. its receiver answered 410, or by a
-- PATCH); cleared when it is enabled again.
ALTER TABLE channels ADD COLUMN IF NOT EXISTS disabled_reason text NULL;
ALTER TABLE channels ADD COLUMN IF NOT EXISTS disabled_at timestamptz NULL;
-- Channel health, kept by the workers: failed attempts since the last success, when that run of
-- failures began, and the last success. A channel failing without a success for
-- [channel_health] disable_after_failing_seconds is disabled automatically.
ALTER TABLE channels ADD COLUMN IF NOT EXISTS consecutive_failures integer NOT NULL DEFAULT 0;
ALTER TABLE channels ADD COLUMN IF NOT EXISTS failing_since timestamptz NULL;
ALTER TABLE channels ADD COLUMN IF NOT EXISTS last_success_at timestamptz NULL;
-- At most this many deliveries per second to the channel, across every worker process (a
-- shared bucket in rate_buckets, `channel:<id>`); NULL = no limit. At least one an hour
-- (1/3600 per second, notifier.config.MIN_RATE_PER_SECOND): a bucket's period is 1/rate.
ALTER TABLE channels ADD COLUMN IF NOT EXISTS rate_limit_per_second double precision NULL
    CONSTRAINT channels_rate_limit_per_second_check
    CHECK (rate_limit_per_second IS NULL OR rate_limit_per_second >= 1.0 / 3600);
-- The first check took any rate above 0: raise a lower one to the minimum (such a channel's
-- bucket could not be written: its period was past any timestamp), then replace the check, once.
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conname = 'channels_rate_limit_per_second_check'
          AND pg_get_constraintdef(oid) LIKE '%3600%'
    ) THEN
        UPDATE channels SET rate_limit_per_second = 1.0 / 3600
        WHERE rate_limit_per_second < 1.0 / 3600;
        ALTER TABLE channels DROP CONSTRAINT IF EXISTS channels_rate_limit_per_second_check;
        ALTER TABLE channels ADD CONSTRAINT channels_rate_limit_per_second_check
            CHECK (rate_limit_per_second IS NULL OR rate_limit_per_second >= 1.0 / 3600);
    END IF;
END;
$$;
-- 0011: a channel's payload filter (notifier.filters, README "Payload filters"): `filter` is the
-- filter as the API took it and shows it, `filter_path` the strict jsonpath predicate it
-- compiles to, which the fan-out evaluates (`payload @@ filter_path`, queries_events.sql).
-- Both NULL: no filter, every payload matches. Written together by the channel queries.
ALTER TABLE channels ADD COLUMN IF NOT EXISTS filter jsonb NULL;
ALTER TABLE channels ADD COLUMN IF NOT EXISTS filter_path jsonpath NULL;
ALTER TABLE channels DROP CONSTRAINT IF EXISTS channels_filter_check;
ALTER TABLE channels ADD CONSTRAINT channels_filter_check
    CHECK ((filter IS NULL) = (filter_path IS NULL));
-- 0013: a channel's `customer` label (the customer portal, below).
ALTER TABLE channels ADD COLUMN IF NOT EXISTS customer text NULL;
-- 0014: FIFO (ordered) channels (README "Ordered delivery (FIFO)", docs/architecture.md §5).
-- `channels.ordering` is 'none' or 'fifo'. A FIFO channel's deliveries get `fifo_seq`, their
-- acceptance order, from the channel's counter row in `fifo_counters`, taken in the fan-out
-- (or replay) statement itself: the row lock makes the transactions of one FIFO channel commit
-- in the order of their numbers, so a worker that reads the lowest unfinished number never
-- passes one that is still to commit. Ordinary channels have no counter row and NULL numbers.
ALTER TABLE channels ADD COLUMN IF NOT EXISTS ordering text NOT NULL DEFAULT 'none'
    CONSTRAINT channels_ordering_check CHECK (ordering IN ('none', 'fifo'));
CREATE TABLE IF NOT EXISTS fifo_counters (
    channel_id  uuid PRIMARY KEY REFERENCES channels (id) ON DELETE CASCADE,
    last_seq    bigint NOT NULL
);
-- Fan-out reads the enabled channels of one tenant.
CREATE INDEX IF NOT EXISTS channels_fanout_idx ON channels (tenant_id) WHERE enabled;
CREATE INDEX IF NOT EXISTS channels_list_idx ON channels (tenant_id, created_at, id);

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
-- An expunged event (`DELETE /v1/events/{id}/payload`, `notifier tenant expunge`): its payload
-- is JSON null (never an event's payload otherwise: that is an object) since this time; NULL
-- while the payload is there (migrations/0009).
ALTER TABLE events ADD COLUMN IF NOT EXISTS payload_expunged_at timestamptz NULL;
-- A tenant's events in time order: `notifier tenant expunge --before` walks them.
CREATE INDEX IF NOT EXISTS events_tenant_created_idx ON events (tenant_id, created_at, id);
-- The W3C traceparent the event was ingested under (the caller's, or the ingest span's when
-- tracing is on); NULL: none (migrations/0012).
ALTER TABLE events ADD COLUMN IF NOT EXISTS traceparent text NULL;

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
-- 0014: a FIFO channel's acceptance order (NULL for ordinary channels).
ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS fifo_seq bigint NULL;
-- A FIFO channel's unfinished deliveries in order: the worker's head of the line, /metrics' lag.
CREATE INDEX IF NOT EXISTS deliveries_fifo_idx ON deliveries (channel_id, fifo_seq)
    WHERE fifo_seq IS NOT NULL AND status IN ('PENDING', 'RETRYING');
-- Dead deliveries in age order, per tenant: what `GET /v1/deliveries?status=DEAD` and a replay
-- look for, without reading through every delivered one.
CREATE INDEX IF NOT EXISTS deliveries_dead_idx ON deliveries (tenant_id, created_at, id)
    WHERE status = 'DEAD';

CREATE TABLE IF NOT EXISTS delivery_attempts (
    id                   bigserial NOT NULL,
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
-- The trace and span ids of the attempt's span; NULL: not traced (migrations/0012).
ALTER TABLE delivery_attempts ADD COLUMN IF NOT EXISTS trace_id text NULL;
ALTER TABLE delivery_attempts ADD COLUMN IF NOT EXISTS span_id text NULL;
CREATE INDEX IF NOT EXISTS delivery_attempts_delivery_idx ON delivery_attempts (delivery_id, id);
-- A delivery's latest replay, which the worker reads with every message (delivery_states):
-- the replays alone, so a delivery never replayed costs one empty probe.
CREATE INDEX IF NOT EXISTS delivery_attempts_replays_idx ON delivery_attempts (delivery_id, attempt)
    WHERE outcome = 'replayed' AND error IS NULL;

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

SELECT notifier_partitions_ensure((now() AT TIME ZONE 'UTC')::date,
                                  (now() AT TIME ZONE 'UTC')::date + 7);

-- The transactional outbox. A row is written in the same transaction as its delivery and deleted
-- by the relay only after RabbitMQ confirmed the publish. `publish_failures` counts publishes the
-- broker refused (returned as unroutable, or nacked); such a row waits until `available_at`
-- before the relay tries it again, so one bad row never hot-loops the relay.
CREATE TABLE IF NOT EXISTS outbox (
    id                bigserial PRIMARY KEY,
    delivery_id       uuid NOT NULL,
    routing_key       text NOT NULL,
    body              bytea NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    publish_failures  integer NOT NULL DEFAULT 0,
    available_at      timestamptz NOT NULL DEFAULT now(),
    last_error        text NULL
);
-- The claim's hot path: fresh rows in id order. Partial, so it holds only rows never refused.
-- The event's traceparent, sent by the relay as the AMQP header `traceparent` (migrations/0012).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS traceparent text NULL;
CREATE INDEX IF NOT EXISTS outbox_fresh_idx ON outbox (id) WHERE publish_failures = 0;
-- Rows the broker refused, by when they may be tried again.
CREATE INDEX IF NOT EXISTS outbox_backoff_idx ON outbox (available_at) WHERE publish_failures > 0;

-- The relay's doorbell: one NOTIFY per inserting statement (not per row). It only wakes the
-- relay; the outbox table stays the data path, and the relay also polls.
CREATE OR REPLACE FUNCTION notifier_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('notifier_outbox', '');
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION notifier_outbox_notify();

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

-- Whether an event of type `event_type` matches `pattern` (one of a channel's `event_types`, or
-- a replay's filter): `*` matches every type, `prefix.*` every type that starts with `prefix.`
-- (not `prefix` itself), anything else only the same type. notifier.testing.pattern_matches
-- states the rule in Python for the in-memory fakes; a test holds the two to the same cases.
CREATE OR REPLACE FUNCTION notifier_type_matches(pattern text, event_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pattern = '*' OR pattern = event_type
        OR (right(pattern, 2) = '.*' AND starts_with(event_type, left(pattern, -1)))
$$;

-- The state of a delivery's channel as the workers and a replay see it: 'enabled', 'disabled',
-- or 'deleted' (`c` is the all-NULL row of an outer join that found no channel).
CREATE OR REPLACE FUNCTION notifier_channel_state(c channels) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN c.id IS NULL THEN 'deleted' WHEN c.enabled THEN 'enabled' ELSE 'disabled' END
$$;

-- Rate limits shared by every process (notifier/ratelimit.py, docs/architecture.md §5): one row
-- per bucket, named by `key` (`telegram:<bot>`, `telegram:<bot>:tenant:<tenant>`,
-- `telegram:<bot>:tenant:<tenant>:chat:<chat>`, `channel:<id>`, `ingest:<tenant>`).
-- Times are seconds since the epoch on Postgres's clock, so the processes' clocks do not matter.
-- A "window" bucket keeps in `spent` when each of its tokens still out was spent (each comes back
-- `period` seconds later); a "refilling" bucket keeps its theoretical arrival time `tat` (GCRA).
-- `full_at`: from then on the bucket is the same as a new one, and maintenance deletes it.
-- UNLOGGED: buckets are soft state written on every limited delivery, and sparing them the WAL
-- is worth it; a crash (or a failover) empties the table, which lets one burst more through.
-- No index but the key, so every write of a bucket is a HOT update.
CREATE UNLOGGED TABLE IF NOT EXISTS rate_buckets (
    key      text PRIMARY KEY,
    spent    double precision[] NOT NULL DEFAULT '{}',
    tat      double precision NULL,
    full_at  timestamptz NOT NULL DEFAULT now()
);

-- Lock the buckets `keys` (distinct), creating the missing ones new; then the time `at`, or
-- Postgres's clock now (read once the locks are held). One statement takes every lock in key
-- order, an existing row's and a new one's alike, so concurrent takes cannot deadlock on them
-- (locking the existing rows first and inserting the missing ones after could: a transaction
-- would hold `b` while inserting `a`, and another that inserted `a` wait for `b`). The no-op
-- update is what locks an existing row; it writes a row version each time, a HOT update of an
-- UNLOGGED table.
CREATE OR REPLACE FUNCTION notifier_rate_lock(keys text[], at double precision)
RETURNS double precision
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(keys) <> (SELECT count(DISTINCT k) FROM unnest(keys) k) THEN
        RAISE EXCEPTION 'rate buckets %: a key given twice', keys;
    END IF;
    INSERT INTO rate_buckets AS b (key)
    SELECT k FROM unnest(keys) k ORDER BY k
    ON CONFLICT (key) DO UPDATE SET full_at = b.full_at;
    RETURN coalesce(at, extract(epoch FROM clock_timestamp())::double precision);
END;
$$;

-- Take one token of each window bucket `keys[i]` (distinct keys; `tokens[i]` tokens, each back
-- `periods[i]` seconds after it was spent), all or none: 0 when taken, else the seconds until
-- every one of them has a token (nothing taken). notifier.ratelimit.TokenBucket states the same
-- rule in Python; tests/integration/test_rate_buckets.py holds the two to the same cases. `at`
-- (tests only) replaces Postgres's clock.
CREATE OR REPLACE FUNCTION notifier_rate_take(
    keys text[], tokens integer[], periods double precision[], at double precision DEFAULT NULL
) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    now_s double precision := notifier_rate_lock(keys, at);
    wait double precision;
BEGIN
    SELECT coalesce(max(CASE WHEN cardinality(s.kept) < s.tokens THEN 0
                             ELSE greatest(0, s.kept[cardinality(s.kept) - s.tokens + 1]
                                              + s.period - now_s) END), 0)
    INTO wait
    FROM (
        SELECT i.tokens, i.period,
               ARRAY(SELECT t FROM unnest(b.spent) t WHERE t + i.period > now_s + 1e-9 ORDER BY t)
                   AS kept
        FROM unnest(keys, tokens, periods) AS i(key, tokens, period)
        JOIN rate_buckets b ON b.key = i.key
    ) s;
    IF wait > 0 THEN
        RETURN wait;
    END IF;
    UPDATE rate_buckets b SET
        spent = s.kept[greatest(1, cardinality(s.kept) + 2 - s.tokens):] || now_s,
        full_at = to_timestamp(least(now_s + s.period, 1e11))  -- 5138 at most: see below
    FROM (
        SELECT i.key, i.tokens, i.period,
               ARRAY(SELECT t FROM unnest(b2.spent) t WHERE t + i.period > now_s + 1e-9 ORDER BY t)
                   AS kept
        FROM unnest(keys, tokens, periods) AS i(key, tokens, period)
        JOIN rate_buckets b2 ON b2.key = i.key
    ) s
    WHERE b.key = s.key;
    RETURN 0;
END;
$$;

-- Take `n` tokens of the refilling bucket `bucket` (`capacity` tokens, `rate` back per second;
-- a GCRA: the bucket keeps the time `tat` it will be full again): 0 when taken, else the seconds
-- until there are `n` (nothing taken). notifier.ratelimit.RefillingBucket states the same rule
-- in Python. `at` (tests only) replaces Postgres's clock.
CREATE OR REPLACE FUNCTION notifier_rate_admit(
    bucket text, capacity integer, rate double precision, n integer,
    at double precision DEFAULT NULL
) RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    now_s double precision := notifier_rate_lock(ARRAY[bucket], at);
    next_tat double precision;
    wait double precision;
BEGIN
    SELECT greatest(coalesce(b.tat, now_s), now_s) + n / rate INTO next_tat
    FROM rate_buckets b WHERE b.key = bucket;
    wait := next_tat - now_s - capacity / rate;
    IF wait > 1e-9 / rate THEN
        RETURN wait;
    END IF;
    -- least(): a rate allowed once may be lower than today's minimum (full_at stops in 5138).
    UPDATE rate_buckets SET tat = next_tat, full_at = to_timestamp(least(next_tat, 1e11))
    WHERE key = bucket;
    RETURN 0;
END;
$$;

-- The circuit breaker of each destination (notifier/worker/circuit.py, docs/architecture.md §5),
-- shared by every worker process: one row per (channel type, destination) that has failed to be
-- reached. `consecutive_failures` unreachable failures in a row open it ('open', since
-- `opened_at`): deliveries are deferred until `next_probe_at`, when one process claims the probe
-- ('half_open'; `next_probe_at` is then when the probe's lease ends). A failed probe opens it
-- again with `probe_interval_seconds` doubled; a success closes it. Times are Postgres's.
-- Maintenance deletes rows closed and unchanged for an hour (migrations/0005).
CREATE TABLE IF NOT EXISTS circuits (
    channel_type            text NOT NULL,
    destination             text NOT NULL,
    state                   text NOT NULL DEFAULT 'closed'
                            CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive_failures    integer NOT NULL DEFAULT 0,
    opened_at               timestamptz NULL,
    next_probe_at           timestamptz NULL,
    probe_interval_seconds  double precision NULL,
    changed_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (channel_type, destination)
);
-- What every worker group reads each second: the circuits in trouble, few or none.
CREATE INDEX IF NOT EXISTS circuits_troubled_idx ON circuits (channel_type)
    WHERE state <> 'closed' OR consecutive_failures > 0;

-- The console's sessions (notifier/console/session.py): one row per signed-in browser, keyed by
-- the SHA-256 of the random session id its cookie holds (the id itself is never stored), with
-- the tenant and the hash of the API key it signed in with. Signing out deletes the row; a
-- tenant's key replaced or the tenant disabled deletes its rows (the trigger below), and a
-- session is only read while its tenant still has that key and is enabled. Maintenance deletes
-- rows past `expires_at` (migrations/0007).
CREATE TABLE IF NOT EXISTS console_sessions (
    id_hash       text PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    api_key_hash  text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS console_sessions_tenant_idx ON console_sessions (tenant_id);
CREATE INDEX IF NOT EXISTS console_sessions_expires_idx ON console_sessions (expires_at);

CREATE OR REPLACE FUNCTION notifier_end_console_sessions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM console_sessions WHERE tenant_id = NEW.id;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS tenants_end_console_sessions ON tenants;
CREATE TRIGGER tenants_end_console_sessions AFTER UPDATE OF api_key_hash, enabled ON tenants
    FOR EACH ROW
    WHEN (OLD.api_key_hash IS DISTINCT FROM NEW.api_key_hash OR (OLD.enabled AND NOT NEW.enabled))
    EXECUTE FUNCTION notifier_end_console_sessions();

-- Failed console sign-ins per client address, shared by the fleet: after 5 free failures each
-- further attempt from the address waits 1 s, doubling up to 60 s, counted from the last one;
-- an address quiet for 15 minutes starts again from nothing, and maintenance deletes its row.
-- A success deletes it.
CREATE TABLE IF NOT EXISTS console_signin_failures (
    address         text PRIMARY KEY,
    failures        integer NOT NULL,
    last_failed_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS console_signin_failures_last_idx
    ON console_signin_failures (last_failed_at);

-- 0013: the customer portal (README "Customer portal", docs/architecture.md). A channel may carry
-- a `customer` label: the tenant's own customer it belongs to, which a portal link can be scoped
-- to. A portal link is scoped to one customer label or to a fixed list of the tenant's channels,
-- and is kept by the SHA-256 of its token only (the token is in the link's URL, never stored).
-- It opens sessions until it expires or is revoked; a session is read only while its link is
-- neither (so revoking a link ends its sessions at once), and revoking deletes them too.
-- (channels.customer is added above, before 0014's ordering, in the order the migrations add them)
CREATE INDEX IF NOT EXISTS channels_customer_idx ON channels (tenant_id, customer)
    WHERE customer IS NOT NULL;

CREATE TABLE IF NOT EXISTS portal_links (
    id           uuid PRIMARY KEY,
    tenant_id    uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    token_hash   text NOT NULL UNIQUE,
    customer     text NULL,
    channel_ids  uuid[] NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    revoked_at   timestamptz NULL,
    CONSTRAINT portal_links_scope_check CHECK ((customer IS NULL) <> (channel_ids IS NULL))
);
CREATE INDEX IF NOT EXISTS portal_links_tenant_idx ON portal_links (tenant_id, created_at, id);

CREATE TABLE IF NOT EXISTS portal_sessions (
    id_hash       text PRIMARY KEY,
    link_id       uuid NOT NULL REFERENCES portal_links (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS portal_sessions_link_idx ON portal_sessions (link_id);
