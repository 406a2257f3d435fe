-- +goose NO TRANSACTION
-- +goose Up
-- Readings history. ReplacingMergeTree keyed by the READINGS stream sequence: a redelivered
-- or replayed batch collapses into one row; queries use FINAL or GROUP BY seq.
-- Times are DateTime (seconds) plus a UInt16 of milliseconds: ClickHouse 18.16 has no DateTime64.
CREATE TABLE IF NOT EXISTS readings (
    sensor_id   String,
    seq         UInt64,
    data        UInt8,
    time        DateTime,
    time_ms     UInt16,
    received    DateTime,
    received_ms UInt16,
    message_id  String
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (sensor_id, time, time_ms, seq);

CREATE TABLE IF NOT EXISTS events (
    event_id      String,
    sensor_id     String,
    type          String,
    revision      UInt64,
    data          UInt8,
    previous_data Nullable(UInt8),
    time          DateTime,
    time_ms       UInt16,
    seq           UInt64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (sensor_id, time, time_ms, event_id);

CREATE TABLE IF NOT EXISTS deliveries (
    event_id    String,
    client_id   String,
    sensor_id   String,
    attempt     UInt16,
    time        DateTime,
    time_ms     UInt16,
    status_code UInt16,
    latency_ms  UInt32,
    error       String,
    outcome     String
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (client_id, time, time_ms, event_id, attempt);

-- +goose Down
DROP TABLE IF EXISTS deliveries;
DROP TABLE IF EXISTS events;
DROP TABLE IF EXISTS readings;
