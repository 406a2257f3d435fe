-- +goose Up
-- A checkpoint is a position in one READINGS stream: after the NATS store is lost or
-- replaced, the new stream starts again at sequence 1, and a bare sequence would make the
-- projector skip every new reading at or below it. stream names the stream the position
-- belongs to (its creation time, which JetStream keeps across restarts and restores); it is
-- written in the same transaction as seq. NULL: written before this column existed.
ALTER TABLE checkpoints ADD COLUMN stream text;

-- +goose Down
ALTER TABLE checkpoints DROP COLUMN stream;
