package e2e_test

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// BenchmarkFullSpeed is issue 17's full-speed run, tried as a new user would: the whole
// system in one `locks run --targets=all` process (embedded NATS), 10,000 sensors and one
// client with a fast local receiver registered through the REST API, a warm-up (every
// sensor's first reading, until its webhook is in, not measured), then readings published
// as fast as RabbitMQ confirms for LOCKS_BENCH_FULL_DURATION (default 60 s), 5% of them
// changes. Reported: the publish rate; publish → webhook receipt p50/p99; readings/s until
// the last webhook (readings published ÷ the time from the first publish to the last
// expected webhook, polled every 50 ms), judged against BareRabbitPassThrough in the same
// run; and the books (every change received once and in order, no bad signature).
//
// It runs under both LOCKS_NATS_SYNC settings, as EndToEndIngest does: `always`, the durable
// default a new user gets (the server syncs every write, or every atomic batch of the bridge
// and relays), and `2m`, nats-server's own default.
func BenchmarkFullSpeed(b *testing.B) {
	for _, sync := range []string{"always", "2m"} {
		b.Run("sync="+sync, func(b *testing.B) { benchFullSpeed(b, "LOCKS_NATS_SYNC="+sync) })
	}
}

func benchFullSpeed(b *testing.B, env ...string) {
	dur := envDuration(b, "LOCKS_BENCH_FULL_DURATION", 60*time.Second)
	const sensors = 10_000
	for range b.N {
		ctx := b.Context()
		s := start(b, append([]string{"LOCKS_LOG_LEVEL=info"}, env...)...)
		w := warmUp(b, s.rabbit, "http://"+s.http, s.token, "full", sensors)
		rcv, warm := w.rcv, w.books
		b.ResetTimer()
		machine := testenv.StartCPU(s.components())

		books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: sensors,
			Rate: 200_000, ChangeRatio: 0.05, Duration: dur, Prefix: "full", Seed: 1, Last: warm.Last}, nil, testenv.Logger(b))
		if err != nil {
			b.Fatal(err)
		}
		books.Changes += warm.Changes
		last := awaitChanges(b, rcv, books.Changes)
		use := machine.Stop()
		b.StopTimer()

		t := rcv.Tally()
		lat, _ := rcv.Latencies(w.latencies)
		for _, p := range loadgen.Check(books, t, time.Hour, false) {
			b.Error("MISMATCH:", p)
		}
		b.ReportMetric(float64(books.Published)/books.End.Sub(books.Start).Seconds(), "published/s")
		b.ReportMetric(float64(books.Published)/last.Sub(books.Start).Seconds(), "readings/s")
		b.ReportMetric(float64(books.Published), "readings")
		b.ReportMetric(float64(books.Changes-warm.Changes), "changes")
		b.ReportMetric(float64(t.Received-w.received), "webhooks")
		b.ReportMetric(float64(t.Duplicates), "duplicates")
		b.ReportMetric(loadgen.Quantile(lat, 0.5), "webhook-p50-ms")
		b.ReportMetric(loadgen.Quantile(lat, 0.99), "webhook-p99-ms")
		b.ReportMetric(last.Sub(books.End).Seconds(), "last-webhook-after-s")
		testenv.ReportCPUPer(b, use, float64(books.Published), "reading")
	}
}

// awaitChanges polls rcv every 50 ms until it has received want state changes, and returns
// when it saw the last one (within 50 ms); it fails b after 10 minutes.
func awaitChanges(b *testing.B, rcv *loadgen.Receiver, want int64) time.Time {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for rcv.Tally().ByType["sensor.state_changed"] < want {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d changes notified 10 minutes after publishing ended",
				rcv.Tally().ByType["sensor.state_changed"], want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Now()
}
