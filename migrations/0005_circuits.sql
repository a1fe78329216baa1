-- 0005: the circuit breaker of each destination, shared by the fleet, and the 'deferred'
-- outcome of a delivery it held back.
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
CREATE INDEX IF NOT EXISTS circuits_troubled_idx ON circuits (channel_type)
    WHERE state <> 'closed' OR consecutive_failures > 0;

-- Widened in place: added NOT VALID (no scan under the new check's lock), then validated
-- (every existing outcome is in the new list).
ALTER TABLE delivery_attempts DROP CONSTRAINT IF EXISTS delivery_attempts_outcome_check;
ALTER TABLE delivery_attempts ADD CONSTRAINT delivery_attempts_outcome_check
    CHECK (outcome IN ('delivered', 'retry', 'rate_limited', 'dead', 'panic', 'replayed',
                       'deferred'))
    NOT VALID;
ALTER TABLE delivery_attempts VALIDATE CONSTRAINT delivery_attempts_outcome_check;
