package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/lock-sensors/lock-sensors/api"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// BenchmarkWatchersEndToEnd is issue 27's watch figure on the whole pipeline: one `locks run
// --targets=all`, LOCKS_BENCH_WATCHERS clients (default 1000), each with a webhook endpoint,
// one sensor and a gRPC WatchClientEvents stream open on the API (50 streams a connection); readings published to
// RabbitMQ at LOCKS_BENCH_RATE (default 1000/s) for LOCKS_BENCH_DURATION (default 10 s), each
// a state change of its sensor, spread over the sensors. It reports, from each reading's
// publish (the state change's cause; the state change itself is later) to its event's arrival,
// the watch's and the webhook's latency in the same run, and the events a watcher missed or
// got twice (there must be none).
//
// Where the time goes: the same latencies split at the delivery row (its created_at, the
// notifier's intake transaction); the watch's way from the row, split at its transaction's
// commit and at the feed's horizon passing it (Postgres sampled every 25 ms); the age of the
// oldest open write transaction, which the horizon waits for; each hop's p50 and p99 from
// locks_stage_seconds; and the CPU
// of the locks process, the servers and the whole machine (anyone's work) over the run.
// LOCKS_BENCH_WATCH=0 opens no watch: the same load's webhook latency and CPU without them.
// LOCKS_BENCH_CPUPROFILE=dir keeps a CPU profile of the locks process over the publishing.
//
//	go test -run '^$' -bench BenchmarkWatchersEndToEnd -benchtime 1x ./e2e/
func BenchmarkWatchersEndToEnd(b *testing.B) {
	watchers := benchEnvInt(b, "LOCKS_BENCH_WATCHERS", 1000)
	rate := benchEnvInt(b, "LOCKS_BENCH_RATE", 1000)
	dur := 10 * time.Second
	if v := os.Getenv("LOCKS_BENCH_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("LOCKS_BENCH_DURATION: %v", err)
		}
		dur = d
	}
	watch := os.Getenv("LOCKS_BENCH_WATCH") != "0"
	grpcAddr := testenv.FreeAddr(b)
	s := start(b, "LOCKS_GRPC_ADDR="+grpcAddr, "LOCKS_LOG_LEVEL=info", "LOCKS_PPROF=true")

	type key struct {
		sensor string
		rev    int64
	}
	var mu sync.Mutex
	hooks := map[key][]time.Time{}   // arrivals at the receiver
	watched := map[key][]time.Time{} // arrivals at the sensor's client's watcher
	var wrongClient int
	parse := func(body []byte) key {
		var p struct {
			Sensor   struct{ ID string } `json:"sensor"`
			Revision int64               `json:"revision"`
		}
		_ = json.Unmarshal(body, &p)
		return key{p.Sensor.ID, p.Revision}
	}
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		at := time.Now()
		k := parse(body)
		mu.Lock()
		hooks[k] = append(hooks[k], at)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(rcv.Close)

	// The clients, their sensors and subscriptions, through the REST API.
	clients := make([]string, watchers)
	var g errgroup.Group
	g.SetLimit(8)
	for i := range watchers {
		g.Go(func() error {
			var c struct{ ID string }
			if st := s.call("POST", "/v1/clients", map[string]any{"name": fmt.Sprintf("w%d", i), "webhook_url": fmt.Sprintf("%s/%d", rcv.URL, i)}, &c); st != 200 {
				return fmt.Errorf("create client %d: %d", i, st)
			}
			sensor := fmt.Sprintf("W%d", i)
			if st := s.call("POST", "/v1/sensors", map[string]any{"id": sensor, "address": "Door " + sensor}, nil); st != 200 {
				return fmt.Errorf("create sensor %s: %d", sensor, st)
			}
			if st := s.call("PUT", "/v1/sensors/"+sensor+"/clients/"+c.ID, map[string]any{}, nil); st != 200 {
				return fmt.Errorf("subscribe %s: %d", sensor, st)
			}
			clients[i] = c.ID
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}

	// The watchers: one gRPC stream per client, 50 per connection (the server allows
	// api.MaxConcurrentStreams on one).
	var conns []*grpc.ClientConn
	for range (watchers + 49) / 50 {
		c, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	wctx, stop := context.WithCancel(metadata.AppendToOutgoingContext(b.Context(), "authorization", "Bearer "+s.token))
	defer stop()
	var open sync.WaitGroup
	for i, client := range clients {
		if !watch {
			break
		}
		stream, err := locksv1.NewClientEventServiceClient(conns[i%len(conns)]).WatchClientEvents(wctx,
			&locksv1.WatchClientEventsRequest{ClientId: client})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := stream.Header(); err != nil {
			b.Fatal(err)
		}
		sensor := fmt.Sprintf("W%d", i)
		open.Add(1)
		go func() {
			defer open.Done()
			for {
				m, err := stream.Recv()
				if err != nil {
					return
				}
				at := time.Now()
				k := parse(m.GetEvent())
				mu.Lock()
				if k.sensor != sensor {
					wrongClient++
				}
				watched[k] = append(watched[k], at)
				mu.Unlock()
			}
		}()
	}

	ch, err := s.rabbit.Conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	load1 := loadAverage()
	cpu := testenv.StartCPU(s.components())
	machine0 := testenv.MachineCPU()
	held := sampleOpenTransactions(b, s.pgURL)
	horizons := sampleHorizons(b, s.pgURL)
	var prof func() (*profile.Profile, error)
	if os.Getenv("LOCKS_BENCH_CPUPROFILE") != "" {
		prof = s.cpuProfile(b.Context(), dur)
	}
	published := map[key]time.Time{}
	revs := make([]int64, watchers)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	begin := time.Now()
	n := 0
	b.ResetTimer()
	for time.Since(begin) < dur {
		<-tick.C
		// As many as are due by now: a late tick does not lower the rate.
		for range int(time.Since(begin).Seconds()*float64(rate)) - n {
			i := n % watchers
			n++
			revs[i]++
			sensor := fmt.Sprintf("W%d", i)
			body := fmt.Sprintf(`{"sensor_id":%q,"data":%d}`, sensor, revs[i]%2)
			published[key{sensor, revs[i]}] = time.Now()
			if err := ch.PublishWithContext(b.Context(), "", s.rabbit.Queue, false, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: []byte(body)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	elapsed := time.Since(begin)
	deadline := time.Now().Add(120 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		k, h := len(watched), len(hooks)
		mu.Unlock()
		if (k >= len(published) || !watch) && h >= len(published) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.StopTimer()
	load2 := loadAverage()
	use := cpu.Stop()
	busy := (testenv.MachineCPU() - machine0) / time.Since(cpu.Start).Seconds()
	stop()
	open.Wait()
	if prof != nil {
		p, err := prof()
		if err != nil {
			b.Fatalf("CPU profile: %v", err)
		}
		saveProfile(b, p)
	}
	rows := deliveryRows(b, s.pgURL)
	openTx := held()
	hz := horizons()

	mu.Lock()
	defer mu.Unlock()
	var watchLat, hookLat, rowLat, rowWatch, rowHook []time.Duration
	var ingestTx, toHorizon, toXmin, horizonToWatch []time.Duration // the watch's way from the row
	missing, doubled, hooksMissing := 0, 0, 0
	for k, at := range published {
		row, hasRow := rows[deliveryKey{k.sensor, k.rev}]
		if hasRow {
			rowLat = append(rowLat, row.created.Sub(at))
		}
		switch arr := watched[k]; {
		case len(arr) == 0:
			missing++
		default:
			if len(arr) > 1 {
				doubled++
			}
			watchLat = append(watchLat, arr[0].Sub(at))
			if !hasRow {
				break
			}
			rowWatch = append(rowWatch, arr[0].Sub(row.created))
			committed, ok1 := hz.commit[row.xid]
			below, ok2 := hz.passed(hz.db, row.xid)
			belowXmin, ok3 := hz.passed(hz.xmin, row.xid)
			if ok1 && ok2 && ok3 {
				ingestTx = append(ingestTx, committed.Sub(row.created))
				toHorizon = append(toHorizon, below.Sub(committed))
				toXmin = append(toXmin, belowXmin.Sub(committed))
				horizonToWatch = append(horizonToWatch, arr[0].Sub(below))
			}
		}
		if arr := hooks[k]; len(arr) > 0 {
			hookLat = append(hookLat, arr[0].Sub(at))
			if hasRow {
				rowHook = append(rowHook, arr[0].Sub(row.created))
			}
		} else {
			hooksMissing++ // superseded while waiting, or not delivered within the wait
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	wp50, wp99, wmax := percentiles(watchLat)
	hp50, hp99, hmax := percentiles(hookLat)
	b.ReportMetric(ms(wp50), "watch-p50-ms")
	b.ReportMetric(ms(wp99), "watch-p99-ms")
	b.ReportMetric(ms(wmax), "watch-max-ms")
	b.ReportMetric(ms(hp50), "webhook-p50-ms")
	b.ReportMetric(ms(hp99), "webhook-p99-ms")
	b.ReportMetric(ms(hmax), "webhook-max-ms")
	b.ReportMetric(float64(len(published))/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(watchers), "watchers")
	b.ReportMetric(float64(missing), "missing")
	b.ReportMetric(float64(doubled), "doubled")
	b.Logf("%d watchers, %d state changes in %s (%.0f/s), load average %s → %s: publish→watch p50 %.0f ms, p99 %.0f ms, max %.0f ms; "+
		"publish→webhook p50 %.0f ms, p99 %.0f ms, max %.0f ms; watch missing %d, doubled %d, on another client's watch %d; webhooks not received %d",
		watchers, len(published), elapsed.Round(time.Millisecond), float64(len(published))/elapsed.Seconds(), load1, load2,
		ms(wp50), ms(wp99), ms(wmax), ms(hp50), ms(hp99), ms(hmax), missing, doubled, wrongClient, hooksMissing)
	// Where the time went: publish → delivery row → watch or webhook, each hop of the way.
	rp50, rp99, _ := percentiles(rowLat)
	rwp50, rwp99, _ := percentiles(rowWatch)
	rhp50, rhp99, _ := percentiles(rowHook)
	b.ReportMetric(ms(rp99), "row-p99-ms")
	b.ReportMetric(ms(rwp99), "row-watch-p99-ms")
	b.ReportMetric(ms(rhp99), "row-webhook-p99-ms")
	b.Logf("split at the delivery row (its created_at, %d of %d rows found): publish→row p50 %.0f ms, p99 %.0f ms; row→watch p50 %.0f ms, p99 %.0f ms; row→webhook p50 %.0f ms, p99 %.0f ms",
		len(rowLat), len(published), ms(rp50), ms(rp99), ms(rwp50), ms(rwp99), ms(rhp50), ms(rhp99))
	pq := func(l []time.Duration) string {
		p50, p99, _ := percentiles(l)
		return fmt.Sprintf("%.0f/%.0f", ms(p50), ms(p99))
	}
	b.Logf("the watch's way from the row, p50/p99 ms (%d events, Postgres sampled every %s): ingest transaction (created_at → committed) %s; "+
		"committed → below the feed's horizon %s (below the server's xmin %s); below the horizon → at the watcher %s",
		len(ingestTx), horizonSampling, pq(ingestTx), pq(toHorizon), pq(toXmin), pq(horizonToWatch))
	url := "http://" + s.http + "/metrics"
	q50, err50 := stageQuantiles(url, 0.5)
	q99, err99 := stageQuantiles(url, 0.99)
	if err := errors.Join(err50, err99); err != nil {
		b.Logf("no stage split: %v", err)
	} else {
		var line strings.Builder
		for _, st := range []string{"sensor", "append", "state", "relay", "intake", "claim", "attempt", "finish"} {
			fmt.Fprintf(&line, " %s %.0f/%.0f", st, q50[st]*1000, q99[st]*1000)
		}
		b.Logf("hops, p50/p99 ms (locks_stage_seconds):%s", line.String())
	}
	b.Logf("%s", openTx)
	var cpuLine strings.Builder
	for _, u := range use {
		b.ReportMetric(u.Percent, u.Name+"-cpu%")
		fmt.Fprintf(&cpuLine, ", %s %.0f%%", u.Name, u.Percent)
	}
	b.ReportMetric(100*busy, "machine-cpu%")
	b.Logf("CPU over the run, %% of one core: machine %.0f%% of %d cores (every process, anyone's)%s", 100*busy, runtime.NumCPU(), cpuLine.String())
	if !watch {
		b.Logf("no watch opened (LOCKS_BENCH_WATCH=0): webhook figures only")
		return
	}
	if missing > 0 || doubled > 0 || wrongClient > 0 {
		b.Fatalf("%d events missing from their watch, %d doubled, %d on another client's watch", missing, doubled, wrongClient)
	}
}

// percentiles are the 50th and 99th percentiles and the maximum of lat (sorted in place).
func percentiles(lat []time.Duration) (p50, p99, maxLat time.Duration) {
	if len(lat) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lat)
	at := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return at(.50), at(.99), lat[len(lat)-1]
}

// sampleOpenTransactions samples, every 50 ms until the returned function is called, the age
// of the oldest open write transaction of the database at pgURL (not the sampler's): a
// delivery row is in the feed only once the transactions that began before it have ended, so
// this is what the feed's horizon waits for. The function says its p50, p99 and max, and
// which statements such a transaction was running most often.
func sampleOpenTransactions(b *testing.B, pgURL string) (stop func() string) {
	var ages []time.Duration
	what := map[string]int{}
	wait := samplePostgres(b, pgURL, 50*time.Millisecond, func(ctx context.Context, pool *pgxpool.Pool) {
		var age time.Duration
		var query string
		err := pool.QueryRow(ctx, `SELECT coalesce(now() - xact_start, '0'), coalesce(left(regexp_replace(query, '\s+', ' ', 'g'), 60), '')
			FROM pg_stat_activity WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
			ORDER BY xact_start LIMIT 1`).Scan(&age, &query)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			ages = append(ages, 0)
		case err == nil:
			ages = append(ages, age)
			what[query]++
		}
	})
	return func() string {
		wait()
		p50, p99, mx := percentiles(ages)
		type q struct {
			text string
			n    int
		}
		var qs []q
		for k, n := range what {
			qs = append(qs, q{k, n})
		}
		slices.SortFunc(qs, func(a, b q) int { return b.n - a.n })
		var top strings.Builder
		for _, x := range qs[:min(3, len(qs))] {
			fmt.Fprintf(&top, "; %d%% %q", 100*x.n/max(1, len(ages)), x.text)
		}
		return fmt.Sprintf("oldest open write transaction of the database (%d samples): p50 %.0f ms, p99 %.0f ms, max %.0f ms; running%s",
			len(ages), float64(p50.Microseconds())/1000, float64(p99.Microseconds())/1000, float64(mx.Microseconds())/1000, top.String())
	}
}

// samplePostgres calls sample with a pool on the database at pgURL every interval, in a
// goroutine of its own, until the returned function is called; that returns once it stopped.
func samplePostgres(b *testing.B, pgURL string, every time.Duration, sample func(context.Context, *pgxpool.Pool)) (stop func()) {
	pool, err := pgxpool.New(b.Context(), pgURL)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer pool.Close()
		t := time.NewTicker(every)
		defer t.Stop()
		for ctx.Err() == nil {
			sample(ctx, pool)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

type deliveryKey struct {
	sensor string
	rev    int64
}

// deliveryRow is what the benchmark reads of a delivery row: its created_at (the notifier's
// intake transaction's start) and that transaction's id.
type deliveryRow struct {
	created time.Time
	xid     uint64
}

// deliveryRows are every delivery row, by sensor and revision.
func deliveryRows(b *testing.B, pgURL string) map[deliveryKey]deliveryRow {
	pool, err := pgxpool.New(b.Context(), pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(b.Context(), `SELECT sensor_id, revision, created_at, ingest_xid::text FROM notifier_deliveries`)
	if err != nil {
		b.Fatal(err)
	}
	out := map[deliveryKey]deliveryRow{}
	var k deliveryKey
	var r deliveryRow
	var xid string
	if _, err := pgx.ForEachRow(rows, []any{&k.sensor, &k.rev, &r.created, &xid}, func() error {
		r.xid, err = strconv.ParseUint(xid, 10, 64)
		out[k] = r
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return out
}

// horizonSampling is how often sampleHorizons asks Postgres.
const horizonSampling = 25 * time.Millisecond

// horizonSample is a horizon (a transaction id) and when Postgres said it.
type horizonSample struct {
	at time.Time
	h  uint64
}

// horizonSamples say when each intake transaction committed (first seen: within a sampling
// interval after) and when its rows went below the feed's horizon and the server's xmin.
type horizonSamples struct {
	commit   map[uint64]time.Time
	db, xmin []horizonSample // in time order, horizons made non-decreasing
}

// passed is when the horizon in samples first went past xid.
func (hs horizonSamples) passed(samples []horizonSample, xid uint64) (time.Time, bool) {
	i := sort.Search(len(samples), func(i int) bool { return samples[i].h > xid })
	if i == len(samples) {
		return time.Time{}, false
	}
	return samples[i].at, true
}

// sampleHorizons asks Postgres, every horizonSampling until the returned function is called,
// for the feed's horizon (api.FeedHorizon), the server's xmin and the intake transactions
// whose rows are visible (committed) at or above the last horizon, all in one snapshot.
func sampleHorizons(b *testing.B, pgURL string) (stop func() horizonSamples) {
	out := horizonSamples{commit: map[uint64]time.Time{}}
	floor := "0"
	add := func(l []horizonSample, at time.Time, v string) []horizonSample {
		n, _ := strconv.ParseUint(v, 10, 64)
		if len(l) > 0 {
			n = max(n, l[len(l)-1].h)
		}
		return append(l, horizonSample{at, n})
	}
	wait := samplePostgres(b, pgURL, horizonSampling, func(ctx context.Context, pool *pgxpool.Pool) {
		var at time.Time
		var xmin, h string
		var xids []string
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp(), pg_snapshot_xmin(pg_current_snapshot())::text, `+api.FeedHorizon+`::text,
			ARRAY(SELECT DISTINCT ingest_xid::text FROM notifier_deliveries WHERE ingest_xid >= $1::text::xid8)`, floor).Scan(&at, &xmin, &h, &xids); err != nil {
			return
		}
		for _, x := range xids {
			n, _ := strconv.ParseUint(x, 10, 64)
			if _, ok := out.commit[n]; !ok {
				out.commit[n] = at
			}
		}
		out.db, out.xmin = add(out.db, at, h), add(out.xmin, at, xmin)
		floor = strconv.FormatUint(out.db[len(out.db)-1].h, 10) // below it, every committed one was seen
	})
	return func() horizonSamples { wait(); return out }
}

// loadAverage is the machine's 1-minute load average, as /proc/loadavg says ("?" elsewhere).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// benchEnvInt is the integer in the environment variable name, or def.
func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q is not a positive integer", name, v)
	}
	return n
}
