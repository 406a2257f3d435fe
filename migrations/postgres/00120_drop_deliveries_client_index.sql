-- +goose Up
-- notifier_deliveries (client_id, state) served only the per-client statistics, an admin
-- read that notifier_deliveries_key (client_id, sensor_id, revision) serves too. Every
-- delivery changes its state, so the index cost a new entry per attempt, and the planner,
-- with a single client, took it for the per-key look-ups (newer revision, blocked rows):
-- a scan of all of the client's rows per key (seen in the soak's plans, where ingest and
-- supersede statements of a few rows took 12-18 ms).
DROP INDEX notifier_deliveries_client;

-- +goose Down
CREATE INDEX notifier_deliveries_client ON notifier_deliveries (client_id, state);
