package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lock-sensors/lock-sensors/history"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/notifier"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// The tests mostly wait on servers and timers, each on its own database and NATS.
func TestMain(m *testing.M) { testenv.Main(m, 8) }

const testToken = "test-token-0123456789abcdef"

// env is one API server of a test: real Postgres (a fresh database), gRPC on a real
// listener on 127.0.0.1:0, and REST on a real HTTP server, mounted the way cmd/locks mounts
// it beside /healthz.
type env struct {
	t        testing.TB
	db       *pgxpool.Pool
	srv      *Server
	url      string // REST base, http://127.0.0.1:port
	http     *http.Client
	conn     *grpc.ClientConn // authenticated with testToken
	raw      *grpc.ClientConn // no credentials
	grpcAddr string
	token    string
	reg      *prometheus.Registry

	clients locksv1.ClientServiceClient
	sensors locksv1.SensorServiceClient
	subs    locksv1.SubscriptionServiceClient
	state   locksv1.StateServiceClient
	history locksv1.HistoryServiceClient
}

type envOpt func(*Config, *Deps)

func withTokens(tokens ...string) envOpt { return func(c *Config, _ *Deps) { c.Tokens = tokens } }
func withPrivateWebhooks() envOpt        { return func(c *Config, _ *Deps) { c.WebhookAllowPrivate = true } }

// sharedDB serves from another env's database, as a second API instance would.
func sharedDB(db *pgxpool.Pool) envOpt { return func(_ *Config, d *Deps) { d.PG = db } }

// withHistory serves the history calls from a fresh ClickHouse database of the test.
func withHistory(t testing.TB, ch *driver.Conn) envOpt {
	_, conn := testenv.ClickHouse(t)
	*ch = conn
	store, err := history.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	return func(_ *Config, d *Deps) { d.History = store }
}

// withStderrLog logs warnings and errors to stderr instead of the test log, for fuzz
// targets, during which the F's log must not be used.
func withStderrLog() envOpt {
	return func(_ *Config, d *Deps) {
		d.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
}

func newEnv(t testing.TB, opts ...envOpt) *env {
	t.Helper()
	_, db := testenv.Postgres(t)
	cfg := Config{GRPCAddr: "127.0.0.1:0", Tokens: []string{testToken, "second-token-0123456789"}}
	reg := prometheus.NewRegistry()
	deps := Deps{PG: db, Logger: testenv.Logger(t), Registerer: reg, DeadLetters: notifier.NewDeadLetters(notifier.DeadLettersDeps{PG: db})}
	for _, o := range opts {
		o(&cfg, &deps)
	}
	db = deps.PG.(*pgxpool.Pool) // sharedDB may have changed it
	srv, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: Serve stops after the clients below are closed.
	testenv.RunPart(t, "Serve", func(ctx context.Context) error { return srv.Serve(ctx, ln) }, 10*time.Second)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("/v1/", srv.Handler())
	mux.Handle("GET /openapi.json", srv.Handler())
	hs := httptest.NewServer(mux)

	e := &env{t: t, db: db, srv: srv, url: hs.URL, http: hs.Client(), reg: reg}
	if len(cfg.Tokens) > 0 {
		e.token = cfg.Tokens[0]
	}
	auth := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+e.token), method, req, reply, cc, opts...)
	}
	e.conn, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(auth))
	if err != nil {
		t.Fatal(err)
	}
	e.grpcAddr = ln.Addr().String()
	e.raw, err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.clients = locksv1.NewClientServiceClient(e.conn)
	e.sensors = locksv1.NewSensorServiceClient(e.conn)
	e.subs = locksv1.NewSubscriptionServiceClient(e.conn)
	e.state = locksv1.NewStateServiceClient(e.conn)
	e.history = locksv1.NewHistoryServiceClient(e.conn)
	t.Cleanup(func() {
		hs.Close()
		_ = e.conn.Close()
		_ = e.raw.Close()
	})
	return e
}

// resp is a REST answer.
type resp struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

func (r resp) str(k string) string {
	v, _ := r.body[k].(string)
	return v
}

// do sends a REST request with the env's token unless hdr sets Authorization ("" removes it).
// body may be nil, a string (sent as is) or a value to encode as JSON.
func (e *env) do(method, path string, body any, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if e.token != "" {
		req.Header.Set("Authorization", "Bearer "+e.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	res, err := e.http.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	r := resp{status: res.StatusCode, header: res.Header, raw: raw}
	if len(raw) > 0 && strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			e.t.Fatalf("%s %s: answer is not a JSON object: %v: %s", method, path, err, raw)
		}
	}
	return r
}

// want fails unless r has the status; for an error it also checks the {code, message,
// details} body and that the message contains each of words.
func (e *env) want(r resp, status int, words ...string) resp {
	e.t.Helper()
	if r.status != status {
		e.t.Fatalf("status %d, want %d: %s", r.status, status, r.raw)
	}
	if status >= 400 {
		if _, ok := r.body["code"].(float64); !ok {
			e.t.Fatalf("error body has no numeric code: %s", r.raw)
		}
		if _, ok := r.body["details"].([]any); !ok {
			e.t.Fatalf("error body has no details array: %s", r.raw)
		}
		for _, w := range words {
			if !strings.Contains(r.str("message"), w) {
				e.t.Fatalf("error message %q does not contain %q", r.str("message"), w)
			}
		}
	}
	return r
}

// fieldOf is the field named by the BadRequest detail of a 400, "" when there is none.
func fieldOf(r resp) string {
	ds, _ := r.body["details"].([]any)
	for _, d := range ds {
		m, _ := d.(map[string]any)
		vs, _ := m["field_violations"].([]any)
		for _, v := range vs {
			if f, ok := v.(map[string]any)["field"].(string); ok {
				return f
			}
		}
	}
	return ""
}

// wantCode fails unless err has code c and its message contains each of words.
func wantCode(t testing.TB, err error, c codes.Code, words ...string) *status.Status {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != c {
		t.Fatalf("code %s (%v), want %s", st.Code(), err, c)
	}
	for _, w := range words {
		if !strings.Contains(st.Message(), w) {
			t.Fatalf("message %q does not contain %q", st.Message(), w)
		}
	}
	return st
}

// setState writes a sensor_state row as the state projector would.
func (e *env) setState(id string, data int, connection string, revision int64) {
	e.t.Helper()
	_, err := e.db.Exec(context.Background(), `
		INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
		VALUES ($1, 0, $2, now(), now() - interval '1 second', now() - interval '1 minute', $3, $4, 1)
		ON CONFLICT (sensor_id) DO UPDATE SET data = $2, revision = $3, connection = $4`, id, data, revision, connection)
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// nopListener is a listener that is never used (for a call that must refuse it).
type nopListener struct{}

func (nopListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (nopListener) Close() error              { return nil }
func (nopListener) Addr() net.Addr            { return &net.TCPAddr{} }

// with is e reporting to t (a subtest or fuzz iteration).
func (e *env) with(t testing.TB) *env {
	c := *e
	c.t = t
	return &c
}

// metric is the value of a counter (or the sample count of a histogram) of the env's
// registry whose label values, in the order of the label names, are labels; 0 when none.
func (e *env) metric(name string, labels ...string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != labels[i] {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}
