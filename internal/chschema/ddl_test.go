package chschema

import (
	"slices"
	"testing"
)

func TestCreateRendersBothLayouts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		layout Layout
		want   []string
	}{
		{"one node", Layout{Database: "locks"}, []string{
			"CREATE TABLE IF NOT EXISTS readings (sensor_id String, seq UInt64, data UInt8, time DateTime, time_ms UInt16, received DateTime, received_ms UInt16, message_id String) ENGINE = ReplacingMergeTree() PARTITION BY toYYYYMM(received) ORDER BY (sensor_id, received, received_ms, seq)",
			"CREATE TABLE IF NOT EXISTS events (event_id String, sensor_id String, type String, revision UInt64, data UInt8, previous_data Nullable(UInt8), time DateTime, time_ms UInt16, seq UInt64, received DateTime DEFAULT time, received_ms UInt16 DEFAULT time_ms) ENGINE = ReplacingMergeTree() PARTITION BY toYYYYMM(received) ORDER BY (sensor_id, received, received_ms, revision, event_id)",
			"CREATE TABLE IF NOT EXISTS deliveries (event_id String, client_id String, sensor_id String, attempt UInt16, time DateTime, time_ms UInt16, status_code UInt16, latency_ms UInt32, error String, outcome String) ENGINE = ReplacingMergeTree() PARTITION BY toYYYYMM(time) ORDER BY (client_id, time, time_ms, event_id, attempt)",
			"CREATE TABLE IF NOT EXISTS history_positions (source String, stream String, seq UInt64, written UInt64) ENGINE = ReplacingMergeTree(written) ORDER BY source",
		}},
		{"cluster", Layout{Cluster: "locks_cluster", Database: "locks"}, []string{
			"CREATE TABLE IF NOT EXISTS locks.readings_local ON CLUSTER locks_cluster (sensor_id String, seq UInt64, data UInt8, time DateTime, time_ms UInt16, received DateTime, received_ms UInt16, message_id String) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/locks/readings_local', '{replica}') PARTITION BY toYYYYMM(received) ORDER BY (sensor_id, received, received_ms, seq)",
			"CREATE TABLE IF NOT EXISTS locks.readings ON CLUSTER locks_cluster AS locks.readings_local ENGINE = Distributed(locks_cluster, locks, readings_local, sipHash64(sensor_id))",
			"CREATE TABLE IF NOT EXISTS locks.events_local ON CLUSTER locks_cluster (event_id String, sensor_id String, type String, revision UInt64, data UInt8, previous_data Nullable(UInt8), time DateTime, time_ms UInt16, seq UInt64, received DateTime DEFAULT time, received_ms UInt16 DEFAULT time_ms) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/locks/events_local', '{replica}') PARTITION BY toYYYYMM(received) ORDER BY (sensor_id, received, received_ms, revision, event_id)",
			"CREATE TABLE IF NOT EXISTS locks.events ON CLUSTER locks_cluster AS locks.events_local ENGINE = Distributed(locks_cluster, locks, events_local, sipHash64(sensor_id))",
			"CREATE TABLE IF NOT EXISTS locks.deliveries_local ON CLUSTER locks_cluster (event_id String, client_id String, sensor_id String, attempt UInt16, time DateTime, time_ms UInt16, status_code UInt16, latency_ms UInt32, error String, outcome String) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/locks/deliveries_local', '{replica}') PARTITION BY toYYYYMM(time) ORDER BY (client_id, time, time_ms, event_id, attempt)",
			"CREATE TABLE IF NOT EXISTS locks.deliveries ON CLUSTER locks_cluster AS locks.deliveries_local ENGINE = Distributed(locks_cluster, locks, deliveries_local, sipHash64(sensor_id))",
			"CREATE TABLE IF NOT EXISTS locks.history_positions ON CLUSTER locks_cluster (source String, stream String, seq UInt64, written UInt64) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/locks/history_positions', '{replica}', written) ORDER BY source",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := Create(c.layout)
			if !slices.Equal(got, c.want) {
				for i := range max(len(got), len(c.want)) {
					var g, w string
					if i < len(got) {
						g = got[i]
					}
					if i < len(c.want) {
						w = c.want[i]
					}
					if g != w {
						t.Errorf("statement %d:\n got %s\nwant %s", i, g, w)
					}
				}
			}
		})
	}
}

func TestValidName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"locks", "prod_cluster", "_x1"} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1x", "a-b", "a b", "a`b", "a'b", "a.b"} {
		if ValidName(bad) == nil {
			t.Errorf("ValidName(%q) accepted", bad)
		}
	}
}
