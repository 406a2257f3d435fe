-- +goose Up
-- The state projector rewrites a sensor's row on every reading (last_seen moves) while data
-- and connection, the indexed columns, rarely change: free room in each page lets Postgres
-- make those updates HOT (no index writes), which is most of the projector's write cost.
ALTER TABLE sensor_state SET (fillfactor = 70);
-- The outbox is a queue: rows live for milliseconds; vacuum it eagerly so the relay's
-- ordered scan does not wade through dead rows.
ALTER TABLE outbox SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- +goose Down
ALTER TABLE outbox RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE sensor_state RESET (fillfactor);
