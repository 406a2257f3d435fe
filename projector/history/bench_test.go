package history

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// BenchmarkHistoryInsert measures the writer's INSERT path: 1,000,000 readings, decoded
// beforehand from their READINGS JSON (the decode rate is reported apart: in the projector it
// runs in the consumers, in parallel across partitions, overlapping the INSERTs), turned into
// columns and written in INSERTs of batch rows, one after the other as one table's writer does.
func BenchmarkHistoryInsert(b *testing.B) {
	_, ch := testenv.ClickHouse(b)
	const total = 1_000_000
	logs := historyReadings(1000, total, time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC), 0)
	var msgs [][]byte
	var subjects []string
	for _, l := range logs {
		if l.Kind == event.KindReading {
			m, _ := json.Marshal(l)
			msgs = append(msgs, m)
			subjects = append(subjects, natsx.ReadingsStoredSubject(partition.Of(l.SensorID, historyPartitions), l.SensorID))
		}
	}
	t := tables[0]
	start := time.Now()
	rows := make([]any, 0, len(msgs))
	for i, m := range msgs {
		r, err := t.decode(subjects[i], m, &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: uint64(i + 1)}}, historyPartitions)
		if err != nil {
			b.Fatal(err)
		}
		rows = append(rows, r)
	}
	decodeRate := float64(len(rows)) / time.Since(start).Seconds()
	for _, batch := range []int{10_000, 50_000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				if err := ch.Exec(b.Context(), "TRUNCATE TABLE readings"); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				for i := 0; i < len(rows); i += batch {
					if err := insertRows(b.Context(), ch, t, t.columns(rows[i:min(i+batch, len(rows))])); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(rows))/time.Since(start).Seconds(), "rows/s")
				b.ReportMetric(decodeRate, "decode-rows/s")
			}
			var n uint64
			if err := ch.QueryRow(b.Context(), "SELECT count() FROM readings").Scan(&n); err != nil || n != total {
				b.Fatalf("%d rows, %v", n, err)
			}
		})
	}
}

// BenchmarkHistoryProjector measures the projector end to end with its defaults: 200,000
// readings already in READINGS (4 partitions, embedded NATS), from start until all are in
// ClickHouse, pulled, decoded, written and acked.
func BenchmarkHistoryProjector(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		e := newHistoryEnv(b)
		const total = 200_000
		logs := historyReadings(1000, total, time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC), 0)
		historyPublish(b, e.nats.JS, logs)
		cfg := Config{Partitions: historyTestConfig().Partitions}
		b.StartTimer()
		start := time.Now()
		_, stop := runHistory(b, cfg, e.nats.JS, e.ch)
		historyWaitRows(b, e.ch, total, 2*time.Minute)
		el := time.Since(start)
		stop()
		b.ReportMetric(total/el.Seconds(), "rows/s")
		b.Logf("%d readings in %s", total, el.Round(time.Millisecond))
	}

}
