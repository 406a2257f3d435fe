-- +goose NO TRANSACTION
-- +goose Up
-- Sensor clocks are wrong (1970 after a battery change, years ahead), so readings and events
-- are partitioned and ordered by the time the system received them, never by the sensor's
-- ts: one sensor sending ts in 101 months made every INSERT of its batch touch 101 partitions,
-- which current ClickHouse refuses ("Too many partitions for single INSERT block"), and the
-- history projector retried that batch for ever, stopping every sensor's history. `time` keeps
-- the sensor's ts (what the API filters on, docs/contract.md section 3).
--
-- Events gain `received`: when the event was stored in EVENTS (server time). Rows copied from
-- the old table take their occurred_at, the only time they have (DEFAULT).
--
-- 18.16 cannot ALTER a partition key, so each table is created anew, swapped in with RENAME
-- and refilled from the old one, which is then dropped. Swapping before copying means a history
-- projector still running meanwhile writes into the new table and nothing it writes is lost.
-- Every statement succeeds whatever state a cut run left (the runner re-runs the whole file):
-- the first three of each table finish a refill a cut run left behind, the rest redo the swap.
-- Duplicates this may make collapse (ReplacingMergeTree, and every query collapses them).
-- One loss is left: events that a history projector wrote between a cut run and its re-run
-- get their occurred_at as `received` (18.16 has no ADD COLUMN IF NOT EXISTS to name the
-- column in a copy from a table that may lack it); `locks replay --projection=history` restores it.

CREATE TABLE IF NOT EXISTS readings_by_ts AS readings;
INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)
    SELECT sensor_id, seq, data, time, time_ms, received, received_ms, message_id FROM readings_by_ts;
DROP TABLE readings_by_ts;
DROP TABLE IF EXISTS readings_by_received;
CREATE TABLE readings_by_received (
    sensor_id   String,
    seq         UInt64,
    data        UInt8,
    time        DateTime,
    time_ms     UInt16,
    received    DateTime,
    received_ms UInt16,
    message_id  String
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(received)
ORDER BY (sensor_id, received, received_ms, seq);
RENAME TABLE readings TO readings_by_ts, readings_by_received TO readings;
INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)
    SELECT sensor_id, seq, data, time, time_ms, received, received_ms, message_id FROM readings_by_ts;
DROP TABLE readings_by_ts;

CREATE TABLE IF NOT EXISTS events_by_ts AS events;
INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq)
    SELECT event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq FROM events_by_ts;
DROP TABLE events_by_ts;
DROP TABLE IF EXISTS events_by_received;
CREATE TABLE events_by_received (
    event_id      String,
    sensor_id     String,
    type          String,
    revision      UInt64,
    data          UInt8,
    previous_data Nullable(UInt8),
    time          DateTime,
    time_ms       UInt16,
    seq           UInt64,
    received      DateTime DEFAULT time,
    received_ms   UInt16 DEFAULT time_ms
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(received)
ORDER BY (sensor_id, received, received_ms, revision, event_id);
RENAME TABLE events TO events_by_ts, events_by_received TO events;
INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq)
    SELECT event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq FROM events_by_ts;
DROP TABLE events_by_ts;

-- +goose Down
-- Not reversible in place: going back would partition by the sensors' clocks again.
