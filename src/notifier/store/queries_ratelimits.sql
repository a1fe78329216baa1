-- Named queries of the shared rate-limit buckets (store/ratelimits.py). Each block starts with
-- `-- name: NAME`; the SQL functions they call (notifier_rate_*) are in schema.sql.

-- name: rate_take
-- One token of each window bucket $1 ($2 tokens, each back $3 seconds after it was spent), all or
-- none: 0 when taken, else the seconds to wait.
SELECT notifier_rate_take($1::text[], $2::integer[], $3::float8[]);

-- name: rate_admit
-- $2 tokens of the refilling bucket $1 ($3 tokens, $4 back per second): 0 when taken, else the
-- seconds to wait.
SELECT notifier_rate_admit($1::text, $3::integer, $4::float8, $2::integer);

-- name: rate_buckets_cleanup
-- Buckets full again for a minute (a new one is the same): deleted, at most $1 per call. Buckets
-- being taken from are locked, and skipped.
DELETE FROM rate_buckets
WHERE key IN (
    SELECT key FROM rate_buckets
    WHERE full_at < now() - interval '1 minute'
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING key;
