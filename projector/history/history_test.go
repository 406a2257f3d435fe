package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/history"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

const historyPartitions = 4

// The tests mostly wait (on ClickHouse's inserts, a cut link, a NATS restart), so eight
// of them wait side by side.
func TestMain(m *testing.M) { testenv.Main(m, 8) }

// historyEnv is a READINGS/EVENTS/DELIVERIES log and a ClickHouse database.
type historyEnv struct {
	nats  *testenv.NATSEnv
	chURL string
	ch    driver.Conn
}

func newHistoryEnv(t testing.TB) *historyEnv {
	t.Helper()
	e := &historyEnv{nats: testenv.NATS(t)}
	e.chURL, e.ch = testenv.ClickHouse(t)
	if err := natsx.Declare(t.Context(), e.nats.JS, natsx.StreamsConfig{Partitions: historyPartitions, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return e
}

// historyTestConfig is small batches and a short AckWait, so that a killed writer's messages
// come back within seconds.
func historyTestConfig() Config {
	return Config{
		Partitions:    partition.All(historyPartitions),
		BatchSize:     5000,
		FlushInterval: 200 * time.Millisecond,
		AckWait:       3 * time.Second,
		BackoffMin:    100 * time.Millisecond,
		BackoffMax:    time.Second,
		InsertTimeout: 5 * time.Second,
	}
}

// historyReadings makes count readings over sensors s0…s(n-1), i-th reading of a sensor at
// base + i seconds, plus a liveness fact every 1000 messages (not a reading: never a row).
func historyReadings(sensors, count int, base time.Time, from int) []event.Log {
	var logs []event.Log
	for i := from; i < from+count; i++ {
		s := fmt.Sprintf("s%d", i%sensors)
		at := base.Add(time.Duration(i/sensors) * time.Second).Add(time.Duration(i%1000) * time.Millisecond)
		logs = append(logs, event.Log{V: event.Version, Kind: event.KindReading, SensorID: s, Data: uint8(i % 2),
			Time: at, ReceivedTime: at.Add(time.Second), MessageID: fmt.Sprint("m", i)})
		if i%1000 == 999 {
			logs = append(logs, event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: s,
				ReceivedTime: at, LostAfter: time.Hour})
		}
	}
	return logs
}

func historyPublish(t testing.TB, js jetstream.JetStream, logs []event.Log) {
	t.Helper()
	const window = 2000 // under the client's 4,000 async publishes in flight, which stall on a loaded machine
	for i := 0; i < len(logs); i += window {
		var futs []jetstream.PubAckFuture
		for _, l := range logs[i:min(i+window, len(logs))] {
			b, err := json.Marshal(l)
			if err != nil {
				t.Fatal(err)
			}
			f, err := js.PublishAsync(natsx.ReadingsSubject(l.SensorID), b)
			if err != nil {
				t.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("publish not acknowledged within 30s")
			}
		}
	}
}

// historyDistinct is the number of distinct readings in the table, and its raw row count.
func historyDistinct(t testing.TB, ch driver.Conn) (distinct, raw uint64) {
	t.Helper()
	if err := ch.QueryRow(t.Context(), "SELECT toUInt64(uniqExact(seq)), toUInt64(count()) FROM readings").Scan(&distinct, &raw); err != nil {
		t.Fatal(err)
	}
	return distinct, raw
}

func historyWaitRows(t testing.TB, ch driver.Conn, want uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		// A count that fails (a pooled connection ClickHouse closed) is asked again.
		var got uint64
		if err := ch.QueryRow(t.Context(), "SELECT toUInt64(uniqExact(seq)) FROM readings").Scan(&got); err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("count the readings in ClickHouse: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			t.Fatalf("%d distinct readings in ClickHouse, want %d", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// historyCheckExactlyOnce pages through every sensor's readings with the history queries
// and finds each published reading exactly once, in order, with its values. The sensors
// are checked a few at a time: each is a round trip of its own.
func historyCheckExactlyOnce(t testing.TB, ch driver.Conn, logs []event.Log, pageSize int) {
	t.Helper()
	st, err := history.New(ch)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]event.Log{}
	for _, l := range logs {
		if l.Kind == event.KindReading {
			want[l.SensorID] = append(want[l.SensorID], l)
		}
	}
	ids := make(chan string, len(want))
	for s := range want {
		ids <- s
	}
	close(ids)
	var total atomic.Int64
	g, ctx := errgroup.WithContext(t.Context())
	for range 4 {
		g.Go(func() error {
			for s := range ids {
				n, err := historyCheckSensor(ctx, st, s, want[s], pageSize)
				if err != nil {
					return err
				}
				total.Add(int64(n))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d readings of %d sensors, each exactly once", total.Load(), len(want))
}

// historyCheckSensor pages through sensor s's readings and compares them with ls, the
// readings published of it in order; it returns how many there are.
func historyCheckSensor(ctx context.Context, st *history.Store, s string, ls []event.Log, pageSize int) (int, error) {
	var got []history.Reading
	q := history.Query{PageSize: pageSize}
	for {
		p, err := st.Readings(ctx, s, q)
		if err != nil {
			return 0, err
		}
		got = append(got, p.Readings...)
		if q.PageToken = p.NextPageToken; q.PageToken == "" {
			break
		}
	}
	if len(got) != len(ls) {
		return 0, fmt.Errorf("sensor %s: %d readings in the history, %d published", s, len(got), len(ls))
	}
	for i, r := range got {
		l := ls[i]
		if r.MessageID != l.MessageID || !r.Time.Equal(l.Time.Truncate(time.Millisecond)) || r.Data != l.Data ||
			!r.ReceivedTime.Equal(l.ReceivedTime.Truncate(time.Millisecond)) {
			return 0, fmt.Errorf("sensor %s reading %d: got %+v, want %+v", s, i, r, l)
		}
	}
	return len(got), nil
}

// TestHelperHistoryProcess is the history projector in a child process (see
// TestHistoryCrash); run on its own it does nothing.
func TestHelperHistoryProcess(t *testing.T) {
	natsURL, chURL := os.Getenv("LOCKS_TEST_HISTORY_NATS"), os.Getenv("LOCKS_TEST_HISTORY_CH")
	if natsURL == "" || chURL == "" {
		return
	}
	crashpoint.ArmFromEnv()
	log := testenv.Logger(t)
	js := testenv.JetStream(t, natsURL, "history-child")
	opts, err := clickhouse.ParseDSN(chURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(historyTestConfig(), Deps{JS: js, CH: ch, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := h.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// historyChild runs the projector in a child process that dies at the crash point.
func historyChild(t *testing.T, e *historyEnv, point string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperHistoryProcess$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOCKS_TEST_HISTORY_NATS="+e.nats.URL, "LOCKS_TEST_HISTORY_CH="+e.chURL,
		crashpoint.Env+"="+point)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != crashpoint.ExitCode {
		t.Fatalf("child with %s=%s: %v, want exit code %d; output:\n%s", crashpoint.Env, point, err, crashpoint.ExitCode, tail(out, 4000))
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// runHistory runs the projector in this process until the returned stop is called.
func runHistory(t testing.TB, cfg Config, js jetstream.JetStream, ch driver.Conn) (*Projector, func()) {
	t.Helper()
	h, err := New(cfg, Deps{JS: js, CH: ch, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	stop := testenv.RunPart(t, "history projector", h.Run, 20*time.Second)
	return h, stop
}

func TestHistoryCrash(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	logs := historyReadings(200, 100_000, time.Date(2026, 11, 30, 23, 50, 0, 0, time.UTC), 0) // crosses a month
	historyPublish(t, e.nats.JS, logs)

	// Killed twice between an INSERT and its acks: each time the batch is in ClickHouse and
	// its messages come back.
	var last uint64
	for i := range 2 {
		historyChild(t, e, CrashAfterInsert+":3")
		got, raw := historyDistinct(t, e.ch)
		t.Logf("after kill %d: %d distinct readings, %d rows", i+1, got, raw)
		if got <= last || got >= 100_000 {
			t.Fatalf("after kill %d: %d distinct readings (before: %d); the kill was not in the middle", i+1, got, last)
		}
		last = got
	}

	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	historyWaitRows(t, e.ch, 100_000, 60*time.Second)
	stop()
	_, raw := historyDistinct(t, e.ch)
	t.Logf("rows in the table before merges: %d", raw)
	historyCheckExactlyOnce(t, e.ch, logs, 1000)
}

// historyProxy is a TCP proxy whose link can be cut: to the writer, a network outage of
// ClickHouse (connections reset, new ones refused) without touching the shared server.
type historyProxy struct {
	t      testing.TB
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func newHistoryProxy(t testing.TB, target string) *historyProxy {
	p := &historyProxy{t: t, target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.Cut)
	return p
}

func (p *historyProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close(); c.Close() }()
			go func() { _, _ = io.Copy(c, u); u.Close(); c.Close() }()
		}
	}()
}

// Cut closes the listener and every connection.
func (p *historyProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore listens again on the same address.
func (p *historyProxy) Restore() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serve(ln)
}

func TestHistoryClickHouseOutage(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	proxy := newHistoryProxy(t, testenv.ClickHouseAddr())
	opts, err := clickhouse.ParseDSN(e.chURL)
	if err != nil {
		t.Fatal(err)
	}
	opts.Addr = []string{proxy.addr}
	opts.DialTimeout = 2 * time.Second
	opts.ReadTimeout = 10 * time.Second
	viaProxy, err := clickhouse.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { viaProxy.Close() })

	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	first := historyReadings(50, 20_000, base, 0)
	historyPublish(t, e.nats.JS, first)
	cfg := historyTestConfig()
	cfg.AckWait = 1500 * time.Millisecond
	h, stop := runHistory(t, cfg, e.nats.JS, viaProxy)
	historyWaitRows(t, e.ch, 20_000, 30*time.Second)

	proxy.Cut()
	cutAt := time.Now()
	second := historyReadings(50, 30_000, base, 20_000)
	historyPublish(t, e.nats.JS, second)
	// While the link is down nothing new can be written, the writer keeps failing, and the
	// lag shows it; the held messages outlive five AckWaits without being lost.
	lagSeen := 0.0
	for pubDone := time.Now(); time.Since(pubDone) < 5*cfg.AckWait; {
		time.Sleep(500 * time.Millisecond)
		lagSeen = max(lagSeen, historyGauge(h.m.lag.WithLabelValues("readings")))
	}
	if got, _ := historyDistinct(t, e.ch); got != 20_000 {
		t.Fatalf("%d readings written through a cut link", got)
	}
	errs := historyCounter(h.m.errors.WithLabelValues("readings"))
	t.Logf("during the %s outage: %v failed inserts, lag up to %.1fs", time.Since(cutAt).Round(time.Second), errs, lagSeen)
	if errs < 2 || lagSeen < 5 {
		t.Fatalf("during the outage: %v failed inserts and lag up to %.1fs, want retries and a growing lag", errs, lagSeen)
	}

	proxy.Restore()
	historyWaitRows(t, e.ch, 50_000, 60*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for historyGauge(h.m.lag.WithLabelValues("readings")) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("lag still %v after catching up", historyGauge(h.m.lag.WithLabelValues("readings")))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	historyCheckExactlyOnce(t, e.ch, append(first, second...), 1000)
}

func TestHistoryNATSRestart(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	base := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	first := historyReadings(30, 10_000, base, 0)
	historyPublish(t, e.nats.JS, first)
	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	historyWaitRows(t, e.ch, 10_000, 30*time.Second)
	e.nats.Restart(2 * time.Second)
	second := historyReadings(30, 10_000, base, 10_000)
	historyPublish(t, e.nats.JS, second)
	historyWaitRows(t, e.ch, 20_000, 60*time.Second)
	stop()
	historyCheckExactlyOnce(t, e.ch, append(first, second...), 1000)
}

func TestHistoryEventsAndDeliveries(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	var evs []event.Event
	for rev := int64(1); rev <= 12; rev++ {
		s := "sA"
		ev := event.Event{V: event.Version, ID: event.ID(s, rev), Type: event.TypeStateChanged, OccurredAt: base.Add(time.Duration(rev) * time.Minute),
			SensorID: s, Data: uint8(rev % 2), Revision: rev, Partition: partition.Of(s, historyPartitions), Seq: uint64(rev)}
		if rev > 1 {
			p := uint8(1 - rev%2)
			ev.PreviousData = &p
		}
		evs = append(evs, ev)
	}
	for i, ev := range append(evs, evs[3:6]...) { // and a few published again
		b, _ := json.Marshal(ev)
		if _, err := e.nats.JS.Publish(t.Context(), natsx.EventsSubject(ev.Partition, ev.SensorID), b); err != nil {
			t.Fatal(i, err)
		}
	}
	var atts []event.Attempt
	for i := range 9 {
		atts = append(atts, event.Attempt{V: event.Version, EventID: evs[i/3].ID, ClientID: "c1", SensorID: "sA", Attempt: i%3 + 1,
			Time: base.Add(time.Duration(i) * time.Second), StatusCode: 500, LatencyMS: 7, Error: "HTTP 500", Outcome: event.OutcomeRetry})
	}
	for _, a := range append(atts, atts[:2]...) {
		b, _ := json.Marshal(a)
		if _, err := e.nats.JS.Publish(t.Context(), natsx.DeliveriesSubject(a.ClientID), b); err != nil {
			t.Fatal(err)
		}
	}
	// An undecodable message is skipped, not retried forever.
	if _, err := e.nats.JS.Publish(t.Context(), natsx.DeliveriesSubject("c1"), []byte("{")); err != nil {
		t.Fatal(err)
	}
	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	st, _ := history.New(e.ch)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ep, err1 := st.Events(t.Context(), "sA", history.Query{PageSize: 100})
		dp, err2 := st.Deliveries(t.Context(), "c1", history.Query{PageSize: 100})
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if len(ep.Events) == len(evs) && len(dp.Deliveries) == len(atts) {
			for i, got := range ep.Events {
				w := evs[i]
				if got.ID != w.ID || got.Revision != w.Revision || !got.Time.Equal(w.OccurredAt) || got.Data != w.Data ||
					(got.PreviousData == nil) != (w.PreviousData == nil) {
					t.Fatalf("event %d: %+v, want %+v", i, got, w)
				}
			}
			for i, got := range dp.Deliveries {
				w := atts[i]
				if got.EventID != w.EventID || got.Attempt != w.Attempt || !got.Time.Equal(w.Time) || got.StatusCode != 500 ||
					got.Latency != 7*time.Millisecond || got.Outcome != w.Outcome || got.Error != w.Error {
					t.Fatalf("delivery %d: %+v, want %+v", i, got, w)
				}
			}
			break
		}
		if len(ep.Events) > len(evs) || len(dp.Deliveries) > len(atts) || time.Now().After(deadline) {
			t.Fatalf("%d events (want %d), %d deliveries (want %d)", len(ep.Events), len(evs), len(dp.Deliveries), len(atts))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
}

func TestHistoryConfigValidate(t *testing.T) {
	t.Parallel()
	ok := historyTestConfig()
	for _, tc := range []struct {
		name   string
		change func(c *Config)
		want   string
	}{
		{"defaults", func(c *Config) { *c = Config{Partitions: partition.All(2)} }, ""},
		{"test config", func(c *Config) {}, ""},
		{"no partitions", func(c *Config) { c.Partitions = nil }, "no partitions"},
		{"negative batch", func(c *Config) { c.BatchSize = -1 }, "batch size"},
		{"pending below batch", func(c *Config) { c.MaxAckPending = c.BatchSize - 1 }, "max ack pending"},
		{"short ack wait", func(c *Config) { c.AckWait = time.Millisecond }, "ack wait"},
		{"backoff upside down", func(c *Config) { c.BackoffMax = c.BackoffMin / 2 }, "backoff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			c.setDefaults()
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := New(ok, Deps{}); err == nil {
		t.Fatal("New accepted nil dependencies")
	}
}

func historyGauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	_ = g.Write(&m)
	return m.GetGauge().GetValue()
}

func historyCounter(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}
