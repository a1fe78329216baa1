-- Named queries of the circuit breakers shared by the fleet (store/circuits.py). Each block
-- starts with `-- name: NAME`. The rules are notifier/worker/circuit.py's (`failed`,
-- `succeeded`, `claim_probe`), on Postgres's clock; `probe_in_seconds` is next_probe_at less
-- now(), so no process reads another's clock.

-- name: circuit_failed
-- An unreachable failure of destination $2 of type $1 ($3: it was this process's probe). A failed
-- probe of a half-open circuit opens it again, the interval doubled up to $6; any other failure
-- counts, and opens a closed circuit at $4 in a row, the first probe $5 seconds later.
INSERT INTO circuits AS c (channel_type, destination, state, consecutive_failures, opened_at,
                           next_probe_at, probe_interval_seconds)
VALUES ($1, $2, CASE WHEN $4::integer <= 1 THEN 'open' ELSE 'closed' END, 1,
        CASE WHEN $4::integer <= 1 THEN now() END,
        CASE WHEN $4::integer <= 1 THEN now() + $5::float8 * interval '1 second' END,
        CASE WHEN $4::integer <= 1 THEN $5::float8 END)
ON CONFLICT (channel_type, destination) DO UPDATE SET
    consecutive_failures = c.consecutive_failures + 1,
    state = CASE WHEN $3::boolean AND c.state = 'half_open' THEN 'open'
                 WHEN c.state = 'closed' AND c.consecutive_failures + 1 >= $4 THEN 'open'
                 ELSE c.state END,
    opened_at = CASE WHEN c.state = 'closed' AND c.consecutive_failures + 1 >= $4 THEN now()
                     ELSE c.opened_at END,
    probe_interval_seconds =
        CASE WHEN $3 AND c.state = 'half_open'
             THEN least(coalesce(c.probe_interval_seconds, $5) * 2, $6::float8)
             WHEN c.state = 'closed' AND c.consecutive_failures + 1 >= $4 THEN $5
             ELSE c.probe_interval_seconds END,
    next_probe_at =
        CASE WHEN $3 AND c.state = 'half_open'
             THEN now() + least(coalesce(c.probe_interval_seconds, $5) * 2, $6) * interval '1 second'
             WHEN c.state = 'closed' AND c.consecutive_failures + 1 >= $4
             THEN now() + $5 * interval '1 second'
             ELSE c.next_probe_at END,
    changed_at = now()
RETURNING destination, state, consecutive_failures,
          extract(epoch FROM next_probe_at - now())::float8 AS probe_in_seconds;

-- name: circuit_succeeded
-- Destination $2 of type $1 answered: its circuit closes, its count starts again.
UPDATE circuits SET
    state = 'closed', consecutive_failures = 0, opened_at = NULL, next_probe_at = NULL,
    probe_interval_seconds = NULL, changed_at = now()
WHERE channel_type = $1 AND destination = $2 AND (state <> 'closed' OR consecutive_failures > 0);

-- name: circuit_claim_probe
-- Claim the probe of destination $2 of type $1 when one is due: half-open, the lease ending $3
-- seconds from now (a probe whose process died is claimed again after it). Of processes asking
-- at once exactly one gets it (the others wait for its row lock, then find it not due). Returns
-- whether it was claimed and the circuit (as it was before a concurrent claim, for the others).
WITH claimed AS (
    UPDATE circuits SET state = 'half_open', next_probe_at = now() + $3::float8 * interval '1 second',
                        changed_at = now()
    WHERE channel_type = $1 AND destination = $2 AND state <> 'closed' AND next_probe_at <= now()
    RETURNING destination, state, consecutive_failures, next_probe_at
)
SELECT true AS claimed, destination, state, consecutive_failures,
       extract(epoch FROM next_probe_at - now())::float8 AS probe_in_seconds
FROM claimed
UNION ALL
SELECT false, destination, state, consecutive_failures,
       extract(epoch FROM next_probe_at - now())::float8
FROM circuits
WHERE channel_type = $1 AND destination = $2 AND NOT EXISTS (SELECT 1 FROM claimed);

-- name: circuits_troubled
-- The circuits of type $1 a worker group keeps in memory: not closed, or counting failures. One
-- scan of circuits_troubled_idx, which holds only those.
SELECT destination, state, consecutive_failures,
       extract(epoch FROM next_probe_at - now())::float8 AS probe_in_seconds
FROM circuits
WHERE channel_type = $1 AND (state <> 'closed' OR consecutive_failures > 0)
LIMIT 10000;

-- name: circuits_of
-- The circuits of the (type, destination) pairs $1, $2 (the API's channel health).
SELECT c.channel_type, c.destination, c.state, c.consecutive_failures, c.opened_at,
       c.next_probe_at
FROM circuits c
JOIN unnest($1::text[], $2::text[]) AS k(channel_type, destination)
    ON k.channel_type = c.channel_type AND k.destination = c.destination;

-- name: circuits_cleanup
-- Circuits closed and unchanged for an hour (a missing row is a closed circuit): deleted, at
-- most $1 per call; rows being written are locked, and skipped.
DELETE FROM circuits
WHERE (channel_type, destination) IN (
    SELECT channel_type, destination FROM circuits
    WHERE state = 'closed' AND changed_at < now() - interval '1 hour'
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING destination;
