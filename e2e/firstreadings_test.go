package e2e_test

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// BenchmarkFirstReadings is issue 17's burst of first readings: a fleet registered with one
// client (LOCKS_BENCH_FIRST_SENSORS, default 100,000, through the REST API, with a fast
// local receiver), then every sensor's first reading published as fast as RabbitMQ confirms.
// Each first reading is a change, so the one client is owed one webhook per sensor at once.
// Reported: last-webhook-after-s, from the last reading's confirm to the last webhook's
// receipt (target ≤ 30 s); webhooks/s over the burst; publish → webhook p50/p99; the books
// (every change received once, no bad signature). One `locks run --targets=all` process,
// embedded NATS, under both LOCKS_NATS_SYNC settings: `always` (the durable default, whose
// ingest is bound by fsync) and `2m` (nats-server's own default).
func BenchmarkFirstReadings(b *testing.B) {
	sensors := int(envFloat(b, "LOCKS_BENCH_FIRST_SENSORS", 100_000))
	for _, sync := range []string{"always", "2m"} {
		b.Run("sync="+sync, func(b *testing.B) {
			for range b.N {
				ctx := b.Context()
				s := start(b, "LOCKS_LOG_LEVEL=info", "LOCKS_NATS_SYNC="+sync)
				rcv := registered(b, "http://"+s.http, s.token, "first", sensors)
				b.ResetTimer()
				machine := testenv.StartCPU(s.components())
				books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: sensors,
					Rate: 200_000, Count: int64(sensors), Prefix: "first", Seed: 3}, nil, testenv.Logger(b))
				if err != nil {
					b.Fatal(err)
				}
				if books.Changes != int64(sensors) {
					b.Fatalf("the load generator counted %d changes for %d first readings", books.Changes, sensors)
				}
				last := awaitChanges(b, rcv, books.Changes)
				use := machine.Stop()
				b.StopTimer()

				t := rcv.Tally()
				lat, _ := rcv.Latencies(0)
				for _, p := range loadgen.Check(books, t, time.Hour, false) {
					b.Error("MISMATCH:", p)
				}
				b.ReportMetric(float64(books.Published)/books.End.Sub(books.Start).Seconds(), "published/s")
				b.ReportMetric(float64(books.Changes), "changes")
				b.ReportMetric(float64(t.Received), "webhooks")
				b.ReportMetric(float64(t.Duplicates), "duplicates")
				b.ReportMetric(float64(t.Received)/last.Sub(books.Start).Seconds(), "webhooks/s")
				b.ReportMetric(loadgen.Quantile(lat, 0.5), "webhook-p50-ms")
				b.ReportMetric(loadgen.Quantile(lat, 0.99), "webhook-p99-ms")
				b.ReportMetric(last.Sub(books.End).Seconds(), "last-webhook-after-s")
				testenv.ReportCPUPer(b, use, float64(books.Published), "reading")
			}
		})
	}
}
