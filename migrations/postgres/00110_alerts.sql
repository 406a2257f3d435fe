-- +goose Up
-- Alerts to the administrator (alerter/). A row per firing of a (kind, subject): at most one
-- unresolved row per pair, so an alert fires once until it is resolved.
CREATE TABLE alerts (
    id          bigserial PRIMARY KEY,
    kind        text        NOT NULL,
    subject     text        NOT NULL,
    summary     text        NOT NULL,
    details     jsonb       NOT NULL DEFAULT '{}',
    -- The highest source position this firing covers (set_aside: the SET_ASIDE sequence),
    -- so that a record is alerted once even after its alert resolved.
    watermark   bigint      NOT NULL DEFAULT 0,
    fired_at    timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz
);
CREATE UNIQUE INDEX alerts_firing ON alerts (kind, subject) WHERE resolved_at IS NULL;
CREATE INDEX alerts_by_kind_subject ON alerts (kind, subject, id);

-- The notices' durable outbox: one row per (alert, firing or resolved, channel), written in
-- the transaction of the transition and marked sent only once the channel accepted it.
CREATE TABLE alert_notices (
    id              bigserial PRIMARY KEY,
    alert_id        bigint      NOT NULL REFERENCES alerts (id) ON DELETE CASCADE,
    event           text        NOT NULL CHECK (event IN ('firing', 'resolved')),
    channel         text        NOT NULL CHECK (channel IN ('email', 'webhook')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        int         NOT NULL DEFAULT 0,
    last_error      text,
    sent_at         timestamptz,
    UNIQUE (alert_id, event, channel)
);
CREATE INDEX alert_notices_unsent ON alert_notices (channel, id) WHERE sent_at IS NULL;
CREATE INDEX alert_notices_sent ON alert_notices (channel, sent_at) WHERE sent_at IS NOT NULL;

-- The watchdog's last reconciliation sweep per partition, read by the alerter
-- (reconciliation_drift): repairs is what that sweep had to correct.
CREATE TABLE watchdog_sweeps (
    partition int         PRIMARY KEY,
    swept_at  timestamptz NOT NULL,
    repairs   int         NOT NULL
);

-- +goose Down
DROP TABLE watchdog_sweeps;
DROP TABLE alert_notices;
DROP TABLE alerts;
