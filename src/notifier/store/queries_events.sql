-- Named queries of ingest: events with their fan-out, over HTTP and AMQP (store/events.py). Each
-- block starts with `-- name: NAME`; the SQL functions they call (notifier_*) are in schema.sql.

-- name: insert_events
-- One round trip for a whole batch: the events, their fan-out deliveries (the pattern rule is
-- notifier_type_matches, then the channel's payload filter) and the outbox rows carrying each delivery's worker message (built by
-- notifier_worker_message). $2 is a JSON array of {id, type, recipient, payload,
-- idempotency_key, request_hash, channel_ids, traceparent, ord}; $3 maps a channel type to its default
-- max_attempts. Events whose idempotency key already exists (in event_keys) are skipped
-- (ON CONFLICT DO NOTHING) and come back absent from the result. Keys are inserted in key
-- order, not in the order given: an insert whose key a concurrent transaction has just inserted
-- waits for that one to finish, so two batches carrying the same keys in different orders would
-- each wait for the other (a deadlock) — taking the keys in one order for all, they cannot.
-- A delivery's created_at is its event's, which puts both in the same day's partition.
WITH input AS (
    SELECT * FROM jsonb_to_recordset($2::jsonb) AS x(
        id uuid, type text, recipient text, payload jsonb, idempotency_key text,
        request_hash text, channel_ids uuid[], traceparent text, ord integer)
),
keyed AS (
    INSERT INTO event_keys AS k (tenant_id, idempotency_key, event_id, created_at)
    SELECT $1, idempotency_key, id, now() FROM input
    WHERE idempotency_key IS NOT NULL
    ORDER BY idempotency_key COLLATE "C", ord
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING k.event_id
),
ev AS (
    INSERT INTO events AS e
        (id, tenant_id, type, recipient, payload, idempotency_key, request_hash, traceparent)
    SELECT id, $1, type, recipient, payload, idempotency_key, request_hash, traceparent FROM input
    WHERE idempotency_key IS NULL OR id IN (SELECT event_id FROM keyed)
    RETURNING e.id, e.type, e.recipient, e.payload, e.created_at, e.traceparent, e AS event
),
targets AS (
    SELECT gen_random_uuid() AS delivery_id, ev.id AS event_id, ev.created_at, c.id AS channel_id,
           c.type AS channel_type, c.config,
           coalesce(c.max_attempts, ($3::jsonb ->> c.type)::integer, 5) AS max_attempts,
           c.ordering = 'fifo' AS fifo, i.ord
    FROM ev
    JOIN input i ON i.id = ev.id
    -- A disabled tenant's event reaches no channel, even one admitted just before it was
    -- disabled (an ingest process caches tenants for a few seconds).
    JOIN tenants tn ON tn.id = $1 AND tn.enabled
    JOIN channels c ON c.tenant_id = $1 AND c.enabled AND (
        CASE WHEN i.channel_ids IS NOT NULL THEN c.id = ANY (i.channel_ids)
        ELSE c.recipient IS NOT DISTINCT FROM ev.recipient
             AND EXISTS (SELECT 1 FROM unnest(c.event_types) AS p
                         WHERE notifier_type_matches(p, ev.type))
        END)
        -- The channel's payload filter, addressed or not (notifier.filters: a strict jsonpath
        -- predicate that is true or false for any payload, never an error).
        AND (c.filter_path IS NULL OR ev.payload @@ c.filter_path)
),
-- FIFO channels (README "Ordered delivery (FIFO)"): each takes as many numbers from its counter
-- row as it has deliveries here, locking the row until this transaction ends, so one channel's
-- numbers commit in order. Rows are taken in channel order (no deadlock between batches); an
-- ordinary channel takes nothing and pays nothing.
fifo_taken AS (
    INSERT INTO fifo_counters AS f (channel_id, last_seq)
    SELECT channel_id, count(*) FROM targets WHERE fifo GROUP BY channel_id ORDER BY channel_id
    ON CONFLICT (channel_id) DO UPDATE SET last_seq = f.last_seq + excluded.last_seq
    RETURNING f.channel_id, f.last_seq
),
numbered AS (
    SELECT t.*, CASE WHEN t.fifo THEN
        ft.last_seq - count(*) OVER w + row_number() OVER (w ORDER BY t.ord, t.delivery_id)
    END AS fifo_seq
    FROM targets t LEFT JOIN fifo_taken ft ON ft.channel_id = t.channel_id
    WINDOW w AS (PARTITION BY t.channel_id)
),
dl AS (
    INSERT INTO deliveries AS d
        (id, event_id, channel_id, tenant_id, channel_type, max_attempts, created_at, fifo_seq)
    SELECT delivery_id, event_id, channel_id, $1, channel_type, max_attempts, created_at, fifo_seq
    FROM numbered
    RETURNING d.id, d.event_id, d AS delivery
),
ob AS (
    INSERT INTO outbox (delivery_id, routing_key, body, traceparent)
    SELECT t.delivery_id, t.channel_type || CASE WHEN t.fifo THEN '.fifo' ELSE '' END,
           notifier_worker_message(dl.delivery, ev.event, t.config, 1), ev.traceparent
    FROM targets t JOIN dl ON dl.id = t.delivery_id JOIN ev ON ev.id = t.event_id
)
-- Each event's deliveries (all PENDING) as three arrays in channel order, aggregated in one pass
-- over the targets (not one scan of them per event) and decoded by the driver as plain uuids and
-- text, with no JSON in between.
SELECT ev.id, ev.type, ev.recipient, ev.payload, ev.created_at,
       coalesce(g.delivery_ids, '{}') AS delivery_ids,
       coalesce(g.channel_ids, '{}') AS channel_ids,
       coalesce(g.channel_types, '{}') AS channel_types
FROM ev
LEFT JOIN (
    SELECT t.event_id,
           array_agg(t.delivery_id ORDER BY t.channel_id) AS delivery_ids,
           array_agg(t.channel_id ORDER BY t.channel_id) AS channel_ids,
           array_agg(t.channel_type ORDER BY t.channel_id) AS channel_types
    FROM targets t GROUP BY t.event_id
) g ON g.event_id = ev.id;

-- name: events_by_keys
-- Found through event_keys, and by (id, created_at): one partition each.
SELECT e.id, e.type, e.recipient, e.payload, e.idempotency_key, e.request_hash, e.created_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', d.id, 'channel_id', d.channel_id,
                     'channel_type', d.channel_type, 'status', d.status) ORDER BY d.channel_id)
                 FROM deliveries d WHERE d.event_id = e.id AND d.created_at = e.created_at),
                '[]'::jsonb) AS deliveries
FROM event_keys k
JOIN events e ON e.id = k.event_id AND e.created_at = k.created_at
WHERE k.tenant_id = $1 AND k.idempotency_key = ANY($2::text[]);

-- name: event_get
SELECT e.id, e.type, e.recipient, e.payload, e.idempotency_key, e.created_at,
       e.payload_expunged_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'id', d.id, 'channel_id', d.channel_id,
                     'channel_type', d.channel_type, 'status', d.status) ORDER BY d.channel_id)
                 FROM deliveries d WHERE d.event_id = e.id AND d.created_at = e.created_at),
                '[]'::jsonb) AS deliveries
FROM events e
WHERE e.tenant_id = $1 AND e.id = $2;

-- name: channels_owned
SELECT id FROM channels WHERE tenant_id = $1 AND id = ANY($2::uuid[]);

-- name: amqp_tenants_by_names
-- A disabled tenant is not found: its messages are refused (dead-lettered) like an unknown one's.
SELECT name, id FROM tenants WHERE name = ANY($1::text[]) AND enabled;

-- name: amqp_channels_owned
-- The channels among $1, with their tenants: a batch may span tenants.
SELECT tenant_id, id FROM channels WHERE id = ANY($1::uuid[]);

-- name: expunge_lock_event
-- Expunging payloads (store/expunge.py, the queries expunge_*): an event's payload becomes JSON
-- null and payload_expunged_at says since when; its deliveries' attempts lose their
-- response_excerpt; the event, its deliveries and their attempts stay. Never while a delivery
-- of the event is PENDING or RETRYING (its message carries the payload): an expunge locks the
-- events, then all their deliveries, and decides on what it then reads; a replay locks the
-- deliveries, so the two wait for each other, and a replay after an expunge finds the event
-- expunged (replay) and takes nothing.
-- This one: event $2 of tenant $1, locked for the expunge that follows.
SELECT e.id FROM events e
WHERE e.tenant_id = $1 AND e.id = $2
FOR NO KEY UPDATE OF e;

-- name: expunge_lock_events_before
-- Up to $5 of tenant $1's events created before $2 whose payload is still there, in
-- (created_at, id) order after ($3, $4) (the walk's cursor), locked for the expunge that
-- follows; an event locked by another transaction is waited for.
SELECT e.id, e.created_at FROM events e
WHERE e.tenant_id = $1 AND e.created_at < $2 AND e.payload_expunged_at IS NULL
  AND ($3::timestamptz IS NULL OR (e.created_at, e.id) > ($3, $4::uuid))
ORDER BY e.created_at, e.id
LIMIT $5
FOR NO KEY UPDATE OF e;

-- name: expunge_lock_deliveries
-- The deliveries of tenant $1's events $2, locked (a replay of one now waits for the expunge,
-- and then finds its event expunged), with their statuses as they are now.
SELECT d.event_id, d.status FROM deliveries d
WHERE d.tenant_id = $1 AND d.event_id = ANY($2::uuid[])
FOR NO KEY UPDATE OF d;

-- name: expunge_events
-- Expunge tenant $1's events $2 (locked, with their deliveries, and none of those unfinished):
-- the payload becomes JSON null and payload_expunged_at is set, once (an event expunged before
-- keeps its time and is not written again); the attempts of their deliveries lose their
-- response_excerpt; and their deliveries' outbox rows, which can do nothing for a finished
-- delivery and carry the payload, are deleted (a row a relay is publishing at this moment is
-- left to outbox_hygiene). Returns how many events were expunged now.
WITH ev AS (
    UPDATE events e SET payload = 'null'::jsonb, payload_expunged_at = now()
    WHERE e.tenant_id = $1 AND e.id = ANY($2::uuid[]) AND e.payload_expunged_at IS NULL
    RETURNING e.id
),
dl AS (
    SELECT d.id FROM deliveries d WHERE d.tenant_id = $1 AND d.event_id = ANY($2::uuid[])
),
excerpts AS (
    UPDATE delivery_attempts a SET response_excerpt = NULL
    FROM dl
    WHERE a.delivery_id = dl.id AND a.response_excerpt IS NOT NULL
),
queued AS (
    DELETE FROM outbox o
    WHERE o.id IN (SELECT q.id FROM outbox q JOIN dl ON q.delivery_id = dl.id
                   FOR UPDATE OF q SKIP LOCKED)
)
SELECT count(*) AS expunged FROM ev;

-- name: expunge_tenant_id
-- The tenant named $1, enabled or not (a disabled tenant's payloads can be expunged too).
SELECT id FROM tenants WHERE name = $1;
