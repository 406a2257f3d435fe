-- +goose Up
-- The notifier's durable delivery table: one row per (event, client), created when the
-- EVENTS message is consumed and acknowledged only after this row is committed. It is the
-- durable timer (next_at), the lease for several notifier processes (lease_until, claimed
-- with FOR UPDATE SKIP LOCKED), the supersede/order ledger per (client, sensor), and the
-- dead-letter list. No foreign key to clients: a deleted client's rows are kept and
-- recorded as cancelled.
CREATE TABLE notifier_deliveries (
    id           bigserial PRIMARY KEY,
    event_id     text        NOT NULL,
    client_id    text        NOT NULL,
    sensor_id    text        NOT NULL,
    revision     bigint      NOT NULL,
    -- The EVENTS message (event.Event JSON); the webhook body is built from it at each attempt.
    payload      bytea       NOT NULL,
    state        text        NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'delivered', 'dead', 'cancelled', 'superseded')),
    -- Attempts made so far (attempt numbers in the record keep counting across redrives).
    attempts     int         NOT NULL DEFAULT 0,
    -- attempts at the last redrive: the schedule restarts from there.
    attempt_base int         NOT NULL DEFAULT 0,
    next_at      timestamptz NOT NULL DEFAULT now(),
    lease_until  timestamptz,
    lease_token  bigint,
    -- A newer revision arrived while this row's attempt was in flight: when the attempt
    -- ends, the row is superseded instead of retried. Written by the same UPDATE-row lock
    -- as the attempt's outcome, so neither can miss the other.
    supersede_on_finish boolean NOT NULL DEFAULT false,
    last_status  int,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, client_id)
);
CREATE INDEX notifier_deliveries_due ON notifier_deliveries (next_at, id) WHERE state = 'pending';
CREATE INDEX notifier_deliveries_key ON notifier_deliveries (client_id, sensor_id, revision);
CREATE INDEX notifier_deliveries_dead ON notifier_deliveries (client_id, updated_at) WHERE state = 'dead';
CREATE INDEX notifier_deliveries_done ON notifier_deliveries (updated_at) WHERE state IN ('delivered', 'cancelled', 'superseded');

-- Attempt records written in the same transaction as the attempt's outcome and relayed to
-- DELIVERIES (Nats-Msg-Id = msg_id), then deleted: a crash neither loses nor doubles one.
CREATE TABLE notifier_attempt_outbox (
    id         bigserial PRIMARY KEY,
    client_id  text  NOT NULL,
    msg_id     text  NOT NULL,
    payload    bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE notifier_attempt_outbox;
DROP TABLE notifier_deliveries;
