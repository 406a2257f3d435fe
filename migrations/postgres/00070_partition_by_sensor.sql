-- +goose Up
-- sensor_state and notifier_deliveries, the tables written per reading and per delivery, are
-- partitioned by hash(sensor_id) into 16, so that vacuum, index size and, later, a move of
-- partitions to other tablespaces or nodes scale by sensor. Each table is made anew beside
-- the old one, filled from it and swapped in, in this migration's one transaction.
-- A partitioned table's keys must hold sensor_id: sensor_state's already is sensor_id;
-- notifier_deliveries' become (id, sensor_id) and (event_id, client_id, sensor_id), which
-- change nothing, since id is a sequence and event_id is derived from (sensor, revision).
-- Storage options live on the partitions (a partitioned table has no storage of its own).

ALTER TABLE sensor_state RENAME TO sensor_state_unpartitioned;
ALTER INDEX sensor_state_pkey RENAME TO sensor_state_unpartitioned_pkey;
ALTER INDEX sensor_state_connection RENAME TO sensor_state_unpartitioned_connection;
ALTER INDEX sensor_state_data RENAME TO sensor_state_unpartitioned_data;
CREATE TABLE sensor_state (
    LIKE sensor_state_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (sensor_id)
) PARTITION BY HASH (sensor_id);
CREATE INDEX sensor_state_connection ON sensor_state (connection, sensor_id);
CREATE INDEX sensor_state_data ON sensor_state (data, sensor_id);

ALTER TABLE notifier_deliveries RENAME TO notifier_deliveries_unpartitioned;
ALTER INDEX notifier_deliveries_pkey RENAME TO notifier_deliveries_unpartitioned_pkey;
ALTER INDEX notifier_deliveries_event_id_client_id_key RENAME TO notifier_deliveries_unpartitioned_event_id_client_id_key;
ALTER INDEX notifier_deliveries_due RENAME TO notifier_deliveries_unpartitioned_due;
ALTER INDEX notifier_deliveries_key RENAME TO notifier_deliveries_unpartitioned_key;
ALTER INDEX notifier_deliveries_dead RENAME TO notifier_deliveries_unpartitioned_dead;
ALTER INDEX notifier_deliveries_done RENAME TO notifier_deliveries_unpartitioned_done;
ALTER INDEX notifier_deliveries_pending_key RENAME TO notifier_deliveries_unpartitioned_pending_key;
CREATE TABLE notifier_deliveries (
    LIKE notifier_deliveries_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (id, sensor_id),
    UNIQUE (event_id, client_id, sensor_id)
) PARTITION BY HASH (sensor_id);
-- The id sequence outlives the old table, which owns it.
ALTER SEQUENCE notifier_deliveries_id_seq OWNED BY notifier_deliveries.id;
CREATE INDEX notifier_deliveries_due ON notifier_deliveries (next_at, id) WHERE state = 'pending';
CREATE INDEX notifier_deliveries_key ON notifier_deliveries (client_id, sensor_id, revision);
CREATE INDEX notifier_deliveries_dead ON notifier_deliveries (client_id, updated_at) WHERE state = 'dead';
CREATE INDEX notifier_deliveries_done ON notifier_deliveries (updated_at) WHERE state IN ('delivered', 'cancelled', 'superseded');
CREATE INDEX notifier_deliveries_pending_key ON notifier_deliveries (client_id, sensor_id, revision) WHERE state = 'pending';

-- +goose StatementBegin
DO $$
BEGIN
    FOR r IN 0..15 LOOP
        EXECUTE format('CREATE TABLE sensor_state_p%s PARTITION OF sensor_state
            FOR VALUES WITH (MODULUS 16, REMAINDER %s) WITH (fillfactor = 70)', lpad(r::text, 2, '0'), r);
        EXECUTE format('CREATE TABLE notifier_deliveries_p%s PARTITION OF notifier_deliveries
            FOR VALUES WITH (MODULUS 16, REMAINDER %s)
            WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02)', lpad(r::text, 2, '0'), r);
    END LOOP;
END
$$;
-- +goose StatementEnd

INSERT INTO sensor_state SELECT * FROM sensor_state_unpartitioned;
INSERT INTO notifier_deliveries SELECT * FROM notifier_deliveries_unpartitioned;
DROP TABLE sensor_state_unpartitioned;
DROP TABLE notifier_deliveries_unpartitioned;

-- +goose Down
ALTER TABLE sensor_state RENAME TO sensor_state_partitioned;
ALTER INDEX sensor_state_pkey RENAME TO sensor_state_partitioned_pkey;
ALTER INDEX sensor_state_connection RENAME TO sensor_state_partitioned_connection;
ALTER INDEX sensor_state_data RENAME TO sensor_state_partitioned_data;
CREATE TABLE sensor_state (
    LIKE sensor_state_partitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (sensor_id)
) WITH (fillfactor = 70);
CREATE INDEX sensor_state_connection ON sensor_state (connection, sensor_id);
CREATE INDEX sensor_state_data ON sensor_state (data, sensor_id);
INSERT INTO sensor_state SELECT * FROM sensor_state_partitioned;
DROP TABLE sensor_state_partitioned;

ALTER TABLE notifier_deliveries RENAME TO notifier_deliveries_partitioned;
ALTER INDEX notifier_deliveries_pkey RENAME TO notifier_deliveries_partitioned_pkey;
ALTER INDEX notifier_deliveries_event_id_client_id_sensor_id_key RENAME TO notifier_deliveries_partitioned_key3;
ALTER INDEX notifier_deliveries_due RENAME TO notifier_deliveries_partitioned_due;
ALTER INDEX notifier_deliveries_key RENAME TO notifier_deliveries_partitioned_key;
ALTER INDEX notifier_deliveries_dead RENAME TO notifier_deliveries_partitioned_dead;
ALTER INDEX notifier_deliveries_done RENAME TO notifier_deliveries_partitioned_done;
ALTER INDEX notifier_deliveries_pending_key RENAME TO notifier_deliveries_partitioned_pending_key;
CREATE TABLE notifier_deliveries (
    LIKE notifier_deliveries_partitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (id),
    UNIQUE (event_id, client_id)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
ALTER SEQUENCE notifier_deliveries_id_seq OWNED BY notifier_deliveries.id;
CREATE INDEX notifier_deliveries_due ON notifier_deliveries (next_at, id) WHERE state = 'pending';
CREATE INDEX notifier_deliveries_key ON notifier_deliveries (client_id, sensor_id, revision);
CREATE INDEX notifier_deliveries_dead ON notifier_deliveries (client_id, updated_at) WHERE state = 'dead';
CREATE INDEX notifier_deliveries_done ON notifier_deliveries (updated_at) WHERE state IN ('delivered', 'cancelled', 'superseded');
CREATE INDEX notifier_deliveries_pending_key ON notifier_deliveries (client_id, sensor_id, revision) WHERE state = 'pending';
INSERT INTO notifier_deliveries SELECT * FROM notifier_deliveries_partitioned;
DROP TABLE notifier_deliveries_partitioned;
