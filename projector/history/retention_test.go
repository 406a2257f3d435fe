package history

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// With a retention, the running history projector drops the months of readings, events and
// deliveries that ended longer ago than it, and keeps the younger ones, on the real ClickHouse.
func TestHistoryRetentionDropsOldMonths(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	ctx := t.Context()
	now := time.Now().UTC()
	old, young := now.AddDate(0, 0, -200), now.AddDate(0, 0, -1)
	for i, at := range []time.Time{old, young} {
		sensor, id := fmt.Sprintf("S%d", i), fmt.Sprintf("evt_%d", i)
		for _, ins := range []struct {
			q    string
			cols []any
		}{
			{"INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)",
				[]any{sensor, uint64(i + 1), uint8(1), at, uint16(0), at, uint16(0), ""}},
			{"INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq, received, received_ms)",
				[]any{id, sensor, "sensor.state_changed", uint64(1), uint8(1), (*uint8)(nil), at, uint16(0), uint64(i + 1), at, uint16(0)}},
			{"INSERT INTO deliveries (event_id, client_id, sensor_id, attempt, time, time_ms, status_code, latency_ms, error, outcome)",
				[]any{id, "C1", sensor, uint16(1), at, uint16(0), uint16(200), uint32(5), "", "delivered"}},
		} {
			b, err := e.ch.PrepareBatch(ctx, ins.q)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Append(ins.cols...); err != nil {
				t.Fatalf("%s: %v", ins.q, err)
			}
			if err := b.Send(); err != nil {
				t.Fatalf("%s: %v", ins.q, err)
			}
		}
	}
	count := func(table, sensor string) uint64 {
		var n uint64
		if err := e.ch.QueryRow(ctx, "SELECT count() FROM "+table+" WHERE sensor_id = ?", sensor).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	cfg := historyTestConfig()
	cfg.Retention, cfg.RetentionEvery = 90*24*time.Hour, 100*time.Millisecond
	h, err := New(cfg, Deps{Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry(), JS: e.nats.JS, CH: e.ch})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "history", h.Run, 10*time.Second)
	for _, table := range []string{"readings", "events", "deliveries"} {
		testenv.Eventually(t, 20*time.Second, "the month 200 days ago to be dropped from "+table, func() bool {
			return count(table, "S0") == 0
		})
		if n := count(table, "S1"); n != 1 {
			t.Errorf("%s: %d rows of yesterday left, want 1", table, n)
		}
	}
}
