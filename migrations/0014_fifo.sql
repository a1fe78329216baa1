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
ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS fifo_seq bigint NULL;
-- A FIFO channel's unfinished deliveries in order: the worker's head of the line, /metrics' lag.
CREATE INDEX IF NOT EXISTS deliveries_fifo_idx ON deliveries (channel_id, fifo_seq)
    WHERE fifo_seq IS NOT NULL AND status IN ('PENDING', 'RETRYING');
