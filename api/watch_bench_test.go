package api

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// BenchmarkWatchers opens LOCKS_BENCH_WATCHERS (default 1000) gRPC event watches on one API
// process, one per client (50 a connection), then commits delivery rows, as the notifier does, at
// LOCKS_BENCH_RATE (default 1000/s) for LOCKS_BENCH_DURATION (default 5s), in batches every
// 10 ms spread over the clients, and reports the latency from a row's commit to its arrival
// at its watcher. Every event must arrive once at its client's watcher ("missing" and
// "doubled" count the others). The notifier is not in this run: the time from a state change
// to the delivery row is the webhook pipeline's, measured by its own benchmarks.
//
//	go test -run '^$' -bench BenchmarkWatchers -benchtime 1x ./api/
func BenchmarkWatchers(b *testing.B) {
	watchers := envInt(b, "LOCKS_BENCH_WATCHERS", 1000)
	rate := envInt(b, "LOCKS_BENCH_RATE", 1000)
	dur := envDuration(b, "LOCKS_BENCH_DURATION", 5*time.Second)
	e := newEnv(b, withStderrLog())
	ctx := b.Context()
	if _, err := e.db.Exec(ctx, `INSERT INTO clients (id, name, webhook_url, signing_secret)
		SELECT 'cl_bench' || g, 'bench', 'https://example.com/', 'whsec_AAAA' FROM generate_series(0, $1 - 1) g`, watchers); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]time.Time{} // event id → arrival times
	var conns []*grpc.ClientConn
	for range (watchers + 49) / 50 { // the server allows MaxConcurrentStreams on one connection
		c, err := grpc.NewClient(e.raw.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	wctx, stop := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken))
	defer stop()
	var open sync.WaitGroup
	for i := range watchers {
		stream, err := locksv1.NewClientEventServiceClient(conns[i%len(conns)]).WatchClientEvents(wctx,
			&locksv1.WatchClientEventsRequest{ClientId: fmt.Sprintf("cl_bench%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := stream.Header(); err != nil {
			b.Fatal(err)
		}
		open.Add(1)
		go func() {
			defer open.Done()
			for {
				m, err := stream.Recv()
				if err != nil {
					return
				}
				at := time.Now()
				var body struct {
					ID string `json:"id"`
				}
				_ = json.Unmarshal(m.GetEvent(), &body)
				mu.Lock()
				got[body.ID] = append(got[body.ID], at)
				mu.Unlock()
			}
		}()
	}

	committed := map[string]time.Time{}
	xacts := func() int64 {
		var n int64
		if err := e.db.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	xact0, cpu0 := xacts(), testenv.SelfCPU()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	n := 0
	b.ResetTimer()
	for time.Since(start) < dur {
		<-tick.C
		var ids, clients, sensors []string
		var revs []int64
		var payloads [][]byte
		// As many as are due by now: a late tick does not lower the rate.
		due := int(time.Since(start).Seconds()*float64(rate)) - n
		for range due {
			n++
			sensor := fmt.Sprintf("B%d", n%watchers)
			ev := feedEvent(sensor, int64(n))
			ev.Type = event.TypeStateChanged
			p, err := json.Marshal(ev)
			if err != nil {
				b.Fatal(err)
			}
			ids, clients, sensors, revs, payloads = append(ids, ev.ID), append(clients, fmt.Sprintf("cl_bench%d", n%watchers)),
				append(sensors, sensor), append(revs, int64(n)), append(payloads, p)
		}
		if len(ids) == 0 {
			continue
		}
		if _, err := e.db.Exec(ctx, `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state)
			SELECT e, c, s, r, p, 'pending' FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bytea[]) AS u(e, c, s, r, p)`,
			ids, clients, sensors, revs, payloads); err != nil {
			b.Fatal(err)
		}
		at := time.Now()
		for _, id := range ids {
			committed[id] = at
		}
	}
	elapsed := time.Since(start)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		k := len(got)
		mu.Unlock()
		if k >= len(committed) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.StopTimer()
	cpu := testenv.SelfCPU() - cpu0
	time.Sleep(time.Second) // pg_stat_database is updated about every second
	xact := xacts() - xact0
	stop()
	open.Wait()

	var lat []time.Duration
	missing, doubled := 0, 0
	for id, at := range committed {
		arr := got[id]
		switch {
		case len(arr) == 0:
			missing++
			continue
		case len(arr) > 1:
			doubled++
		}
		lat = append(lat, arr[0].Sub(at))
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(pct(0.50)), "p50-ms")
	b.ReportMetric(ms(pct(0.99)), "p99-ms")
	b.ReportMetric(ms(pct(1)), "max-ms")
	b.ReportMetric(float64(len(committed))/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(watchers), "watchers")
	b.ReportMetric(float64(missing), "missing")
	b.ReportMetric(float64(doubled), "doubled")
	perEvent := float64(len(committed))
	b.ReportMetric(float64(cpu.Microseconds())/perEvent, "process-cpu-µs/event")
	b.ReportMetric(float64(xact)/perEvent, "db-xacts/event")
	b.Logf("cost: this process %.0f µs CPU per event (%.0f%% of one core), the database %.2f transactions per event; load average %s",
		float64(cpu.Microseconds())/perEvent, 100*cpu.Seconds()/elapsed.Seconds(), float64(xact)/perEvent, loadavg())
	b.Logf("%d watchers, %d events in %s (%.0f/s): commit to watch p50 %.1f ms, p99 %.1f ms, max %.1f ms; missing %d, doubled %d",
		watchers, len(committed), elapsed.Round(time.Millisecond), float64(len(committed))/elapsed.Seconds(),
		ms(pct(.5)), ms(pct(.99)), ms(pct(1)), missing, doubled)
	if missing > 0 || doubled > 0 {
		b.Fatalf("%d events missing, %d doubled", missing, doubled)
	}
}

// loadavg is the machine's 1-minute load average ("?" where /proc cannot tell).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
