-- +goose Up
-- Registry: clients, sensors and subscriptions, written by the admin API.
CREATE TABLE clients (
    id               text PRIMARY KEY,
    name             text NOT NULL,
    webhook_url      text NOT NULL,
    signing_secret   text NOT NULL,
    -- During a rotation the previous secret still signs until previous_secret_until.
    previous_secret  text,
    previous_secret_until timestamptz,
    version          bigint NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sensors (
    id          text PRIMARY KEY,
    address     text NOT NULL,
    -- NULL means LOCKS_LOST_AFTER.
    lost_after_ms bigint CHECK (lost_after_ms IS NULL OR lost_after_ms > 0),
    version     bigint NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE subscriptions (
    client_id  text NOT NULL REFERENCES clients (id) ON DELETE CASCADE,
    sensor_id  text NOT NULL REFERENCES sensors (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client_id, sensor_id)
);
CREATE INDEX subscriptions_by_sensor ON subscriptions (sensor_id, client_id);

-- Projection bookkeeping: the last READINGS (or other) stream sequence applied per
-- (projection, partition), advanced in the same transaction as the projection's writes.
CREATE TABLE checkpoints (
    projection text   NOT NULL,
    partition  int    NOT NULL,
    seq        bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, partition)
);

-- Current state of every sensor ever heard from, registered or not.
CREATE TABLE sensor_state (
    sensor_id       text PRIMARY KEY,
    partition       int         NOT NULL,
    data            smallint    NOT NULL CHECK (data IN (0, 1)),
    -- Server receive time of the last reading: liveness is decided by server time.
    last_seen       timestamptz NOT NULL,
    -- The sensor's own time of the last reading (ts, or receive time when absent).
    last_reading_time timestamptz NOT NULL,
    changed_at      timestamptz NOT NULL,
    revision        bigint      NOT NULL,
    connection      text        NOT NULL DEFAULT 'online' CHECK (connection IN ('online', 'lost')),
    last_seq        bigint      NOT NULL
);
CREATE INDEX sensor_state_connection ON sensor_state (connection, sensor_id);
CREATE INDEX sensor_state_data ON sensor_state (data, sensor_id);

-- Events derived in a projector transaction, relayed to EVENTS and deleted after the ack.
CREATE TABLE outbox (
    id         bigserial PRIMARY KEY,
    event_id   text   NOT NULL UNIQUE,
    partition  int    NOT NULL,
    sensor_id  text   NOT NULL,
    revision   bigint NOT NULL,
    payload    bytea  NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_by_partition ON outbox (partition, id);

-- +goose Down
DROP TABLE outbox;
DROP TABLE sensor_state;
DROP TABLE checkpoints;
DROP TABLE subscriptions;
DROP TABLE sensors;
DROP TABLE clients;
