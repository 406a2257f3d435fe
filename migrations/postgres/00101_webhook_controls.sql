-- +goose Up
-- Event type filters: a client and each of its subscriptions may name the webhook types they
-- receive ('sensor.state_changed', …); empty means every type. Applied when the notifier
-- decides whom an event is delivered to.
ALTER TABLE clients ADD COLUMN event_types text[] NOT NULL DEFAULT '{}';
ALTER TABLE subscriptions ADD COLUMN event_types text[] NOT NULL DEFAULT '{}';

-- Per-client statistics read from the delivery table: the failed attempts of each delivery
-- (attempts alone cannot tell them apart after a resend of a delivered one) and the latency
-- of its last attempt (the successful one, for a delivered row).
ALTER TABLE notifier_deliveries
    ADD COLUMN failed_attempts int NOT NULL DEFAULT 0,
    ADD COLUMN last_latency_ms int;
CREATE INDEX notifier_deliveries_client ON notifier_deliveries (client_id, state);

-- Since when each endpoint (client) has failed without a single 2xx in between: the
-- notifier disables a client whose failing_since is older than LOCKS_ENDPOINT_DISABLE_AFTER.
-- Kept apart from clients so that attempts do not change a client's etag.
CREATE TABLE notifier_endpoint_health (
    client_id       text PRIMARY KEY,
    failing_since   timestamptz,
    last_success_at timestamptz
);

-- +goose Down
DROP TABLE notifier_endpoint_health;
DROP INDEX notifier_deliveries_client;
ALTER TABLE notifier_deliveries DROP COLUMN last_latency_ms, DROP COLUMN failed_attempts;
ALTER TABLE subscriptions DROP COLUMN event_types;
ALTER TABLE clients DROP COLUMN event_types;
