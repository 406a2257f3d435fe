-- +goose Up
-- The operator's list of every client's dead deliveries, newest first (ListAllDead): one
-- backward scan of this partial index per partition, merged, whatever the number of clients.
CREATE INDEX notifier_deliveries_dead_id ON notifier_deliveries (id) WHERE state = 'dead';

-- +goose Down
DROP INDEX notifier_deliveries_dead_id;
