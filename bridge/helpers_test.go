package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Environment of a bridge run in a child process by the crash test.
const (
	childEnv      = "LOCKS_BRIDGE_TEST_CHILD"
	childNATSEnv  = "LOCKS_BRIDGE_TEST_NATS_URL"
	childAMQPEnv  = "LOCKS_BRIDGE_TEST_AMQP_URL"
	childQueueEnv = "LOCKS_BRIDGE_TEST_QUEUE"
	childPGEnv    = "LOCKS_BRIDGE_TEST_POSTGRES_URL"
)

// The tests run side by side: they mostly wait on RabbitMQ and NATS (restarts, redeliveries),
// and a slot for each means the longest, the RabbitMQ restart, never waits for one.
func TestMain(m *testing.M) {
	testenv.Parallel(32)
	testenv.ChildMain(m, childEnv, runChild)
}

// runChild runs a bridge until it is killed at its crash point or a minute has passed.
func runChild() int {
	log := testenv.Logger(childTB{})
	nc, err := natsx.Connect(os.Getenv(childNATSEnv), "bridge-child", log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	js, _ := jetstream.New(nc)
	pg, err := pgxpool.New(context.Background(), os.Getenv(childPGEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pg.Close()
	b, err := New(Config{AMQPURL: os.Getenv(childAMQPEnv), Queue: os.Getenv(childQueueEnv), Prefetch: 100},
		Deps{JS: js, PG: pg, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 3 // not killed: the crash point was never reached
}

// childTB is just enough of testing.TB for testenv.Logger in the child: it writes to stderr.
type childTB struct{ testing.TB }

func (childTB) Helper()         {}
func (childTB) Log(args ...any) { fmt.Fprintln(os.Stderr, args...) }

// env is one test's servers: its own embedded NATS with the streams declared, and its own
// queue names on a RabbitMQ.
type env struct {
	nats   *testenv.NATSEnv
	js     jetstream.JetStream // on a connection made like the binary's (natsx.Connect)
	amqp   string
	queue  string
	conn   *amqp.Connection
	ch     *amqp.Channel // for the test's own publishing and inspection
	pubCh  *amqp.Channel
	reg    *prometheus.Registry
	bridge *Bridge
	// pgURL and pg are the test's own Postgres database (the registry the bridge reads).
	pgURL  string
	pg     *pgxpool.Pool
	logs   *logCapture  // what the bridges start made logged
	tracer trace.Tracer // given to the bridges start makes; nil: no tracing
}

func newEnv(t testing.TB, amqpURL string) *env {
	t.Helper()
	return newEnvAppending(t, amqpURL, atomicBatches)
}

// newEnvAppending is newEnv with READINGS allowing atomic batches or not.
func newEnvAppending(t testing.TB, amqpURL string, atomic bool) *env {
	t.Helper()
	ne := testenv.NATS(t)
	if err := natsx.Declare(t.Context(), ne.JS, natsx.StreamsConfig{Partitions: 4, AtomicPublish: atomic}); err != nil {
		t.Fatal(err)
	}
	e := &env{nats: ne, js: testenv.JetStream(t, ne.URL, "bridge-test"), amqp: amqpURL}
	e.pgURL, e.pg = testenv.Postgres(t)
	if amqpURL == "" {
		re := testenv.RabbitMQ(t)
		e.amqp, e.queue = re.URL, re.Queue
	} else {
		e.queue = testenv.Name("sensor.readings")
	}
	e.connectAMQP(t)
	return e
}

func (e *env) connectAMQP(t testing.TB) {
	t.Helper()
	conn, err := amqp.Dial(e.amqp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(e.queue, false, false, false)
			_, _ = ch.QueueDelete(e.queue+".invalid", false, false, false)
		}
		_ = conn.Close()
	})
	e.conn = conn
	if e.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if e.pubCh, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := e.pubCh.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// Declared as the bridge declares it, so messages can be published before it starts.
	if _, err := e.ch.QueueDeclare(e.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

// ch2 opens another channel for inspection.
func (e *env) ch2(t testing.TB) (*amqp.Channel, error) {
	t.Helper()
	return e.conn.Channel()
}

// publish sends persistent messages under publisher confirms and waits for all confirms.
func (e *env) publish(t testing.TB, msgs []amqp.Publishing) {
	t.Helper()
	const window = 2000
	var pending []*amqp.DeferredConfirmation
	wait := func() {
		for _, dc := range pending {
			if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
				t.Fatalf("publish not confirmed: %v", err)
			}
		}
		pending = pending[:0]
	}
	for _, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		dc, err := e.pubCh.PublishWithDeferredConfirmWithContext(context.Background(), "", e.queue, false, false, m)
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) >= window {
			wait()
		}
	}
	wait()
}

// start runs a bridge on the env until the test ends or stop is called.
func (e *env) start(t testing.TB, cfg Config) (stop func()) {
	t.Helper()
	cfg.AMQPURL, cfg.Queue = e.amqp, e.queue
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = "locks-bridge-test-" + e.queue
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMin, cfg.ReconnectMax = 100*time.Millisecond, time.Second
	}
	e.reg = prometheus.NewRegistry()
	b, err := New(cfg, Deps{JS: e.js, PG: e.pg, Logger: e.logger(t), Registerer: e.reg, Tracer: e.tracer})
	if err != nil {
		t.Fatal(err)
	}
	e.bridge = b
	return testenv.RunPart(t, "bridge", b.Run, 30*time.Second)
}

func (e *env) streamMsgs(t testing.TB) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := e.nats.JS.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return 0 // NATS restarting: the caller polls
	}
	return s.CachedInfo().State.Msgs
}

// queueReady is the number of messages ready (not unacked) in a queue.
func (e *env) queueReady(t testing.TB, q string) int {
	t.Helper()
	info, err := e.ch.QueueInspect(q)
	if err != nil {
		t.Fatalf("inspect %s: %v", q, err)
	}
	return info.Messages
}

// readings reads the whole READINGS stream.
func (e *env) readings(t testing.TB) ([]event.Log, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	n := e.streamMsgs(t)
	c, err := e.nats.JS.OrderedConsumer(ctx, natsx.ReadingsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var logs []event.Log
	var subjects []string
	for uint64(len(logs)) < n {
		// No more than the stream holds: a fetch for more would wait out its MaxWait.
		batch, err := c.Fetch(int(min(1000, n-uint64(len(logs)))), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			l, err := event.DecodeLog(m.Data())
			if err != nil {
				t.Fatal(err)
			}
			logs, subjects = append(logs, l), append(subjects, m.Subject())
		}
		if batch.Error() != nil && !errors.Is(batch.Error(), jetstream.ErrNoMessages) {
			t.Fatal(batch.Error())
		}
		if got == 0 {
			t.Fatalf("stream says %d messages, read %d", n, len(logs))
		}
	}
	return logs, subjects
}

// eventually polls cond until it holds or the deadline passes.

// atomicBatches is whether the tests' READINGS allows atomic batches, so that the bridge
// appends in them (batch.go), as it does on the embedded server's default. Set
// LOCKS_TEST_BRIDGE_BATCHES=false to run the suite with single appends (an external NATS).
var atomicBatches = os.Getenv("LOCKS_TEST_BRIDGE_BATCHES") != "false"

// logger is the test's logger, also keeping each record's message in e.logs.
func (e *env) logger(t testing.TB) *slog.Logger {
	if e.logs == nil {
		e.logs = &logCapture{}
	}
	e.logs.next = testenv.Logger(t).Handler()
	return slog.New(e.logs)
}

// logCapture keeps the messages logged, with their attributes, and passes them on.
type logCapture struct {
	next  slog.Handler
	attrs []slog.Attr
	mu    *sync.Mutex
	recs  *[]string
}

func (c *logCapture) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (c *logCapture) Handle(ctx context.Context, r slog.Record) error {
	c.init()
	line := r.Message
	for _, a := range c.attrs {
		line += " " + a.String()
	}
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	c.mu.Lock()
	*c.recs = append(*c.recs, line)
	c.mu.Unlock()
	if c.next.Enabled(ctx, r.Level) {
		return c.next.Handle(ctx, r)
	}
	return nil
}

func (c *logCapture) init() {
	if c.mu == nil {
		c.mu, c.recs = &sync.Mutex{}, &[]string{}
	}
}

func (c *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	c.init()
	return &logCapture{next: c.next.WithAttrs(as), attrs: append(append([]slog.Attr(nil), c.attrs...), as...), mu: c.mu, recs: c.recs}
}

func (c *logCapture) WithGroup(name string) slog.Handler {
	c.init()
	return &logCapture{next: c.next.WithGroup(name), attrs: c.attrs, mu: c.mu, recs: c.recs}
}

// lines are the messages logged so far that contain sub.
func (c *logCapture) lines(sub string) []string {
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range *c.recs {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}
