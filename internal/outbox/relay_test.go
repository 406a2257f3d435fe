package outbox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The tests mostly wait on their servers (relays polling, NATS restarting): they run side by side.
func TestMain(m *testing.M) { testenv.Main(m, 8) }

// fixture is a test outbox table in its own database and a NATS server with stream T (t.>).
type fixture struct {
	t  *testing.T
	pg *pgxpool.Pool
	js jetstream.JetStream
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	_, pg := testenv.Postgres(t)
	ne := testenv.NATS(t)
	f := &fixture{t: t, pg: pg, js: ne.JS}
	f.exec(`CREATE TABLE ob (id bigserial PRIMARY KEY, subject text NOT NULL, msg_id text NOT NULL,
		payload bytea NOT NULL, key text NOT NULL DEFAULT '', seq bigint NOT NULL DEFAULT 0)`)
	f.stream("T", "t.>")
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pg.Exec(f.t.Context(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) stream(name, subject string) {
	f.t.Helper()
	if _, err := f.js.CreateStream(f.t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		f.t.Fatal(err)
	}
}

// row queues one row; its payload is its message id.
func (f *fixture) row(subject, msgID, key string, seq int64) {
	f.exec(`INSERT INTO ob (subject, msg_id, payload, key, seq) VALUES ($1, $2, $3, $4, $5)`, subject, msgID, []byte(msgID), key, seq)
}

func (f *fixture) left() int {
	f.t.Helper()
	var n int
	if err := f.pg.QueryRow(f.t.Context(), `SELECT count(*) FROM ob`).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) config(shared bool) Config {
	sel := `SELECT id, subject, msg_id, payload, key, seq FROM ob ORDER BY id LIMIT $1`
	if shared {
		sel += ` FOR UPDATE SKIP LOCKED`
	}
	return Config{Name: "test", Poll: 20 * time.Millisecond, Batch: 4, AckTimeout: 2 * time.Second,
		Backoff: backoff.Policy{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Table: Table{Select: sel, Delete: `DELETE FROM ob WHERE id = ANY($1)`, Shared: shared,
			Scan: func(rows pgx.Rows) (Row, error) {
				var o Row
				err := rows.Scan(&o.ID, &o.Subject, &o.MsgID, &o.Data, &o.Key, &o.Seq)
				return o, err
			}}}
}

func (f *fixture) start(cfg Config) *Relay {
	f.t.Helper()
	r, err := New(cfg, Deps{Logger: testenv.Logger(f.t), Registerer: prometheus.NewRegistry(), JS: f.js, PG: f.pg})
	if err != nil {
		f.t.Fatal(err)
	}
	testenv.RunPart(f.t, "relay", r.Run, 10*time.Second)
	return r
}

// messages reads stream name's messages in order, as payloads.
func (f *fixture) messages(name string) []string {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), 10*time.Second)
	defer cancel()
	s, err := f.js.Stream(ctx, name)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, string(m.Data))
	}
	return out
}

// Rows leave in id order, each key's in its order, once each (a row whose message id is
// already in the stream is not stored again), and are deleted after their ack.
func TestRelayPublishesInOrderOnceAndDeletes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.js.Publish(t.Context(), "t.a", []byte("a1"), jetstream.WithMsgID("a1")); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a1", "a2", "b1", "a3", "b2", "c1", "a4", "a5", "b3", "c2"} {
		f.row("t."+id[:1], id, id[:1], int64(i))
	}
	r := f.start(f.config(false))
	testenv.Eventually(t, 10*time.Second, "outbox emptied", func() bool { return f.left() == 0 })
	got := f.messages("T")
	if len(got) != 10 {
		t.Fatalf("stream holds %v, want 10 messages (a1 once)", got)
	}
	last := map[byte]string{}
	for _, m := range got {
		if m <= last[m[0]] {
			t.Fatalf("stream order %v: %s after %s", got, m, last[m[0]])
		}
		last[m[0]] = m
	}
	f.row("t.d", "d1", "d", 0)
	r.Wake()
	testenv.Eventually(t, 10*time.Second, "woken row relayed", func() bool { return f.left() == 0 })
}

// A row that cannot be published stays (and nothing after it of its key goes), Check sees
// the rows of the rounds after a failure and may drop rows, and once the stream exists
// everything else is relayed in order.
func TestRelayKeepsRowsUntilAcknowledged(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, id := range []string{"u1", "u2", "u3"} {
		f.row("u.k", id, "k", 0)
	}
	f.row("u.k", "gone", "k", -1) // Check: already published
	var checked atomic.Int64
	cfg := f.config(false)
	cfg.Check = func(_ context.Context, rows []Row) ([]Row, []int64, error) {
		checked.Add(1)
		var keep []Row
		var drop []int64
		for _, o := range rows {
			if o.Seq < 0 {
				drop = append(drop, o.ID)
				continue
			}
			keep = append(keep, o)
		}
		return keep, drop, nil
	}
	var published sync.Map
	cfg.Published = func(rows []Row) {
		for _, o := range rows {
			published.Store(o.MsgID, true)
		}
	}
	f.start(cfg)
	testenv.Eventually(t, 10*time.Second, "failed rounds checked", func() bool { return checked.Load() >= 3 })
	if n := f.left(); n != 3 {
		t.Fatalf("%d rows left while the subject has no stream, want the 3 unpublished", n)
	}
	f.stream("U", "u.>")
	testenv.Eventually(t, 10*time.Second, "outbox emptied", func() bool { return f.left() == 0 })
	if got := fmt.Sprint(f.messages("U")); got != "[u1 u2 u3]" {
		t.Fatalf("stream U holds %s, want [u1 u2 u3]", got)
	}
	if _, ok := published.Load("gone"); ok {
		t.Fatal("a row Check dropped was published")
	}
}

// Relays sharing a table never take the same row: each row is acknowledged exactly once.
func TestRelaySharedTableEachRowOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const rows = 200
	for i := range rows {
		f.row("t.s", fmt.Sprintf("s%03d", i), "", 0)
	}
	var acked sync.Map
	var twice atomic.Int64
	for range 3 {
		cfg := f.config(true)
		cfg.Published = func(rs []Row) {
			for _, o := range rs {
				if _, dup := acked.LoadOrStore(o.MsgID, true); dup {
					twice.Add(1)
				}
			}
		}
		f.start(cfg)
	}
	testenv.Eventually(t, 20*time.Second, "outbox emptied", func() bool { return f.left() == 0 })
	if n := twice.Load(); n != 0 {
		t.Fatalf("%d rows were published by two relays", n)
	}
	if n := len(f.messages("T")); n != rows {
		t.Fatalf("stream holds %d messages, want %d", n, rows)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{Name: "x", Table: Table{Select: "s", Delete: "d", Scan: func(pgx.Rows) (Row, error) { return Row{}, nil }}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]Config{
		"no name":         {Table: ok.Table},
		"no select":       {Name: "x", Table: Table{Delete: "d", Scan: ok.Table.Scan}},
		"no scan":         {Name: "x", Table: Table{Select: "s", Delete: "d"}},
		"negative linger": {Name: "x", Table: ok.Table, Linger: -1},
	} {
		if c.Validate() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// On a stream that allows atomic batches, rows go in batches; a batch holding a row already
// in the stream (published before a lost delete) is refused whole and its rows go one by
// one, so every row is stored once, each key's in order.
func TestRelayAtomicBatchesOnceInOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "A", Subjects: []string{"at.>"},
		AllowAtomicPublish: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(t.Context(), "at.k3", []byte("k3-000"), jetstream.WithMsgID("k3-000")); err != nil {
		t.Fatal(err)
	}
	const keys, revs = 40, 10 // waves of 40 rows: batches need natsx.MinAtomicBatch
	for r := range revs {
		for k := range keys {
			id := fmt.Sprintf("k%d-%03d", k, r)
			f.row(fmt.Sprintf("at.k%d", k), id, fmt.Sprintf("k%d", k), int64(r))
		}
	}
	cfg := f.config(false)
	cfg.Batch = 100
	r := f.start(cfg)
	testenv.Eventually(t, 20*time.Second, "outbox emptied", func() bool { return f.left() == 0 })
	got := f.messages("A")
	if len(got) != keys*revs {
		t.Fatalf("stream holds %d messages, want %d (k3-000 once)", len(got), keys*revs)
	}
	last := map[string]string{}
	for _, m := range got {
		k, _, _ := strings.Cut(m, "-")
		if m <= last[k] {
			t.Fatalf("key %s: %s after %s", k, m, last[k])
		}
		last[k] = m
	}
	if b, bf := testutil.ToFloat64(r.batches), testutil.ToFloat64(r.batchFailures); b == 0 || bf < 1 {
		t.Fatalf("%v batches, %v refused: want batches, and the one holding k3-000 refused", b, bf)
	}
}

// The delete of relayed rows does not wait for its WAL flush, and that setting ends with it:
// the pooled connection it used commits as before afterwards.
func TestDeleteRelayedKeepsItsCommitSettingToItself(t *testing.T) {
	t.Parallel()
	pool := testenv.PostgresOneConn(t) // every call on the same connection
	if _, err := pool.Exec(t.Context(), `CREATE TABLE d (id bigint PRIMARY KEY); INSERT INTO d VALUES (1), (2), (3)`); err != nil {
		t.Fatal(err)
	}
	if err := deleteRelayed(t.Context(), pool, `DELETE FROM d WHERE id = ANY($1)`, []int64{1, 3}); err != nil {
		t.Fatal(err)
	}
	var left int
	var sc string
	if err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM d), current_setting('synchronous_commit')`).Scan(&left, &sc); err != nil {
		t.Fatal(err)
	}
	if left != 1 || sc != "on" {
		t.Fatalf("%d rows left, synchronous_commit %s after the delete; want 1 and on", left, sc)
	}
}
