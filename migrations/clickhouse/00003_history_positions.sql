-- +goose NO TRANSACTION
-- +goose Up
-- Where the history projector resumes each of its consumers, which JetStream keeps in memory
-- only: `source` names the consumer (history_readings_<p>, history_events_<p>,
-- history_deliveries), `stream` the stream's identity (its creation time), `seq` the last
-- stream sequence whose message is written. Written after the rows of each batch, so it is
-- never ahead of them; the newest row of a source wins.
CREATE TABLE IF NOT EXISTS history_positions (
    source  String,
    stream  String,
    seq     UInt64,
    written UInt64
) ENGINE = ReplacingMergeTree(written)
ORDER BY source;

-- +goose Down
DROP TABLE IF EXISTS history_positions;
