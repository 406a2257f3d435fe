package notifier

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

const (
	testPartitions = 4
	childEnv       = "NOTIFIER_TEST_CHILD"
	// ownerEnv names a child in the partition leases (lease_test.go).
	ownerEnv = "NOTIFIER_TEST_OWNER"
	// leaseEnv shortens a child's delivery leases (crash_test.go), so that what a crash
	// leaves leased is attempted again within a test's patience.
	leaseEnv = "NOTIFIER_TEST_LEASE"
)

// TestMain runs the notifier as a child process when childEnv is set (crash tests), with
// its configuration from the LOCKS_* variables, until SIGTERM or a crash point.
// The tests run side by side: they mostly wait for retry delays, leases and webhooks.
func TestMain(m *testing.M) {
	testenv.Parallel(12)
	testenv.ChildMain(m, childEnv, runChild)
}

func runChild() int {
	cfg, err := config.Load(nil, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slogStderr()
	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	nc, err := natsx.Connect(cfg.NATSURL, "notifier-child", log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 1
	}
	n, err := New(Config{PartitionCount: cfg.Partitions, RetrySchedule: cfg.RetrySchedule, WebhookTimeout: cfg.WebhookTimeout,
		LeaseMargin: cfg.WebhookLeaseMargin, WebhookAllowPrivate: cfg.WebhookAllowPrivate, PollInterval: 100 * time.Millisecond, Owner: os.Getenv(ownerEnv)},
		Deps{JS: js, PG: pool, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if v := os.Getenv(leaseEnv); v != "" {
		if n.lease, err = time.ParseDuration(v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if err := n.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// env is one test's servers: NATS with the streams declared, a fresh Postgres database.
type env struct {
	t     testing.TB
	nats  *testenv.NATSEnv
	pgURL string
	pool  *pgxpool.Pool
	cfg   Config
	reg   *prometheus.Registry
	// tracer is given to the notifiers start makes; nil: no tracing.
	tracer trace.Tracer
	// stop stops the notifier start made last, as at the end of the test.
	stop func()
}

func newEnv(t testing.TB, schedule ...time.Duration) *env {
	t.Helper()
	ne := testenv.NATS(t)
	if err := natsx.Declare(context.Background(), ne.JS, natsx.StreamsConfig{Partitions: testPartitions, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	u, pool := testenv.Postgres(t)
	cfg := Config{PartitionCount: testPartitions, RetrySchedule: schedule, WebhookTimeout: 2 * time.Second, WebhookAllowPrivate: true}
	return &env{t: t, nats: ne, pgURL: u, pool: pool, cfg: cfg}
}

// start runs a notifier of e.cfg until the end of the test, polling and probing sooner
// than the defaults unless e.cfg says otherwise.
func (e *env) start() *Notifier {
	e.t.Helper()
	return e.startOn(e.nats.JS)
}

// startOn is start with the notifier's own connection to NATS (through a proxy, say).
func (e *env) startOn(js jetstream.JetStream) *Notifier {
	e.t.Helper()
	cfg := e.cfg
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.BreakerCooldown == 0 {
		cfg.BreakerCooldown = 200 * time.Millisecond
	}
	e.reg = prometheus.NewRegistry()
	n, err := New(cfg, Deps{JS: js, PG: e.pool, Logger: testenv.Logger(e.t).With("t", e.t.Name()), Registerer: e.reg, Tracer: e.tracer})
	if err != nil {
		e.t.Fatal(err)
	}
	e.stop = testenv.RunPart(e.t, "notifier", n.Run, 20*time.Second)
	return n
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// client registers a client with a fresh secret and returns the secret.
func (e *env) client(id, url string) string {
	e.t.Helper()
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("key-of-"+id+"-0123456789abcdef"))
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret) VALUES ($1, $1, $2, $3)`, id, url, secret)
	return secret
}

// subscribed registers client c1 at url, sensor s1 "here", and c1's subscription to it.
func (e *env) subscribed(url string) {
	e.t.Helper()
	e.client("c1", url)
	e.sensor("s1", "here")
	e.subscribe("c1", "s1")
}

func (e *env) sensor(id, address string) {
	e.t.Helper()
	e.exec(`INSERT INTO sensors (id, address) VALUES ($1, $2)`, id, address)
}

func (e *env) subscribe(client, sensor string) {
	e.t.Helper()
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) VALUES ($1, $2)`, client, sensor)
}

func testEvent(sensor string, rev int64, data uint8) event.Event {
	e := event.Event{V: event.Version, ID: event.ID(sensor, rev), Type: event.TypeStateChanged,
		OccurredAt: time.Now().UTC().Truncate(time.Millisecond), SensorID: sensor, Data: data, Revision: rev,
		Partition: partition.Of(sensor, testPartitions)}
	if rev > 1 {
		p := 1 - data
		e.PreviousData = &p
	}
	return e
}

// publish appends events to EVENTS the way the state projector's relay does, after the
// sensor's state has reached their revision (as the state projector's transaction leaves it:
// the notifier sets aside an event ahead of the state).
func (e *env) publish(evs ...event.Event) {
	e.t.Helper()
	e.seedState(evs...)
	publishEvents(e.t, e.nats.JS, evs)
}

// seedState gives each event's sensor a state at least at its revision, as the state
// projector would have committed it with the event.
func (e *env) seedState(evs ...event.Event) {
	e.t.Helper()
	for _, ev := range evs {
		e.exec(`INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			VALUES ($1, $2, $3, now(), now(), now(), $4, 'online', 0)
			ON CONFLICT (sensor_id) DO UPDATE SET revision = greatest(sensor_state.revision, excluded.revision)`,
			ev.SensorID, ev.Partition, int16(ev.Data), ev.Revision)
	}
}

// records reads every attempt record of client from DELIVERIES.
func (e *env) records(client string) []event.Attempt {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := e.nats.JS.Stream(ctx, natsx.DeliveriesStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(natsx.DeliveriesSubject(client)))
	if err != nil {
		e.t.Fatal(err)
	}
	want := info.State.Subjects[natsx.DeliveriesSubject(client)]
	if want == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{natsx.DeliveriesSubject(client)}})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []event.Attempt
	for uint64(len(out)) < want {
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			e.t.Fatal(err)
		}
		a, err := event.DecodeAttempt(m.Data())
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func outcomes(recs []event.Attempt) string {
	var s []string
	for _, a := range recs {
		s = append(s, strconv.Itoa(a.Attempt)+":"+a.Outcome)
	}
	return strings.Join(s, ",")
}

// waitFor polls cond until it holds or the deadline passes.

// hit is one request a receiver got.
type hit struct {
	at     time.Time
	header http.Header
	body   []byte
	status int
}

// receiver is a real HTTP server on loopback; respond decides each answer (n is 1-based).
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	hits    []hit
	respond func(n int, w http.ResponseWriter, r *http.Request) int
}

func newReceiver(t testing.TB, respond func(n int, w http.ResponseWriter, r *http.Request) int) *receiver {
	rc := &receiver{respond: respond}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		n := len(rc.hits) + 1
		rc.hits = append(rc.hits, hit{at: time.Now(), header: r.Header.Clone(), body: b})
		rc.mu.Unlock()
		st := http.StatusOK
		if rc.respond != nil {
			st = rc.respond(n, w, r)
		}
		rc.mu.Lock()
		rc.hits[n-1].status = st
		rc.mu.Unlock()
		if st != 0 {
			w.WriteHeader(st)
		}
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) got() []hit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hit(nil), rc.hits...)
}

func (rc *receiver) count() int { return len(rc.got()) }

// verify checks webhook-signature against the Standard Webhooks spec, computed here from
// crypto/hmac and not by the package's signer. It returns how many signatures matched which
// of secrets, in order.
func verify(t testing.TB, h hit, secrets ...string) []int {
	t.Helper()
	id, ts := h.header.Get("webhook-id"), h.header.Get("webhook-timestamp")
	var matched []int
	for _, sig := range strings.Split(h.header.Get("webhook-signature"), " ") {
		v, b64, ok := strings.Cut(sig, ",")
		if !ok || v != "v1" {
			t.Fatalf("signature %q is not v1,<base64>", sig)
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatalf("signature %q: %v", sig, err)
		}
		found := -1
		for i, s := range secrets {
			key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
			if err != nil {
				t.Fatal(err)
			}
			mac := hmac.New(sha256.New, key)
			mac.Write([]byte(id + "." + ts + "." + string(h.body)))
			if hmac.Equal(mac.Sum(nil), got) {
				found = i
			}
		}
		if found < 0 {
			t.Fatalf("signature %q matches no secret (id %s, ts %s)", sig, id, ts)
		}
		matched = append(matched, found)
	}
	return matched
}

// bodyOf decodes a webhook body.
type gotBody struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	OccurredAt string `json:"occurred_at"`
	Sensor     struct {
		ID      string `json:"id"`
		Address string `json:"address"`
	} `json:"sensor"`
	Data         *int  `json:"data"`
	PreviousData *int  `json:"previous_data"`
	Revision     int64 `json:"revision"`
}

func bodyOf(t testing.TB, h hit) gotBody {
	t.Helper()
	var b gotBody
	if err := json.Unmarshal(h.body, &b); err != nil {
		t.Fatalf("body %s: %v", h.body, err)
	}
	return b
}
