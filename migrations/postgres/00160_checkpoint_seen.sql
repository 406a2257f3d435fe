-- +goose Up
-- The state projector writes a sensor's row when its state, connection or revision changes,
-- and its liveness (last_seen, last_reading_time, last_seq) at most every
-- LOCKS_STATE_SEEN_INTERVAL. seen_seq is the READINGS sequence up to which every reading's
-- liveness is in sensor_state, written in the same transaction as seq: a process that
-- takes the partition over (or restarts) reads the readings after it, up to seq, from
-- READINGS again and writes the liveness they carry. NULL: the same as seq (nothing
-- deferred); adding a nullable column rewrites no row.
ALTER TABLE checkpoints ADD COLUMN seen_seq bigint;

-- +goose Down
ALTER TABLE checkpoints DROP COLUMN seen_seq;
