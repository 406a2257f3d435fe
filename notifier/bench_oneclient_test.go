package notifier

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// BenchmarkOneClient measures webhooks per second to one client with a fast local receiver:
// 2,000 sensors, 5 revisions each (10,000 events per iteration), from the first EVENTS append
// to the last receipt, with the books checked (every event received once, each sensor's
// revisions in order). In the same run, "baseline" is a bare HTTP client posting the same
// signed bodies to the same receiver with the endpoint's largest concurrency, as fast as it
// can; pg_round_trips/webhook counts the notifier's Postgres statements (BEGIN and COMMIT
// included) per delivery, through a tracer on its pool. pg_cpu_us/webhook is the CPU time of
// the test database's backends per delivery (from /proc: a local Postgres on Linux) and
// go_cpu_us/webhook that of this process (notifier, receiver, embedded NATS): on a machine
// shared with other work they vary far less than webhooks/s.
func BenchmarkOneClient(b *testing.B) {
	const sensors, revisions = 2000, 5
	e := newEnv(b, time.Second)
	rc := newBooksReceiver()
	srv := httptest.NewServer(rc)
	b.Cleanup(srv.Close)
	secret := e.client("c1", srv.URL)
	e.exec(`INSERT INTO sensors (id, address) SELECT 's' || i, 'address ' || i FROM generate_series(1, $1::int) i`, sensors)
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT 'c1', id FROM sensors`)
	e.exec(`INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
		SELECT id, 0, 0, now(), now(), now(), 1000000, 'online', 0 FROM sensors`)
	var trips atomic.Int64
	tc := tripCounter{n: &trips, mu: &sync.Mutex{}, by: map[string]*tripStat{}}
	e.pool = tracedPool(b, e.pgURL, tc)
	e.cfg.WebhookTimeout = 5 * time.Second
	n := e.start()

	b.Run("notifier", func(b *testing.B) {
		var rev int64
		total, el := 0, time.Duration(0)
		trips0 := trips.Load()
		cpu0, ru0 := backendCPU(b, e.pool), testenv.SelfCPU()
		for i := 0; i < b.N; i++ {
			evs := make([]event.Event, 0, sensors*revisions)
			for r := 0; r < revisions; r++ {
				rev++
				for s := 1; s <= sensors; s++ {
					evs = append(evs, testEvent(fmt.Sprintf("s%d", s), rev, uint8(rev%2)))
				}
			}
			rc.reset()
			start := time.Now()
			publishEvents(b, e.nats.JS, evs)
			testenv.Eventually(b, 5*time.Minute, "webhooks", func() bool { return rc.count() >= len(evs) })
			el += time.Since(start)
			total += len(evs)
			rc.check(b, evs)
		}
		b.ReportMetric(float64(total)/el.Seconds(), "webhooks/s")
		b.ReportMetric(float64(trips.Load()-trips0)/float64(total), "pg_round_trips/webhook")
		if cpu1 := backendCPU(b, e.pool); cpu0 != nil && cpu1 != nil {
			var sum time.Duration
			for pid, t := range cpu1 {
				sum += t - cpu0[pid]
			}
			b.ReportMetric(float64(sum.Microseconds())/float64(total), "pg_cpu_us/webhook")
		}
		b.ReportMetric(float64((testenv.SelfCPU()-ru0).Microseconds())/float64(total), "go_cpu_us/webhook")
		tc.log(b)
		// Whether the adaptive limit held up under the machine's load (issue 17 suspected not).
		n.ep.mu.Lock()
		if ep := n.ep.m["c1"]; ep != nil {
			b.Logf("endpoint limit at the end: %d (starts at %d, cap %d), queued %d", ep.limit, n.cfg.PerEndpoint, maxPerEndpoint, len(ep.queue))
		}
		n.ep.mu.Unlock()
		b.Logf("attempt latency: %s", attemptLatency(b, e))
	})

	b.Run("baseline", func(b *testing.B) {
		s := Secrets{Current: secret}
		total, el := 0, time.Duration(0)
		for i := 0; i < b.N; i++ {
			type req struct {
				id   string
				body []byte
			}
			var reqs []req
			for r := int64(1); r <= revisions; r++ {
				for s := 1; s <= sensors; s++ {
					ev := testEvent(fmt.Sprintf("s%d", s), 1000+int64(i)*revisions+r, uint8(r%2))
					body, err := Body(ev, "address")
					if err != nil {
						b.Fatal(err)
					}
					reqs = append(reqs, req{ev.ID, body})
				}
			}
			rc.reset()
			cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: maxPerEndpoint}}
			work := make(chan req)
			var wg sync.WaitGroup
			start := time.Now()
			for range maxPerEndpoint {
				wg.Go(func() {
					for q := range work {
						h, err := Headers(s, q.id, time.Now(), q.body)
						if err != nil {
							b.Error(err)
							return
						}
						rq, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(string(q.body)))
						rq.Header = h
						resp, err := cl.Do(rq)
						if err != nil {
							b.Error(err)
							return
						}
						resp.Body.Close()
					}
				})
			}
			for _, q := range reqs {
				work <- q
			}
			close(work)
			wg.Wait()
			el += time.Since(start)
			total += len(reqs)
			cl.CloseIdleConnections()
		}
		b.ReportMetric(float64(total)/el.Seconds(), "webhooks/s")
	})
}

// booksReceiver records what a receiver got: each webhook-id's count and every sensor's
// revisions in arrival order.
type booksReceiver struct {
	mu    sync.Mutex
	seen  map[string]int
	revs  map[string][]int64
	total int
}

func newBooksReceiver() *booksReceiver {
	r := &booksReceiver{}
	r.reset()
	return r
}

func (r *booksReceiver) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen, r.revs, r.total = map[string]int{}, map[string][]int64{}, 0
}

func (r *booksReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

func (r *booksReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Sensor   struct{ ID string } `json:"sensor"`
		Revision int64               `json:"revision"`
	}
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.seen[req.Header.Get("webhook-id")]++
	r.revs[body.Sensor.ID] = append(r.revs[body.Sensor.ID], body.Revision)
	r.total++
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// check fails b unless every event of evs was received exactly once and each sensor's
// revisions arrived in increasing order.
func (r *booksReceiver) check(b testing.TB, evs []event.Event) {
	b.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range evs {
		if n := r.seen[ev.ID]; n != 1 {
			b.Fatalf("event %s (sensor %s revision %d) received %d times, want once", ev.ID, ev.SensorID, ev.Revision, n)
		}
	}
	if r.total != len(evs) {
		b.Fatalf("received %d webhooks for %d events", r.total, len(evs))
	}
	for s, revs := range r.revs {
		if !sort.SliceIsSorted(revs, func(i, j int) bool { return revs[i] < revs[j] }) {
			b.Fatalf("sensor %s: revisions arrived as %v", s, revs)
		}
	}
}

// publishEvents appends evs to EVENTS as the state projector's relay does (the sensors'
// state is already at or past their revisions).
func publishEvents(b testing.TB, js jetstream.JetStream, evs []event.Event) {
	b.Helper()
	// In chunks: nats.go stalls beyond its limit of outstanding asynchronous publishes.
	for len(evs) > 0 {
		chunk := evs[:min(len(evs), 1000)]
		evs = evs[len(chunk):]
		futs := make([]jetstream.PubAckFuture, 0, len(chunk))
		for _, ev := range chunk {
			d, err := json.Marshal(ev)
			if err != nil {
				b.Fatal(err)
			}
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: natsx.EventsSubject(partition.Of(ev.SensorID, testPartitions), ev.SensorID), Data: d},
				jetstream.WithMsgID(ev.ID))
			if err != nil {
				b.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			case <-time.After(30 * time.Second):
				b.Fatal("EVENTS publish not acknowledged")
			}
		}
	}
}

// tripCounter counts the statements a pool sends (each one round trip) and, per statement
// (its first words), how many and how long they took, for the profile in the bench's log.
type tripCounter struct {
	n  *atomic.Int64
	mu *sync.Mutex
	by map[string]*tripStat
}

type tripStat struct {
	n    int
	took time.Duration
}

type tripStart struct{}

type tripKey struct {
	sql   string
	start time.Time
}

func (t tripCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return context.WithValue(ctx, tripStart{}, tripKey{d.SQL, time.Now()})
}

func (t tripCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if k, ok := ctx.Value(tripStart{}).(tripKey); ok {
		t.record(k)
	}
}

// A batch is one round trip; it is recorded under its last statement.
func (t tripCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.n.Add(1)
	return context.WithValue(ctx, tripStart{}, &tripKey{start: time.Now()})
}

func (tripCounter) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if k, ok := ctx.Value(tripStart{}).(*tripKey); ok {
		k.sql = "batch: " + d.SQL
	}
}

func (t tripCounter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if k, ok := ctx.Value(tripStart{}).(*tripKey); ok {
		t.record(*k)
	}
}

func (t tripCounter) record(k tripKey) {
	name := strings.Join(strings.Fields(k.sql), " ")
	if len(name) > 70 {
		name = name[:70]
	}
	t.mu.Lock()
	s := t.by[name]
	if s == nil {
		s = &tripStat{}
		t.by[name] = s
	}
	s.n++
	s.took += time.Since(k.start)
	t.mu.Unlock()
}

// log writes the statements that took the most time in all.
func (t tripCounter) log(b testing.TB) {
	t.mu.Lock()
	defer t.mu.Unlock()
	names := make([]string, 0, len(t.by))
	for k := range t.by {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return t.by[names[i]].took > t.by[names[j]].took })
	for i, k := range names {
		if i == 12 {
			break
		}
		s := t.by[k]
		b.Logf("%8d × %9.2fms = %8.0fms  %s", s.n, float64(s.took.Microseconds())/1000/float64(s.n), float64(s.took.Milliseconds()), k)
	}
}

// tracedPool is a pool of url whose statements tc counts.
func tracedPool(b testing.TB, url string, tc tripCounter) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tc
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// attemptLatency summarises locks_notifier_attempt_duration_seconds of 2xx answers.
func attemptLatency(b testing.TB, e *env) string {
	mfs, err := e.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "locks_notifier_attempt_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h.GetSampleCount() == 0 {
				continue
			}
			out := fmt.Sprintf("%d answers %s, mean %.1f ms;", h.GetSampleCount(), m.GetLabel()[0].GetValue(),
				1000*h.GetSampleSum()/float64(h.GetSampleCount()))
			for _, bk := range h.GetBucket() {
				out += fmt.Sprintf(" ≤%gs: %d", bk.GetUpperBound(), bk.GetCumulativeCount())
			}
			return out
		}
	}
	return "none"
}

// backendCPU is the CPU time used so far by each backend connected to pool's database, by
// pid, from /proc; nil where that cannot be read (not Linux, or Postgres elsewhere).
func backendCPU(b testing.TB, pool *pgxpool.Pool) map[int32]time.Duration {
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	out := map[int32]time.Duration{}
	for _, pid := range pids {
		sec, ok := testenv.ProcCPU(int(pid))
		if !ok {
			return nil
		}
		out[pid] = time.Duration(sec * float64(time.Second))
	}
	return out
}
