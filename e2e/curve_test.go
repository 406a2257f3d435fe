package e2e_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// sustainableP99 is the publish → webhook p99 up to which a rate counts as sustainable.
const sustainableP99 = time.Second

// curveConfig is the capacity curve's load, from the environment:
//
//	LOCKS_BENCH_CURVE_RATES        readings/s of each step (default 1000,2000,4000,6000,8000)
//	LOCKS_BENCH_CURVE_DURATION     publishing time of each step (default 60s)
//	LOCKS_BENCH_CURVE_SYNC         LOCKS_NATS_SYNC settings to run it under (default always,2m)
//	LOCKS_BENCH_CURVE_SENSORS      the fleet (default 10000)
//	LOCKS_BENCH_CURVE_PASSTHROUGH  readings of the bare RabbitMQ pass-through (default 200000)
type curveConfig struct {
	rates       []int
	dur         time.Duration
	syncs       []string
	sensors     int
	passthrough int
}

func curveFromEnv(b *testing.B) curveConfig {
	c := curveConfig{rates: []int{1000, 2000, 4000, 6000, 8000}, dur: envDuration(b, "LOCKS_BENCH_CURVE_DURATION", 60*time.Second),
		syncs: []string{"always", "2m"}, sensors: int(envFloat(b, "LOCKS_BENCH_CURVE_SENSORS", 10_000)),
		passthrough: int(envFloat(b, "LOCKS_BENCH_CURVE_PASSTHROUGH", 200_000))}
	if v := os.Getenv("LOCKS_BENCH_CURVE_RATES"); v != "" {
		c.rates = nil
		for _, f := range strings.Split(v, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || r <= 0 {
				b.Fatalf("LOCKS_BENCH_CURVE_RATES=%q: %q is not a positive rate", v, f)
			}
			c.rates = append(c.rates, r)
		}
	}
	if v := os.Getenv("LOCKS_BENCH_CURVE_SYNC"); v != "" {
		c.syncs = strings.Split(v, ",")
	}
	return c
}

// BenchmarkCapacityCurve is issue 26's capacity curve under the defaults a new user gets:
// one `locks run --targets=all` process (embedded NATS), 10,000 sensors and one client with a
// fast local receiver registered through the batch calls, a warm-up (every sensor's first
// reading, not measured), then readings published at each fixed rate in turn (5% changes),
// each step waited out until the state and the webhooks caught up before the next begins.
//
// Reported per step (sync=…/rate=…): the rate published, readings/s taken in (the step's
// readings ÷ the time from its first publish until the state projection applied the last
// of them and the last expected webhook was in), the bridge's accepted/s while publishing,
// publish → state p50/p99 (a few probe sensors of their own, one change every 50 ms, on the
// same queue: changeProbe), publish → webhook p50/p99 of the step's state changes, and every
// process's CPU per reading from /proc. The books are asserted after each step: every reading
// applied once, every change received once and in revision order, nothing else.
//
// The headline (sync=…/sustainable) is the sustainable rate: the highest step, counted from
// the lowest up, whose publish → webhook p99 is ≤ 1 s, and its share of the bare RabbitMQ
// pass-through (passthrough: the same bodies published as fast as confirms allow into a
// queue that a bare consumer acks), measured first in the same run.
func BenchmarkCapacityCurve(b *testing.B) {
	c := curveFromEnv(b)
	var pass float64
	b.Run("passthrough", func(b *testing.B) {
		for range b.N {
			pass = benchPassThrough(b, c.passthrough, c.sensors)
		}
	})
	for _, sync := range c.syncs {
		b.Run("sync="+sync, func(b *testing.B) { benchCurve(b, c, pass, "LOCKS_NATS_SYNC="+sync) })
	}
}

// benchPassThrough publishes n readings of a fleet of sensors with loadgen as fast as RabbitMQ
// confirms while a bare consumer acks them, and reports readings/s (until the last is acked)
// and the CPU per reading.
func benchPassThrough(b *testing.B, n, sensors int) float64 {
	rabbit := testenv.RabbitMQ(b)
	consumed := testenv.BareConsumer(b, rabbit.Conn, rabbit.Queue, n)
	b.ResetTimer()
	machine := testenv.StartCPU(testenv.Servers())
	books, err := loadgen.Run(b.Context(), loadgen.Config{AMQPURL: rabbit.URL, Queue: rabbit.Queue, Sensors: sensors,
		Rate: 1e6, ChangeRatio: 0.05, Count: int64(n), Prefix: "pass", Seed: 3}, nil, testenv.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	select {
	case err := <-consumed:
		if err != nil {
			b.Fatal(err)
		}
	case <-time.After(5 * time.Minute):
		b.Fatal("the bare consumer did not get every reading within 5 minutes")
	}
	el := time.Since(books.Start)
	use := machine.Stop()
	b.StopTimer()
	rate := float64(n) / el.Seconds()
	b.ReportMetric(rate, "readings/s")
	b.ReportMetric(float64(n)/books.End.Sub(books.Start).Seconds(), "published/s")
	testenv.ReportCPUPer(b, use, float64(n), "reading")
	return rate
}

// curveStep is what one rate of the curve measured.
type curveStep struct {
	rate            int
	takenIn         float64 // readings/s
	webhookP99      float64 // ms
	webhookP50      float64 // ms
	stateP50, state float64 // ms (state: p99)
}

func benchCurve(b *testing.B, c curveConfig, pass float64, env ...string) {
	ctx := b.Context()
	s := start(b, append([]string{"LOCKS_LOG_LEVEL=info"}, env...)...)
	pool, err := pgxpool.New(ctx, s.pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	api := "http://" + s.http
	probes := make([]string, 20)
	for i := range probes {
		probes[i] = loadgen.SensorID("probe", i)
	}
	if _, err := (loadgen.Registrar{APIURL: api, Token: s.token}).Fleet(ctx, "probe", 0, len(probes), ""); err != nil {
		b.Fatal(err)
	}
	w := warmUp(b, s.rabbit, api, s.token, "curve", c.sensors)
	rcv := w.rcv
	cum := w.books // the books of the whole run so far
	probe, err := newChangeProbe(s.rabbit.Conn, pool, s.rabbit.Queue, probes, 50*time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	pctx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	go probe.Poll(pctx)

	var steps []curveStep
	lat0, stateLat0 := w.latencies, 0
	for i, rate := range c.rates {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			b.ResetTimer()
			machine := testenv.StartCPU(s.components())
			accepted0 := s.metric("locks_bridge_readings_accepted_total")
			probed0, _ := probe.Published()
			// The probe publishes while the step does, so that the system holds exactly
			// the step's readings and the probe's when it has caught up.
			stopProbe, probing := make(chan struct{}), make(chan struct{})
			go func() { probe.Run(stopProbe); close(probing) }()
			books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: c.sensors,
				Rate: float64(rate), ChangeRatio: 0.05, Duration: c.dur, Prefix: "curve", Seed: uint64(100 + i), Last: cum.Last}, nil, testenv.Logger(b))
			close(stopProbe)
			<-probing
			if err != nil {
				b.Fatal(err)
			}
			accepted := s.metric("locks_bridge_readings_accepted_total") - accepted0
			cum.Published += books.Published
			cum.Changes += books.Changes
			cum.Last, cum.LastAt, cum.End = books.Last, books.LastAt, books.End
			last := awaitCaughtUp(b, s, rcv, probe, cum)
			use := machine.Stop()
			b.StopTimer()

			t := rcv.Tally()
			for _, p := range loadgen.Check(cum, t, time.Hour, false) {
				b.Error("MISMATCH:", p)
			}
			if t.OutOfOrder > 0 {
				b.Errorf("MISMATCH: %d webhooks of an older revision after a newer one", t.OutOfOrder)
			}
			lat, n := rcv.Latencies(lat0)
			lat0 = n
			stateLat, sn := probe.Latencies(stateLat0)
			stateLat0 = sn
			probed, _ := probe.Published()
			readings := float64(books.Published + probed - probed0)
			st := curveStep{rate: rate, takenIn: float64(books.Published) / last.Sub(books.Start).Seconds(),
				webhookP50: loadgen.Quantile(lat, 0.5), webhookP99: loadgen.Quantile(lat, 0.99),
				stateP50: loadgen.Quantile(stateLat, 0.5), state: loadgen.Quantile(stateLat, 0.99)}
			steps = append(steps, st)
			b.ReportMetric(float64(books.Published)/books.End.Sub(books.Start).Seconds(), "published/s")
			b.ReportMetric(st.takenIn, "readings/s")
			b.ReportMetric(accepted/books.End.Sub(books.Start).Seconds(), "accepted/s")
			b.ReportMetric(float64(books.Published), "readings")
			b.ReportMetric(float64(books.Changes), "changes")
			b.ReportMetric(st.stateP50, "state-p50-ms")
			b.ReportMetric(st.state, "state-p99-ms")
			b.ReportMetric(st.webhookP50, "webhook-p50-ms")
			b.ReportMetric(st.webhookP99, "webhook-p99-ms")
			b.ReportMetric(last.Sub(books.End).Seconds(), "caught-up-after-s")
			testenv.ReportCPUPer(b, use, readings, "reading")
		})
	}
	if err := probe.Err(); err != nil {
		b.Fatalf("probe: %v", err)
	}
	b.Run("sustainable", func(b *testing.B) {
		best := curveStep{}
		for _, st := range steps {
			if !(st.webhookP99 <= float64(sustainableP99.Milliseconds())) {
				break // NaN (no webhook) counts as a failure too
			}
			best = st
		}
		b.ReportMetric(float64(best.rate), "sustainable-rate/s")
		b.ReportMetric(best.takenIn, "readings/s")
		b.ReportMetric(best.webhookP99, "webhook-p99-ms")
		if pass > 0 {
			b.ReportMetric(float64(best.rate)/pass, "of-passthrough")
		}
		for _, st := range steps {
			b.Logf("rate %5d/s: taken in %6.0f/s, publish→state p50 %6.0f ms p99 %6.0f ms, publish→webhook p50 %6.0f ms p99 %6.0f ms",
				st.rate, st.takenIn, st.stateP50, st.state, st.webhookP50, st.webhookP99)
		}
	})
}

// awaitCaughtUp waits until the state projection applied every reading published so far
// (the fleet's books and the probe's), every expected change was received and every probe
// reading is in the state; it returns when (within 50 ms), and fails b after 10 minutes. A
// reading applied twice fails b.
func awaitCaughtUp(b *testing.B, s *system, rcv *loadgen.Receiver, probe *changeProbe, cum loadgen.Books) time.Time {
	b.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		probed, pending := probe.Published()
		applied := s.metric("locks_state_applied_total")
		changes := rcv.Tally().ByType["sensor.state_changed"]
		want := float64(cum.Published + probed)
		if applied >= want && changes >= cum.Changes && pending == 0 {
			if applied > want {
				b.Errorf("MISMATCH: %v readings applied to the state, %v published", applied, want)
			}
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("not caught up 10 minutes after publishing ended: %v of %d readings applied, %d of %d changes received, %d probe readings pending",
				applied, cum.Published+probed, changes, cum.Changes, pending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
