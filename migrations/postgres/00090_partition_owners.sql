-- +goose Up
-- The fence of partition ownership (internal/lease): each claim of a partition by a process
-- bumps epoch, and every transaction that commits for the partition (a projector's batch with
-- its checkpoint) locks this row and rolls back unless its epoch is still the current one, so a
-- process that lost the partition (paused past its lease) writes nothing more for it.
CREATE TABLE partition_owners (
    projection text        NOT NULL,
    partition  integer     NOT NULL,
    owner      text        NOT NULL,
    epoch      bigint      NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, partition)
);

-- +goose Down
DROP TABLE partition_owners;
