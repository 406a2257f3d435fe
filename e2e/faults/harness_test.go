package faults_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/deploy/cluster"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// The load of every scenario: a modest fleet with webhooks, as the "Must show" asks.
const (
	sensors    = 200
	rate       = 300 // readings/s
	partitions = 8
	token      = "faults-token-0123456789"
	// maxStall is the longest the committed readings or the webhooks may stand still.
	maxStall = 10 * time.Second
	// settle bounds the wait, after the load, for the last readings and webhooks.
	settle = 2 * time.Minute
)

// requireFaults skips the suite unless LOCKS_FAULTS=1: it takes minutes and runs as its own
// task, never inside `go tool task test`.
func requireFaults(t *testing.T) {
	t.Helper()
	if os.Getenv("LOCKS_FAULTS") != "1" {
		t.Skip("the fault suite runs with LOCKS_FAULTS=1: go tool task faults")
	}
}

var (
	binOnce              sync.Once
	locksBin, nodeBin    string
	binErr               error
	binDir, _            = os.MkdirTemp("", "locks-faults-bin")
	repoRoot, repoRootEr = filepath.Abs("../..")
)

// bins builds the locks binary and natsnode once per test binary.
func bins(t testing.TB) (string, string) {
	t.Helper()
	binOnce.Do(func() {
		if repoRootEr != nil {
			binErr = repoRootEr
			return
		}
		locksBin, nodeBin = filepath.Join(binDir, "locks"), filepath.Join(binDir, "natsnode")
		for out, pkg := range map[string]string{locksBin: "../../cmd/locks", nodeBin: "../../deploy/cluster/natsnode"} {
			if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
				binErr = fmt.Errorf("go build %s: %v: %s", pkg, err, b)
				return
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return locksBin, nodeBin
}

// servers are where a run's databases and queue are.
type servers struct {
	pgURL, chAddr, amqpURL, queue string
	chDB                          string // the ClickHouse database; a fresh one of the test's when empty
}

// localServers are the machine's shared servers, with a database and queue of t's own.
func localServers(t testing.TB) servers {
	rabbit := testenv.RabbitMQ(t)
	return servers{pgURL: testenv.PostgresURL(t), chAddr: testenv.ClickHouseAddr(), amqpURL: rabbit.URL, queue: rabbit.Queue}
}

// run is one scenario: the cluster, the load on it, and the samples taken while it runs.
type run struct {
	t     *testing.T
	c     *cluster.Cluster
	out   *testenv.LogBuffer
	srv   servers
	pg    *pgxpool.Pool
	js    jetstream.JetStream // as the admin user
	rcv   *loadgen.Receiver
	rec   *loadgen.Recorder
	books chan booksResult
	// checkStalls fails the run on a stall over maxStall (true unless a scenario pauses the load).
	checkStalls bool
	// duplicatesOK counts webhooks received twice with one webhook-id instead of failing on
	// them: only where a process dies with a webhook in flight.
	duplicatesOK bool
	// lostAfter is LOCKS_LOST_AFTER; silent says the load has sensors that go silent, each of
	// which must be declared lost exactly once before finish returns.
	lostAfter time.Duration
	silent    bool

	mu      sync.Mutex
	samples []sample
}

type booksResult struct {
	b   loadgen.Books
	err error
}

// sample is what the sampler saw at one instant.
type sample struct {
	at        time.Time
	committed time.Time // newest reading committed to sensor_state (its ts)
	webhooks  int64     // distinct webhooks received
}

// clusterConfig is the topology of the suite on srv: R3 streams, state sharing partitions by
// leases, webhooks to private addresses allowed and retried soon, a ClickHouse database of tb's.
func clusterConfig(tb testing.TB, srv servers, out *testenv.LogBuffer, extraEnv ...string) cluster.Config {
	locks, node := bins(tb)
	chDB := srv.chDB
	if chDB == "" {
		chDB = testenv.Name("locks_faults")
		tb.Cleanup(func() { testenv.DropClickHouseDatabase(tb, chDB) })
	}
	return cluster.Config{
		Dir: tb.TempDir(), LocksBin: locks, NodeBin: node, Accounts: cluster.Accounts(repoRoot), Out: out,
		// As TestClusterSmoke: fsync every second, not every write, on a shared 2-core machine.
		Sync: "1s", Replicas: 3, Partitions: "auto",
		Env: append([]string{
			"LOCKS_POSTGRES_URL=" + srv.pgURL,
			"LOCKS_CLICKHOUSE_URL=clickhouse://" + srv.chAddr + "/" + chDB,
			"LOCKS_AMQP_URL=" + srv.amqpURL, "LOCKS_AMQP_QUEUE=" + srv.queue,
			"LOCKS_API_TOKENS=" + token, fmt.Sprintf("LOCKS_PARTITIONS=%d", partitions),
			"LOCKS_WEBHOOK_ALLOW_PRIVATE=true", "LOCKS_RETRY_SCHEDULE=500ms,1s,2s,5s,10s,30s",
		}, extraEnv...),
	}
}

// startRun starts the cluster (R3 streams, state sharing partitions by leases), registers
// the fleet with a webhook receiver, starts the load for dur and samples every second.
func startRun(t *testing.T, srv servers, dur time.Duration, extraEnv ...string) *run {
	return startLoad(t, srv, load{dur: dur, env: extraEnv})
}

// load is what a scenario runs: the load's duration, the share of its sensors that send one
// reading and then fall silent, LOCKS_LOST_AFTER (1 h when zero) and more LOCKS_* for the parts.
type load struct {
	dur         time.Duration
	silentRatio float64
	lostAfter   time.Duration
	env         []string
}

// startLoad is startRun with a load of the scenario's own.
func startLoad(t *testing.T, srv servers, l load) *run {
	r := &run{t: t, out: &testenv.LogBuffer{}, srv: srv, books: make(chan booksResult, 1), checkStalls: true,
		lostAfter: cmp.Or(l.lostAfter, time.Hour), silent: l.silentRatio > 0}
	extraEnv := append(slices.Clone(l.env), "LOCKS_LOST_AFTER="+r.lostAfter.String())
	c, err := cluster.Start(t.Context(), clusterConfig(t, srv, r.out, extraEnv...))
	if err != nil {
		t.Fatalf("%v\n%s", err, r.out.String())
	}
	r.c = c
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			t.Logf("cluster output:\n%s", r.out.String())
		}
	})
	if r.pg, err = pgxpool.New(t.Context(), srv.pgURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pg.Close)
	nc, err := nats.Connect(c.NATSURL(cluster.AdminUser), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}

	if r.rcv, err = loadgen.NewReceiver("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.rcv.Close() })
	if err := r.rcv.Register(t.Context(), "http://"+c.Of("api")[0].HTTPAddr, token, "fa", sensors); err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, p := range c.Of("bridge") {
		urls = append(urls, "http://"+p.HTTPAddr+"/metrics")
	}
	if r.rec, err = loadgen.NewRecorder(t.Context(), urls); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	t.Cleanup(func() { stop(); <-sampled })
	go func() { defer close(sampled); r.sample(ctx) }()
	go func() {
		b, err := loadgen.Run(t.Context(), loadgen.Config{AMQPURL: srv.amqpURL, Queue: srv.queue, Sensors: sensors, Rate: rate,
			ChangeRatio: 0.2, SilentRatio: l.silentRatio, Duration: l.dur, Prefix: "fa", Seed: 15}, nil, testenv.Logger(t))
		r.books <- booksResult{b, err}
	}()
	return r
}

// sample records the newest committed reading and the webhooks received, every second.
func (r *run) sample(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
		var newest time.Time
		// A failed query (Postgres restarting) keeps the last value: a stall, as it should.
		if err := r.pg.QueryRow(qctx, "SELECT coalesce(max(last_reading_time), 'epoch') FROM sensor_state").Scan(&newest); err == nil {
			last = newest
		}
		cancel()
		got, _ := r.rcv.Counts()
		r.mu.Lock()
		r.samples = append(r.samples, sample{at: time.Now(), committed: last, webhooks: got})
		r.mu.Unlock()
	}
}

// warm waits until readings are committed and webhooks arrive, so a fault hits a running flow.
func (r *run) warm() {
	testenv.Eventually(r.t, 2*time.Minute, "readings committed and webhooks received", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		n := len(r.samples)
		return n > 3 && r.samples[n-1].webhooks > r.samples[n-3].webhooks && r.samples[n-1].committed.After(r.samples[n-3].committed)
	})
}

// result is what a scenario reports.
type result struct {
	books                  loadgen.Books
	stateStall, hooksStall time.Duration
	events                 int
	duplicates             int64 // webhooks received again with the same webhook-id
}

// finish waits for the load to end and the system to catch up, then checks the books (every
// valid reading recorded once, every change delivered once), the revisions (gapless, none
// repeated, in EVENTS and sensor_state) and the stalls while the load ran.
func (r *run) finish() result {
	t := r.t
	var br booksResult
	select {
	case br = <-r.books:
	case <-t.Context().Done():
		t.Fatal("the test ended before the load")
	}
	if br.err != nil {
		t.Fatalf("loadgen: %v", br.err)
	}
	b := br.b
	var rec loadgen.Recorded
	caught := func() bool {
		var err error
		rec, err = r.rec.Read(t.Context())
		tally := r.rcv.Tally()
		for _, id := range b.Silent {
			if r.silent && tally.Lost[id] == 0 {
				return false
			}
		}
		return err == nil && rec.Recorded+rec.Invalid >= b.Published && tally.ByType["sensor.state_changed"] >= b.Changes
	}
	deadline := time.Now().Add(settle)
	for !caught() && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
	}
	// A little longer: a duplicate webhook or reading would arrive after the count is reached.
	time.Sleep(3 * time.Second)
	rec, err := r.rec.Read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tally := r.rcv.Tally()
	for _, p := range loadgen.Balance(b, rec) {
		t.Errorf("books: %s", p)
	}
	// A connection_lost of a sensor still fed is a false alarm; with silent sensors, each of
	// them is lost exactly once.
	problems := loadgen.Check(b, tally, r.lostAfter, r.silent)
	if r.duplicatesOK {
		problems = slices.DeleteFunc(problems, func(p string) bool { return strings.HasSuffix(p, "duplicate deliveries (same webhook-id)") })
	}
	if tally.OutOfOrder > 0 {
		problems = append(problems, fmt.Sprintf("%d webhooks of a revision older than one already received for their sensor", tally.OutOfOrder))
	}
	if len(problems) > 0 {
		for _, p := range problems {
			t.Errorf("webhooks: %s", p)
		}
		r.explainMissing()
	}
	res := result{books: b, duplicates: tally.Duplicates}
	res.stateStall, res.hooksStall = r.stalls(b.End)
	if r.checkStalls && res.stateStall > maxStall {
		t.Errorf("committed readings stood still for %s (> %s)", res.stateStall.Round(time.Millisecond), maxStall)
	}
	if r.checkStalls && res.hooksStall > maxStall {
		t.Errorf("webhooks stood still for %s (> %s)", res.hooksStall.Round(time.Millisecond), maxStall)
	}
	r.checkOrder()
	res.events = r.checkRevisions()
	t.Logf("published %d (invalid %d), recorded %d, changes %d, webhooks %d (duplicates %d, lost %d of %d silent sensors), events %d; longest stall: committed %s, webhooks %s",
		b.Published, b.Invalid, rec.Recorded, b.Changes, tally.Received, tally.Duplicates, tally.ByType["sensor.connection_lost"], len(b.Silent),
		res.events, res.stateStall.Round(time.Second), res.hooksStall.Round(time.Second))
	return res
}

// stalls are the longest spans between two samples at which the newest committed reading,
// and the webhooks received, moved on; from their first move until the first move at or
// after end (the load's end: nothing moves once everything is in).
func (r *run) stalls(end time.Time) (state, hooks time.Duration) {
	return r.stallsWithin(time.Time{}, end)
}

// stallsWithin are the longest spans without progress of the committed readings and of
// the webhooks that overlap [from, to].
func (r *run) stallsWithin(from, to time.Time) (state, hooks time.Duration) {
	r.mu.Lock()
	s := slices.Clone(r.samples)
	r.mu.Unlock()
	longest := func(moved func(a, b sample) bool) time.Duration {
		var last time.Time
		var worst time.Duration
		for i := 1; i < len(s); i++ {
			if !moved(s[i-1], s[i]) {
				continue
			}
			if !last.IsZero() && s[i].at.After(from) && last.Before(to) {
				worst = max(worst, s[i].at.Sub(last))
			}
			last = s[i].at
		}
		return worst
	}
	return longest(func(a, b sample) bool { return b.committed.After(a.committed) }),
		longest(func(a, b sample) bool { return b.webhooks > a.webhooks })
}

// stallAround is the span without progress of the committed readings that contains at: how
// long the state stood still around a fault.
func (r *run) stallAround(at time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var before time.Time
	for i := 1; i < len(r.samples); i++ {
		if !r.samples[i].committed.After(r.samples[i-1].committed) {
			continue
		}
		if r.samples[i].at.Before(at) {
			before = r.samples[i].at
			continue
		}
		return r.samples[i].at.Sub(before)
	}
	return -1
}

// checkRevisions reads all of EVENTS: each sensor's revisions are 1..n, each once, and n is
// its revision in sensor_state. It returns the number of events.
// storedEvent is an EVENTS message, decoded, with its stream sequence.
type storedEvent struct {
	event.Event
	seq uint64
}

// readEvents reads all of EVENTS in order, with the rebuilds' reader (internal/logread),
// which creates its consumer again after the last message returned when a node that just
// came back loses it or answers "no responders".
func (r *run) readEvents(ctx context.Context) ([]storedEvent, error) {
	st, err := logread.StreamState(ctx, r.js, natsx.EventsStream)
	if err != nil {
		return nil, err
	}
	rd, err := logread.New(ctx, r.js, natsx.EventsStream, "", st.FirstSeq)
	if err != nil {
		return nil, err
	}
	defer rd.Close(ctx)
	var out []storedEvent
	for empty := 0; len(out) < int(st.Msgs); {
		msgs, err := rd.Fetch(ctx, 500, 5*time.Second)
		if err != nil {
			return out, err
		}
		if len(msgs) == 0 {
			if empty++; empty > 10 {
				return out, fmt.Errorf("reading EVENTS: %d of %d messages, then nothing", len(out), st.Msgs)
			}
			continue
		}
		empty = 0
		for _, m := range msgs {
			e, err := event.DecodeEvent(m.Data())
			if err != nil {
				return out, fmt.Errorf("EVENTS message: %w", err)
			}
			md, err := m.Metadata()
			if err != nil {
				return out, err
			}
			out = append(out, storedEvent{Event: e, seq: md.Sequence.Stream})
		}
	}
	return out, nil
}

// explainMissing logs, for each state change in EVENTS the receiver did not get, its
// delivery row (or its absence), so that a failed run says where the webhook stopped.
func (r *run) explainMissing() {
	t := r.t
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
	defer cancel()
	evs, err := r.readEvents(ctx)
	if err != nil {
		t.Logf("explain: %v", err)
	}
	shown := 0
	for _, e := range evs {
		if shown == 20 {
			return
		}
		if e.Type != event.TypeStateChanged || r.rcv.Seen(e.ID) {
			continue
		}
		var state, lastErr string
		var attempts int
		var lastStatus *int
		err = r.pg.QueryRow(ctx, `SELECT state, attempts, last_status, coalesce(last_error, '') FROM notifier_deliveries WHERE event_id = $1`, e.ID).
			Scan(&state, &attempts, &lastStatus, &lastErr)
		t.Logf("missing webhook %s (sensor %s revision %d, EVENTS seq %d): delivery state %q attempts %d last status %v last error %q (%v)",
			e.ID, e.SensorID, e.Revision, e.seq, state, attempts, lastStatus, lastErr, err)
		shown++
	}
}

func (r *run) checkRevisions() int {
	t := r.t
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	evs, err := r.readEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	revs := map[string][]int64{}
	for _, e := range evs {
		revs[e.SensorID] = append(revs[e.SensorID], e.Revision)
	}
	rows, err := r.pg.Query(ctx, "SELECT sensor_id, revision FROM sensor_state")
	if err != nil {
		t.Fatal(err)
	}
	state := map[string]int64{}
	for rows.Next() {
		var id string
		var rev int64
		if err := rows.Scan(&id, &rev); err != nil {
			t.Fatal(err)
		}
		state[id] = rev
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var bad []string
	for id, rs := range revs {
		slices.Sort(rs)
		for i, rev := range rs {
			if rev != int64(i+1) {
				bad = append(bad, fmt.Sprintf("%s: revisions %v: a gap or a repeat at %d", id, rs, i))
				break
			}
		}
		if state[id] != int64(len(rs)) {
			bad = append(bad, fmt.Sprintf("%s: sensor_state revision %d, EVENTS has %d", id, state[id], len(rs)))
		}
	}
	for id, rev := range state {
		if _, ok := revs[id]; !ok && rev != 0 {
			bad = append(bad, fmt.Sprintf("%s: sensor_state revision %d, no event", id, rev))
		}
	}
	slices.Sort(bad)
	if len(bad) > 0 {
		t.Errorf("revisions: %d problems, first: %s", len(bad), strings.Join(bad[:min(len(bad), 10)], "; "))
	}
	return len(evs)
}

// metric is one process's sum of a metric's series (-1 when it cannot be read).
func metric(p *cluster.Part, name string) float64 {
	m, err := loadgen.Scrape(context.Background(), []string{"http://" + p.HTTPAddr + "/metrics"}, name)
	if err != nil {
		return -1
	}
	return m[name]
}

// checkOrder reads all of READINGS: each sensor's readings must be stored in the order the
// load generator published them (their ts is the publish time), per-sensor order being
// invariant 4; a reading stored after a later one of its sensor makes the state flip where
// the door did not.
func (r *run) checkOrder() {
	t := r.t
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s, err := r.js.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]time.Time{}
	inversions, sensors := 0, map[string]bool{}
	var worst time.Duration
	fails := 0
	for n := 0; n < int(info.State.Msgs); {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			if fails++; fails < 10 { // the cluster may still settle after the restart
				time.Sleep(time.Second)
				continue
			}
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			l, err := event.DecodeLog(m.Data())
			if err != nil || l.Kind != event.KindReading {
				continue
			}
			if prev, ok := last[l.SensorID]; ok && l.Time.Before(prev) {
				inversions++
				sensors[l.SensorID] = true
				worst = max(worst, prev.Sub(l.Time))
				continue
			}
			last[l.SensorID] = l.Time
		}
		n += got
		if batch.Error() != nil || got == 0 {
			if fails++; fails < 10 {
				time.Sleep(time.Second)
				continue
			}
			t.Fatalf("reading READINGS: %d of %d messages: %v", n, info.State.Msgs, batch.Error())
		}
	}
	if inversions > 0 {
		t.Errorf("READINGS: %d readings of %d sensors stored after a later reading of their sensor (up to %s earlier): per-sensor order lost",
			inversions, len(sensors), worst.Round(time.Millisecond))
	}
}
