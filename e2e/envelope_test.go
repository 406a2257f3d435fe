package e2e_test

import (
	"bufio"
	"bytes"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// BenchmarkScaleEnvelope is issue 26's scale envelope for a large fleet, opt-in
// (LOCKS_BENCH_ENVELOPE=1, `go tool task bench:envelope`): it takes tens of minutes for a
// million sensors. One `locks run --targets=all` under the defaults but for LOCKS_LOST_AFTER,
// scaled down so that the hourly rhythm fits the run:
//
//  1. LOCKS_BENCH_ENVELOPE_SENSORS (default 1,000,000) sensors registered through
//     `POST /v1/sensors:batchCreate` (registrations/s), and one client with a fast local
//     receiver subscribed, through the batch call, to the 1% that will go silent
//     (subscriptions/s);
//  2. every sensor's first reading, then readings round-robin at LOCKS_BENCH_ENVELOPE_RATE
//     (default 2,000/s; 5% changes), the silent 1% reporting only once: first readings/s
//     (until the state applied the fleet's first pass);
//  3. the lost wave: every silent sensor must be declared lost once, no other; its delay
//     after each sensor's deadline (last reading + LOCKS_LOST_AFTER), p50/p99/max;
//  4. the API's count and list calls on the full fleet (first page, a page ten pages in,
//     the lost and the closed filters), each the best and worst of 5;
//  5. RSS (PSS where readable) of every process, and the Postgres database's size;
//  6. a restart: SIGTERM to exit, start to /readyz.
//
// LOCKS_LOST_AFTER is 1.5 × the time one pass over the fleet takes at the rate (at least
// 1 minute), so every active sensor reports well within it; LOCKS_BENCH_ENVELOPE_LOST_AFTER
// sets it. The rate must be one the system sustains (BenchmarkCapacityCurve): a backlog in
// RabbitMQ delays readings past their sensors' deadlines, and the books then show false
// losses.
func BenchmarkScaleEnvelope(b *testing.B) {
	if os.Getenv("LOCKS_BENCH_ENVELOPE") == "" {
		b.Skip("opt-in: LOCKS_BENCH_ENVELOPE=1 (go tool task bench:envelope); tens of minutes for a million sensors")
	}
	n := int(envFloat(b, "LOCKS_BENCH_ENVELOPE_SENSORS", 1_000_000))
	rate := envFloat(b, "LOCKS_BENCH_ENVELOPE_RATE", 2000)
	pass := time.Duration(float64(n) / rate * float64(time.Second))
	lostAfter := envDuration(b, "LOCKS_BENCH_ENVELOPE_LOST_AFTER", max(time.Minute, (pass*3/2).Round(time.Second)))
	silent := n / 100
	for range b.N {
		benchEnvelope(b, n, silent, rate, lostAfter)
	}
}

func benchEnvelope(b *testing.B, n, silent int, rate float64, lostAfter time.Duration) {
	ctx := b.Context()
	s := start(b, "LOCKS_LOG_LEVEL=info", "LOCKS_LOST_AFTER="+lostAfter.String())
	s.readyWithin = 15 * time.Minute
	pool, err := pgxpool.New(ctx, s.pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	api := "http://" + s.http
	b.ResetTimer()

	// 1. Registration.
	rcv, err := loadgen.NewReceiver("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer rcv.Close()
	reg := loadgen.Registrar{APIURL: api, Token: s.token}
	client, secret, err := reg.CreateClient(ctx, "envelope", rcv.URL())
	if err != nil {
		b.Fatal(err)
	}
	if err := rcv.SetSecret(secret); err != nil {
		b.Fatal(err)
	}
	r, err := reg.Fleet(ctx, "env", 0, n, "")
	if err != nil {
		b.Fatal(err)
	}
	if r.Created != n {
		b.Fatalf("%d of %d sensors registered", r.Created, n)
	}
	b.ReportMetric(float64(n)/r.Took.Seconds(), "registrations/s")
	// loadgen's silent sensors are the first of the fleet.
	sr, err := reg.Subscribe(ctx, client, "env", 0, silent)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(silent)/sr.Took.Seconds(), "subscriptions/s")
	b.Logf("registered %d sensors in %s, subscribed the client to %d in %s; LOCKS_LOST_AFTER=%s", n, r.Took.Round(time.Millisecond),
		silent, sr.Took.Round(time.Millisecond), lostAfter)

	// 2. First readings, then the fleet reporting until past the silent sensors' deadlines.
	machine := testenv.StartCPU(s.components())
	applied0 := s.metric("locks_state_applied_total")
	type res struct {
		books loadgen.Books
		err   error
	}
	done := make(chan res, 1)
	go func() {
		books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: n, Rate: rate,
			ChangeRatio: 0.05, SilentRatio: float64(silent) / float64(n), Duration: lostAfter + 30*time.Second,
			Prefix: "env", Seed: 4}, nil, testenv.Logger(b))
		done <- res{books, err}
	}()
	started := time.Now()
	testenv.Eventually(b, lostAfter+30*time.Second, "the fleet's first readings in the state", func() bool {
		return s.metric("locks_state_applied_total")-applied0 >= float64(n)
	})
	first := time.Since(started)
	b.ReportMetric(float64(n)/first.Seconds(), "first-readings/s")
	b.Logf("the fleet's first readings in the state after %s: %.0f/s", first.Round(time.Millisecond), float64(n)/first.Seconds())
	var out res
	select {
	case out = <-done:
	case <-time.After(lostAfter + 5*time.Minute):
		b.Fatal("the load run did not end")
	}
	if out.err != nil {
		b.Fatal(out.err)
	}
	books := out.books
	use := machine.Stop()
	testenv.ReportCPUPer(b, use, float64(books.Published), "reading")

	// 3. The lost wave: every silent sensor lost by now (they went silent at the start). A
	// wave still incomplete after another lost_after is a finding, not the end of the run:
	// the figures below are measured all the same.
	waveBy := time.Now().Add(lostAfter)
	for len(rcv.Tally().Lost) < silent && time.Now().Before(waveBy) {
		time.Sleep(100 * time.Millisecond)
	}
	t := rcv.Tally()
	b.Logf("lost wave: %d of %d silent sensors lost, %d webhooks received in all (%v)", len(t.Lost), silent, t.Received, t.ByType)
	// The client is subscribed to the silent sensors only, whose one reading each is their
	// one change: those are the state changes it must get.
	theirs := books
	theirs.Changes = int64(silent)
	for _, p := range loadgen.Check(theirs, t, lostAfter, true) {
		b.Error("MISMATCH:", p)
	}
	var late []time.Duration
	for _, id := range books.Silent {
		if at, ok := t.LostAt[id]; ok {
			late = append(late, at.Sub(books.LastAt[id].Add(lostAfter)))
		}
	}
	slices.Sort(late)
	b.ReportMetric(loadgen.Quantile(late, 0.5), "lost-p50-after-deadline-ms")
	b.ReportMetric(loadgen.Quantile(late, 0.99), "lost-p99-after-deadline-ms")
	b.ReportMetric(loadgen.Quantile(late, 1), "lost-max-after-deadline-ms")
	b.ReportMetric(float64(len(late)), "lost")
	b.Logf("lost after the deadline: p50 %.0f ms, p99 %.0f ms, max %.0f ms", loadgen.Quantile(late, 0.5), loadgen.Quantile(late, 0.99), loadgen.Quantile(late, 1))

	// 4. The API on the full fleet.
	apiCall := func(name, path string) {
		var best, worst time.Duration = math.MaxInt64, 0
		for range 5 {
			t0 := time.Now()
			if code := s.call(http.MethodGet, path, nil, nil); code != http.StatusOK {
				b.Fatalf("GET %s: %d", path, code)
			}
			d := time.Since(t0)
			best, worst = min(best, d), max(worst, d)
		}
		b.ReportMetric(float64(best.Microseconds())/1000, name+"-best-ms")
		b.ReportMetric(float64(worst.Microseconds())/1000, name+"-worst-ms")
		b.Logf("GET %s: best %s, worst %s of 5", path, best.Round(time.Microsecond), worst.Round(time.Microsecond))
	}
	apiCall("count", "/v1/sensors:count")
	apiCall("list", "/v1/sensors?page_size=1000")
	var page struct {
		Next string `json:"next_page_token"`
	}
	for range 10 {
		s.call(http.MethodGet, "/v1/sensors?page_size=1000&page_token="+page.Next, nil, &page)
	}
	apiCall("list-page10", "/v1/sensors?page_size=1000&page_token="+page.Next)
	apiCall("list-lost", "/v1/sensors?page_size=1000&connection=CONNECTION_LOST")
	apiCall("list-closed", "/v1/sensors?page_size=1000&data=1")
	apiCall("client-sensors", "/v1/clients/"+client+"/sensors?page_size=1000")

	// 5. Memory.
	mem := map[string]float64{
		"locks-process": pssMB(s.pid),
		"postgres":      pssMBOf("postgres"),
		"rabbitmq":      pssMBOf("beam.smp", "erl_child_setup", "epmd"),
		"clickhouse":    pssMBOf("clickhouse-serv", "clickhouse-server"),
	}
	for name, mb := range mem {
		b.ReportMetric(mb, name+"-rss-MB")
		b.Logf("memory of %s: %.0f MiB", name, mb)
	}
	var dbBytes int64
	if err := pool.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&dbBytes); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(dbBytes)/(1<<20), "postgres-db-MB")
	b.Logf("Postgres database: %.0f MiB", float64(dbBytes)/(1<<20))

	// 6. A restart.
	t0 := time.Now()
	if err := s.proc.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(2 * time.Minute):
		b.Fatal("locks did not stop within 2 minutes of SIGTERM")
	}
	b.ReportMetric(time.Since(t0).Seconds(), "stop-s")
	t0 = time.Now()
	s.launch()
	b.ReportMetric(time.Since(t0).Seconds(), "start-s")
	b.Logf("restart: ready %s after start", time.Since(t0).Round(time.Millisecond))
	b.ReportMetric(pssMB(s.pid), "locks-process-restarted-rss-MB")
	b.StopTimer()
	b.ReportMetric(float64(n), "sensors")
}

// pssMB is a process's proportional set size in MiB (its share of shared pages, so that the
// processes of one server add up), or its RSS where smaps_rollup cannot be read.
func pssMB(pid int) float64 {
	f := func(file, key string) float64 {
		raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), file))
		if err != nil {
			return -1
		}
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				return kb / 1024
			}
		}
		return -1
	}
	if v := f("smaps_rollup", "Pss"); v >= 0 {
		return v
	}
	return max(f("status", "VmRSS"), 0)
}

// pssMBOf is the sum of pssMB over the processes with one of the command names.
func pssMBOf(comms ...string) float64 {
	dirs, _ := os.ReadDir("/proc")
	var sum float64
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		c, err := os.ReadFile(filepath.Join("/proc", d.Name(), "comm"))
		if err != nil || !slices.Contains(comms, strings.TrimSpace(string(c))) {
			continue
		}
		sum += pssMB(pid)
	}
	return sum
}
