-- +goose Up
-- Where the notifier resumes reading EVENTS, per partition: the last EVENTS sequence it took
-- in, written in the intake transaction with the delivery rows (coalesced when a run of
-- messages made no transaction), and the stream that sequence belongs to (its creation time,
-- natsx.StreamIdentity). The partition's consumer keeps its own state in memory only.
CREATE TABLE notifier_positions (
    partition  int         PRIMARY KEY,
    seq        bigint      NOT NULL,
    stream     text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE notifier_positions;
