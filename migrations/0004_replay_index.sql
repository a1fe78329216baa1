-- 0004: an index of the replays, read by the worker with every message.
-- A delivery's latest replay, which the worker reads with every message (delivery_states):
-- the replays alone, so a delivery never replayed costs one empty probe.
CREATE INDEX IF NOT EXISTS delivery_attempts_replays_idx ON delivery_attempts (delivery_id, attempt)
    WHERE outcome = 'replayed' AND error IS NULL;
