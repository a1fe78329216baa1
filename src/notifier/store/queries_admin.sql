-- Named queries of tenants and the scrape-time gauges (store/admin.py). Each block starts
-- with `-- name: NAME`; the SQL functions they call (notifier_*) are in schema.sql.

-- name: tenant_create
INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, $3)
RETURNING id, name;

-- name: tenant_by_key_hash
-- A disabled tenant's key finds nothing: the API answers 401.
SELECT id FROM tenants WHERE api_key_hash = $1 AND enabled;

-- name: tenant_list
SELECT id, name, created_at, enabled FROM tenants ORDER BY name;

-- name: tenant_rotate_key
UPDATE tenants SET api_key_hash = $2 WHERE name = $1 RETURNING id;

-- name: tenant_set_enabled
UPDATE tenants SET enabled = $2 WHERE name = $1 RETURNING id;

-- name: metrics_snapshot
-- The scrape-time gauges in one statement: the outbox depth, and the open deliveries (counts by
-- status, and the age of the least recently changed one) from one scan of the partial index
-- deliveries_open_idx, which holds only open deliveries. The age is computed by Postgres, so
-- the clocks of other hosts do not enter it. And the destinations' circuits that are not closed
-- or changed in the last 10 minutes (so a closing shows as a 0), at most 500, the open first:
-- the series stay few. And the history's days: how many ended more than $1 days ago (the
-- retention; 0: off) and are still there, and how far ahead of now the partitions reach.
-- And the channels notifier disabled (a reason other than a PATCH's), by type: a scan of
-- channels, a small table next to the deliveries. And the FIFO channels furthest behind (README
-- "Ordered delivery (FIFO)"): per channel, its unfinished deliveries and the age of the oldest
-- (since its event was accepted), the 50 oldest lines only, from deliveries_fifo_idx.
SELECT
    (SELECT count(*) FROM outbox) AS outbox_depth,
    h.days_overdue,
    h.ahead_seconds,
    d.pending,
    d.retrying,
    d.oldest_open_age_seconds,
    c.circuit_types,
    c.circuit_destinations,
    c.circuit_states,
    x.disabled_types,
    x.disabled_counts,
    f.fifo_types,
    f.fifo_channels,
    f.fifo_backlogs,
    f.fifo_ages
FROM (
    SELECT count(*) FILTER (WHERE status = 'PENDING') AS pending,
           count(*) FILTER (WHERE status = 'RETRYING') AS retrying,
           extract(epoch FROM now() - min(updated_at))::float8 AS oldest_open_age_seconds
    FROM deliveries
    WHERE status IN ('PENDING', 'RETRYING')
) AS d, (
    SELECT count(*) FILTER (WHERE $1::integer > 0
                            AND to_time <= now() - $1::integer * interval '1 day') AS days_overdue,
           coalesce(extract(epoch FROM max(to_time) - now())::float8, 0) AS ahead_seconds
    FROM notifier_history_partitions()
) AS h, (
    SELECT coalesce(array_agg(channel_type), '{}') AS circuit_types,
           coalesce(array_agg(destination), '{}') AS circuit_destinations,
           coalesce(array_agg(state), '{}') AS circuit_states
    FROM (
        SELECT channel_type, destination, state FROM circuits
        WHERE state <> 'closed' OR changed_at > now() - interval '10 minutes'
        ORDER BY state = 'closed', changed_at DESC
        LIMIT 500
    ) AS recent
) AS c, (
    SELECT coalesce(array_agg(type ORDER BY type), '{}') AS disabled_types,
           coalesce(array_agg(n ORDER BY type), '{}') AS disabled_counts
    FROM (
        SELECT type, count(*) AS n FROM channels
        WHERE NOT enabled AND disabled_reason <> 'disabled through the API'
        GROUP BY type
    ) AS auto_disabled
) AS x, (
    SELECT coalesce(array_agg(channel_type ORDER BY age DESC), '{}') AS fifo_types,
           coalesce(array_agg(channel_id ORDER BY age DESC), '{}') AS fifo_channels,
           coalesce(array_agg(backlog ORDER BY age DESC), '{}') AS fifo_backlogs,
           coalesce(array_agg(age ORDER BY age DESC), '{}') AS fifo_ages
    FROM (
        SELECT channel_type, channel_id, count(*) AS backlog,
               extract(epoch FROM now() - min(created_at))::float8 AS age
        FROM deliveries
        WHERE fifo_seq IS NOT NULL AND status IN ('PENDING', 'RETRYING')
        GROUP BY channel_type, channel_id
        ORDER BY age DESC
        LIMIT 50
    ) AS lines
) AS f;
