package e2e_test

import (
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/loadgen"
)

// receiverPorts is how many ports the hub's clients share (LOCKS_BENCH_RECEIVER_PORTS): as
// many as the clients up to 1,000, so that the notifier's connections spread over that many
// hosts, about what its idle pool keeps (1,024); more would reconnect on most deliveries, as
// they would to as many real receivers.
func receiverPorts(b *testing.B, clients int) int {
	return int(envFloat(b, "LOCKS_BENCH_RECEIVER_PORTS", float64(min(clients, 1000))))
}

// BenchmarkFanOut is issue 26's fan-out case of the scale envelope, opt-in like
// BenchmarkScaleEnvelope (LOCKS_BENCH_ENVELOPE=1, `go tool task bench:fanout`): one sensor
// subscribed by LOCKS_BENCH_FANOUT_CLIENTS clients (default 1,000), each with its own
// webhook URL on a local receiver (hub), registered through the API (the sensor through
// `POST /v1/sensors:batchCreate`, each client's subscription through its batchCreate), then
// LOCKS_BENCH_FANOUT_CHANGES changes of the sensor (default 20), each published once the
// previous one reached every client, under the defaults of `locks run --targets=all`.
//
// Reported: per change, the time from its reading's publish to the last of its webhooks
// (fanout-p50/p99/max-ms), publish → webhook over every webhook (webhook-p50/p99-ms), the
// deliveries/s within a fan-out, and what a delivery cost: Postgres (its backends' CPU, the
// statements' time, transactions) and the locks process's CPU. The books are asserted: every
// client got every change once, in revision order, and nothing else.
func BenchmarkFanOut(b *testing.B) {
	if os.Getenv("LOCKS_BENCH_ENVELOPE") == "" {
		b.Skip("opt-in: LOCKS_BENCH_ENVELOPE=1 (go tool task bench:fanout)")
	}
	clients := int(envFloat(b, "LOCKS_BENCH_FANOUT_CLIENTS", 1000))
	changes := int(envFloat(b, "LOCKS_BENCH_FANOUT_CHANGES", 20))
	for range b.N {
		benchFanOut(b, clients, changes)
	}
}

func benchFanOut(b *testing.B, clients, changes int) {
	ctx := b.Context()
	s := start(b, "LOCKS_LOG_LEVEL=info")
	pool, err := pgxpool.New(ctx, s.pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	h := newHub(b, clients, receiverPorts(b, clients))
	reg := loadgen.Registrar{APIURL: "http://" + s.http, Token: s.token, Parallel: 8}
	b.ResetTimer()

	const sensor = "fan0"
	if _, err := reg.Fleet(ctx, "fan", 0, 1, ""); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	cs := h.createClients(b, ctx, reg, "fan", "fan-out", 500)
	created := time.Since(t0)
	t0 = time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, c := range cs {
		g.Go(func() error { return reg.SubscribeIDs(gctx, c.ID, []string{sensor}) })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	subscribed := time.Since(t0)
	b.ReportMetric(float64(clients)/created.Seconds(), "clients-created/s")
	b.ReportMetric(float64(clients)/subscribed.Seconds(), "subscriptions/s")
	say(b, "%d clients created in %s, each subscribed to %s in %s (a call each)", clients, created.Round(time.Millisecond),
		sensor, subscribed.Round(time.Millisecond))
	progress("fan-out: %d clients subscribed to %s; %d changes follow, each after the last reached every client", clients, sensor, changes)

	m := startPG(b, pool, s.pid)
	var end time.Time
	for k := 1; k <= changes; k++ {
		s.publish(reading(sensor, k%2))
		want := int64(k * clients)
		deadline := time.Now().Add(2 * time.Minute)
		for h.received.Load() < want {
			if time.Now().After(deadline) {
				b.Fatalf("change %d: %d of %d webhooks within 2 minutes", k, h.received.Load()-int64((k-1)*clients), clients)
			}
			time.Sleep(5 * time.Millisecond)
		}
		e := h.newest()
		end = e.last
		progress("fan-out: change %d/%d reached %d clients %s after its publish (first webhook %s, last %s)", k, changes, e.n,
			e.last.Sub(e.occurred).Round(time.Millisecond), e.first.Sub(e.occurred).Round(time.Millisecond), e.last.Sub(e.occurred).Round(time.Millisecond))
	}
	// Anything more (a repeat, a late stray) would arrive now.
	time.Sleep(2 * time.Second)
	cost := m.stop(b, end)
	b.StopTimer()

	problems, odd := h.check(func(int) map[string]int64 { return map[string]int64{sensor: int64(changes)} })
	for _, p := range problems {
		b.Error("MISMATCH:", p)
	}
	explain(b, pool, cs, odd)
	failedAttempts(b, pool)
	done, short := h.fanOut(clients)
	if short > 0 || len(done) != changes {
		b.Errorf("%d changes reached every client, %d did not; want %d", len(done), short, changes)
	}
	lat, _ := h.latencies()
	var spent time.Duration
	for _, d := range done {
		spent += d
	}
	n := float64(clients * changes)
	b.ReportMetric(loadgen.Quantile(done, 0.5), "fanout-p50-ms")
	b.ReportMetric(loadgen.Quantile(done, 0.99), "fanout-p99-ms")
	b.ReportMetric(loadgen.Quantile(done, 1), "fanout-max-ms")
	b.ReportMetric(loadgen.Quantile(lat, 0.5), "webhook-p50-ms")
	b.ReportMetric(loadgen.Quantile(lat, 0.99), "webhook-p99-ms")
	b.ReportMetric(n/spent.Seconds(), "deliveries/s")
	b.ReportMetric(float64(clients), "clients")
	say(b, "fan-out to %d clients, %d changes: publish → last webhook p50 %.0f ms, p99 %.0f ms, max %.0f ms; publish → webhook over all %d webhooks p50 %.0f ms, p99 %.0f ms; %.0f deliveries/s within a fan-out",
		clients, changes, loadgen.Quantile(done, 0.5), loadgen.Quantile(done, 0.99), loadgen.Quantile(done, 1), len(lat),
		loadgen.Quantile(lat, 0.5), loadgen.Quantile(lat, 0.99), n/spent.Seconds())
	cost.report(b, n, "delivery")
}
