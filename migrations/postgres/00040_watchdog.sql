-- +goose Up
-- The watchdog reloads the per-sensor lost_after overrides every few seconds; few sensors
-- have one, so a partial index keeps that read small on a large registry.
CREATE INDEX sensors_lost_after_override ON sensors (id, lost_after_ms) WHERE lost_after_ms IS NOT NULL;

-- +goose Down
DROP INDEX sensors_lost_after_override;
