-- +goose Up
-- An endpoint (a client's webhook_url) that failed continuously for LOCKS_ENDPOINT_DISABLE_AFTER
-- is disabled by the notifier, which sets disabled_at and says why; an operator's re-enable
-- (the admin API) clears both. The alerter fires endpoint_disabled while disabled_at is set.
ALTER TABLE clients
    ADD COLUMN disabled_at     timestamptz,
    ADD COLUMN disabled_reason text;
CREATE INDEX clients_disabled ON clients (disabled_at) WHERE disabled_at IS NOT NULL;

-- +goose Down
DROP INDEX clients_disabled;
ALTER TABLE clients DROP COLUMN disabled_reason, DROP COLUMN disabled_at;
