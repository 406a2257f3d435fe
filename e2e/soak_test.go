package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

func envFloat(tb testing.TB, name string, def float64) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, v, err)
	}
	return f
}

// The soak's defaults, found by trying (60 s runs, 10,000 sensors after the warm-up, with
// every server, every part and the load generator on this 2-core machine, nothing else
// running): at 5,000 and 6,500 readings/s (500 and 650 webhooks/s to the one client) both the
// state and the webhooks kept up (backlog 42 and 63 at the end, gone within 0.3 s; webhook
// p99 1.3 s at 6,500/s) with the machine's CPU at 190%; at 8,000/s the webhooks fell behind
// (2,001 outstanding at the end, p99 4.7 s). Earlier trials on a machine busy with other
// tests fell behind from 4,500/s, before the notifier's claim got its partial index. The
// default keeps a margin below 6,500 for five minutes. A tenth of the readings are changes.
const (
	soakRate        = 6000
	soakSensors     = 10_000
	soakChangeRatio = 0.1
)

// BenchmarkSoak is the must-show run: every part as its own `locks run --targets=<part>`
// process (bridge, state, history, notifier, watchdog, api; 4 partitions) on a NATS server
// of its own, with the load generator and its webhook receiver in this process, all on this
// machine's servers. The fleet (LOCKS_BENCH_SOAK_SENSORS, default 10,000 sensors, one
// client subscribed to all) is registered through the REST API and reports once (a warm-up,
// not measured, until those first changes are notified); then readings go through
// RabbitMQ at LOCKS_BENCH_SOAK_RATE (default 6,000/s, 10% changes) for
// LOCKS_BENCH_SOAK_DURATION (default 5m), and the run waits up to LOCKS_BENCH_SOAK_SETTLE
// (default 2m) for every reading to be recorded and every change to be notified.
//
// Reported: the publish rate; publish → sensor_state latency p50/p95/p99 (loadgen.StateProbe,
// polling every 250 ms, ±125 ms) and publish → webhook receipt p50/p95/p99; the books
// (readings not recorded, changes, webhooks, missing, duplicates, bad signatures); the largest
// state lag of any second; the settle time after publishing ended; and CPU per component as
// % of one core over publishing + settling (the servers are shared with anything else running
// on the machine). The per-second series and the latency quantiles go to LOCKS_BENCH_OUT
// (soak-series.csv, soak-latency.csv) for benchreport's plots.
func BenchmarkSoak(b *testing.B) {
	dur := envDuration(b, "LOCKS_BENCH_SOAK_DURATION", 5*time.Minute)
	settle := envDuration(b, "LOCKS_BENCH_SOAK_SETTLE", 2*time.Minute)
	rate := envFloat(b, "LOCKS_BENCH_SOAK_RATE", soakRate)
	sensors := int(envFloat(b, "LOCKS_BENCH_SOAK_SENSORS", soakSensors))
	out := benchOut(b)
	for range b.N {
		ctx := b.Context()
		c := newCluster(b, 4)
		bridge := c.part("bridge", "")
		state := c.part("state", "")
		c.part("history", "")
		c.part("notifier", "")
		c.part("watchdog", "")
		api := c.part("api", "")

		w := warmUp(b, c.rabbit, "http://"+api.http, c.token, "soak", sensors)
		rcv, warm := w.rcv, w.books

		pool, err := pgxpool.New(ctx, c.pgURL)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		rec, err := loadgen.NewRecorder(ctx, []string{bridge.metricsURL()})
		if err != nil {
			b.Fatal(err)
		}
		live := &loadgen.Live{}
		probe := loadgen.NewStateProbe(pool, time.Now())
		sampler := &loadgen.Sampler{Live: live, BridgeURLs: []string{bridge.metricsURL()},
			StateURLs: []string{state.metricsURL()}, Receiver: rcv, State: probe}
		sctx, stopSampling := context.WithCancel(ctx)
		probeDone, samplerDone := make(chan struct{}), make(chan struct{})
		go func() { probe.Run(sctx, 250*time.Millisecond); close(probeDone) }()
		go func() { sampler.Run(sctx); close(samplerDone) }()
		meter := testenv.StartCPU(c.components())
		b.ResetTimer()

		books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: c.rabbit.URL, Queue: c.rabbit.Queue, Sensors: sensors,
			Rate: rate, ChangeRatio: soakChangeRatio, Duration: dur, Prefix: "soak", Seed: 1, Live: live, Last: warm.Last}, nil, testenv.Logger(b))
		if err != nil {
			b.Fatal(err)
		}
		// The receiver's counts include the warm-up's; the books of the run are continued with them.
		books.Changes += warm.Changes
		backlogAtEnd := books.Changes - rcv.Tally().ByType["sensor.state_changed"]
		var recorded loadgen.Recorded
		deadline := time.Now().Add(settle)
		for {
			recorded, err = rec.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if recorded.Recorded+recorded.Invalid >= books.Published && rcv.Tally().ByType["sensor.state_changed"] >= books.Changes ||
				time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		settled := time.Since(books.End)
		use := meter.Stop()
		// One more second for the probe and the sampler to see the last commits.
		time.Sleep(1100 * time.Millisecond)
		stopSampling()
		<-probeDone
		<-samplerDone
		b.StopTimer()
		if err := probe.Err(); err != nil {
			b.Fatal(err)
		}

		t := rcv.Tally()
		stateLat, _ := probe.Latencies(0)
		hookLat, _ := rcv.Latencies(w.latencies)
		samples := sampler.Samples()
		maxLag := 0.0
		for _, s := range samples {
			if s.StateLag > maxLag && s.T <= books.End.Sub(books.Start).Seconds() {
				maxLag = s.StateLag
			}
		}
		writeCSV(b, filepath.Join(out, "soak-series.csv"), func(f *os.File) error { return loadgen.WriteSeries(f, samples) })
		writeCSV(b, filepath.Join(out, "soak-latency.csv"), func(f *os.File) error {
			return loadgen.WriteCDF(f, []string{"state_ms", "webhook_ms"}, stateLat, hookLat)
		})
		missing := max(books.Changes-t.ByType["sensor.state_changed"], 0)
		problems := append(loadgen.Balance(books, recorded), loadgen.Check(books, t, time.Hour, false)...)
		for _, p := range problems {
			b.Log("MISMATCH:", p)
		}

		b.ReportMetric(float64(books.Published)/books.End.Sub(books.Start).Seconds(), "published/s")
		b.ReportMetric(float64(books.Published), "readings")
		b.ReportMetric(float64(books.Published-books.Invalid-recorded.Recorded), "unrecorded")
		b.ReportMetric(loadgen.Quantile(stateLat, 0.5), "state-p50-ms")
		b.ReportMetric(loadgen.Quantile(stateLat, 0.95), "state-p95-ms")
		b.ReportMetric(loadgen.Quantile(stateLat, 0.99), "state-p99-ms")
		b.ReportMetric(loadgen.Quantile(hookLat, 0.5), "webhook-p50-ms")
		b.ReportMetric(loadgen.Quantile(hookLat, 0.95), "webhook-p95-ms")
		b.ReportMetric(loadgen.Quantile(hookLat, 0.99), "webhook-p99-ms")
		b.ReportMetric(maxLag, "max-lag-ms")
		b.ReportMetric(float64(books.Changes-warm.Changes), "changes")
		b.ReportMetric(float64(t.Received-w.received), "webhooks")
		b.ReportMetric(float64(missing), "missing")
		b.ReportMetric(float64(t.Duplicates), "duplicates")
		b.ReportMetric(float64(t.BadSig), "bad-signatures")
		b.ReportMetric(float64(backlogAtEnd), "backlog-at-end")
		b.ReportMetric(settled.Seconds(), "settle-s")
		testenv.ReportCPU(b, use)
	}
}

// BenchmarkScaling is the scaling curve: readings/s from RabbitMQ to committed in
// sensor_state as partitions and state projector processes grow together (1, 2, 4): one
// bridge process, N state processes each owning one partition (`--partitions=i/N` with
// LOCKS_PARTITIONS=N) and a NATS server of their own. So that the system, not the load
// generator beside it, is what is measured, the load generator first fills the RabbitMQ queue
// for LOCKS_BENCH_SCALE_DURATION (default 30s, as fast as RabbitMQ confirms; 10,000 sensors,
// 10% changes) while no bridge runs; then the bridge starts and the backlog is drained.
// Reported: readings/s committed (readings committed after the bridge was ready ÷ the time
// from then until the last one was), the fill's publish rate, and CPU per component (state
// processes summed) over the drain.
func BenchmarkScaling(b *testing.B) {
	dur := envDuration(b, "LOCKS_BENCH_SCALE_DURATION", 30*time.Second)
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("partitions=%d", n), func(b *testing.B) {
			for range b.N {
				ctx := b.Context()
				c := newCluster(b, n)
				var stateURLs []string
				for i := range n {
					stateURLs = append(stateURLs, c.part("state", fmt.Sprintf("%d/%d", i, n)).metricsURL())
				}
				books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: c.rabbit.URL, Queue: c.rabbit.Queue, Sensors: 10_000,
					Rate: 200_000, ChangeRatio: 0.1, Duration: dur, Prefix: "scale", Seed: 1}, nil, testenv.Logger(b))
				if err != nil {
					b.Fatal(err)
				}
				applied := func() float64 {
					m, err := loadgen.Scrape(ctx, stateURLs, loadgen.MetricApplied)
					if err != nil {
						b.Fatal(err)
					}
					return m[loadgen.MetricApplied]
				}
				b.ResetTimer()
				c.part("bridge", "")
				meter := testenv.StartCPU(c.components())
				from := applied()
				deadline := time.Now().Add(10 * time.Minute)
				for applied() < float64(books.Published) {
					if time.Now().After(deadline) {
						b.Fatalf("state did not catch up: %v of %d applied", applied(), books.Published)
					}
					time.Sleep(100 * time.Millisecond)
				}
				use := meter.Stop()
				drain := time.Since(meter.Start)
				b.StopTimer()
				// The state processes as one component, so that the rows line up across N.
				var merged []testenv.CPUUse
				st := testenv.CPUUse{Name: "locks-state"}
				for _, u := range use {
					if strings.HasPrefix(u.Name, "locks-state") {
						st.Seconds, st.Percent = st.Seconds+u.Seconds, st.Percent+u.Percent
						continue
					}
					merged = append(merged, u)
				}
				merged = slices.Insert(merged, 1, st)
				b.ReportMetric((float64(books.Published)-from)/drain.Seconds(), "readings/s")
				b.ReportMetric(float64(books.Published)/books.End.Sub(books.Start).Seconds(), "fill-published/s")
				b.ReportMetric(float64(books.Published), "readings")
				testenv.ReportCPU(b, merged)
			}
		})
	}
}

func writeCSV(tb testing.TB, path string, write func(*os.File) error) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := errors.Join(write(f), f.Close()); err != nil {
		tb.Fatal(err)
	}
}

// warmed is a fleet registered with one client whose receiver got every first reading's
// webhook: what the measured run continues from.
type warmed struct {
	rcv   *loadgen.Receiver
	books loadgen.Books
	// latencies and received are the receiver's counts after the warm-up.
	latencies int
	received  int64
}

// warmUp registers sensors and one client with a receiver of its own through the REST API
// at apiURL, then publishes every sensor's first reading (each one a change, as the system
// has never seen the sensor) and waits until their webhooks are in. Not measured: a fleet is
// known to the system before it reports at a steady rate, and 10,000 first readings at once
// would otherwise be a burst of notifications no steady rate makes.
func warmUp(b *testing.B, rabbit *testenv.RabbitEnv, apiURL, token, prefix string, sensors int) warmed {
	b.Helper()
	ctx := b.Context()
	rcv := registered(b, apiURL, token, prefix, sensors)
	books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: rabbit.URL, Queue: rabbit.Queue, Sensors: sensors,
		Rate: 2000, Count: int64(sensors), Prefix: prefix, Seed: 2}, nil, testenv.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	testenv.Eventually(b, 5*time.Minute, "the warm-up's webhooks", func() bool {
		return rcv.Tally().ByType["sensor.state_changed"] >= books.Changes
	})
	_, lat := rcv.Latencies(0)
	return warmed{rcv: rcv, books: books, latencies: lat, received: rcv.Tally().Received}
}

// registered is a webhook receiver of its own, with sensors <prefix><n> and one client for it
// registered through the REST API at apiURL.
func registered(b *testing.B, apiURL, token, prefix string, sensors int) *loadgen.Receiver {
	b.Helper()
	rcv, err := loadgen.NewReceiver("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rcv.Close() })
	if err := rcv.Register(b.Context(), apiURL, token, prefix, sensors); err != nil {
		b.Fatal(err)
	}
	return rcv
}
