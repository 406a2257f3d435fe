package alerter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/internal/whsign"
)

const (
	// childEnv makes the test binary run the alerter as a child process (crash tests).
	childEnv    = "ALERTER_TEST_CHILD"
	testSecret  = "whsec_c2VjcmV0LWtleS1vZi10aGUtb3BlcmF0b3I="
	smtpUser    = "alerts"
	smtpPass    = "s3cret-pass"
	testEmailTo = "ops@example.com"
)

// TestMain runs the alerter as a child process when childEnv is set, configured by
// ALERTER_TEST_* variables, until SIGTERM or a crash point.
// The tests run side by side: they mostly wait for evaluation intervals and notices.
func TestMain(m *testing.M) {
	testenv.Parallel(8)
	testenv.ChildMain(m, childEnv, runChild)
}

func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	pool, err := pgxpool.New(ctx, os.Getenv("ALERTER_TEST_PG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	nc, err := natsx.Connect(os.Getenv("ALERTER_TEST_NATS"), "alerter-child", log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv("ALERTER_TEST_CONFIG")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	a, err := New(cfg, Deps{Logger: log, Registerer: prometheus.NewRegistry(), JS: js, PG: pool})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := a.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// backoffFast retries refused notices quickly in tests.
var backoffFast = backoff.Policy{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond}

// env is one test's servers: NATS with the streams, Postgres, an SMTP server and an
// operator webhook receiver.
type env struct {
	t     *testing.T
	nats  *testenv.NATSEnv
	pgURL string
	pg    *pgxpool.Pool
	smtp  *smtpServer
	hook  *hookReceiver
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, nats: testenv.NATS(t)}
	e.pgURL, e.pg = testenv.Postgres(t)
	if err := natsx.Declare(t.Context(), e.nats.JS, natsx.StreamsConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	e.smtp = newSMTPServer(t)
	e.hook = newHookReceiver(t)
	return e
}

// config is an alerter configuration sending to e's SMTP server and webhook receiver.
func (e *env) config() Config {
	return Config{Interval: 100 * time.Millisecond, Poll: 50 * time.Millisecond,
		// The test's server offers no STARTTLS.
		SMTPURL: "smtp://" + smtpUser + ":" + smtpPass + "@" + e.smtp.addr + "?tls=none",
		EmailTo: []string{testEmailTo}, EmailFrom: "Locks <locks@example.com>",
		WebhookURL: e.hook.URL, WebhookSecret: testSecret,
		Retry: backoffFast}
}

func (e *env) alerter(cfg Config, d Deps) (*Alerter, *prometheus.Registry) {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	if d.Logger == nil {
		d.Logger = testenv.Logger(e.t)
	}
	d.Registerer, d.JS, d.PG = reg, e.nats.JS, e.pg
	a, err := New(cfg, d)
	if err != nil {
		e.t.Fatal(err)
	}
	return a, reg
}

// standby waits until the alerter whose registry is active1 holds the lock, then runs a
// second alerter with cfg beside it, and returns that one's registry.
func (e *env) standby(cfg Config, active1 *prometheus.Registry) *prometheus.Registry {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, "alerter 1 active", func() bool { return metric(e.t, active1, "locks_alerter_active", nil) == 1 })
	a2, reg2 := e.alerter(cfg, Deps{})
	testenv.RunPart(e.t, "alerter 2", a2.Run, 15*time.Second)
	return reg2
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pg.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// received is one notice as a channel's receiver got it.
type received struct {
	id    string // Message-ID or webhook-id
	event string // firing or resolved
	kind  string
	subj  string
	// runbook is the webhook's alert.runbook_url, or the e-mail's "runbook: " line.
	runbook string
}

// smtpServer is an in-process SMTP server (go-smtp) that demands the test's credentials
// and keeps every message it accepted. hold, when set, is called in DATA before accepting.
type smtpServer struct {
	addr string
	mu   sync.Mutex
	msgs []received
	hold func(msg []byte) error
	// authFailures counts refused logins.
	authFailures int
}

func newSMTPServer(t *testing.T) *smtpServer {
	s := &smtpServer{}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &smtpSession{s: s}, nil }))
	srv.Domain, srv.AllowInsecureAuth = "localhost", true
	srv.ReadTimeout, srv.WriteTimeout = 30*time.Second, 30*time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *smtpServer) setHold(f func([]byte) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = f
}

func (s *smtpServer) got() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.msgs...)
}

type smtpSession struct {
	s      *smtpServer
	authed bool
	rcpt   []string
}

func (ss *smtpSession) AuthMechanisms() []string { return []string{sasl.Plain} }
func (ss *smtpSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != smtpUser || pass != smtpPass {
			ss.s.mu.Lock()
			ss.s.authFailures++
			ss.s.mu.Unlock()
			return errors.New("bad credentials")
		}
		ss.authed = true
		return nil
	}), nil
}
func (ss *smtpSession) Mail(string, *smtp.MailOptions) error {
	if !ss.authed {
		return &smtp.SMTPError{Code: 530, Message: "authentication required"}
	}
	return nil
}
func (ss *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.rcpt = append(ss.rcpt, to)
	return nil
}
func (ss *smtpSession) Reset()        { ss.rcpt = nil }
func (ss *smtpSession) Logout() error { return nil }
func (ss *smtpSession) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	ss.s.mu.Lock()
	hold := ss.s.hold
	ss.s.mu.Unlock()
	if hold != nil {
		if err := hold(raw); err != nil {
			return err
		}
	}
	m, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	if len(ss.rcpt) != 1 || ss.rcpt[0] != testEmailTo {
		return fmt.Errorf("recipients %v, want %s", ss.rcpt, testEmailTo)
	}
	// Subject: "[lock-sensors] FIRING kind subject".
	f := strings.Fields(m.Header.Get("Subject"))
	if len(f) != 4 {
		return fmt.Errorf("subject %q", m.Header.Get("Subject"))
	}
	body, _ := io.ReadAll(m.Body)
	var runbook string
	for _, l := range strings.Split(string(body), "\r\n") {
		if u, ok := strings.CutPrefix(l, "runbook: "); ok {
			runbook = u
		}
	}
	ss.s.mu.Lock()
	ss.s.msgs = append(ss.s.msgs, received{id: m.Header.Get("Message-ID"), event: strings.ToLower(f[1]), kind: f[2], subj: f[3], runbook: runbook})
	ss.s.mu.Unlock()
	return nil
}

// hookReceiver is the operator's webhook receiver: it verifies every signature, and keeps
// the notices it answered 2xx to. status, when set, chooses the answer.
type hookReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	notices  []received
	badSigs  int
	status   func(n int) int
	requests int
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id, ts := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp")
		var tsN int64
		_, _ = fmt.Sscan(ts, &tsN)
		want, _ := whsign.Signature(testSecret, "", time.Time{}, time.Now(), id, tsN, body)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.requests++
		if r.Header.Get("webhook-signature") != want {
			h.badSigs++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		code := http.StatusOK
		if h.status != nil {
			code = h.status(h.requests)
		}
		w.WriteHeader(code)
		if code/100 != 2 {
			return
		}
		var b WebhookBody
		if err := json.Unmarshal(body, &b); err != nil || b.ID != id {
			h.badSigs++
			return
		}
		h.notices = append(h.notices, received{id: id, event: strings.TrimPrefix(b.Type, "alert."), kind: b.Alert.Kind, subj: b.Alert.Subject, runbook: b.Alert.RunbookURL})
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookReceiver) got() []received {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]received(nil), h.notices...)
}

// count is how many of got are (kind, subject, event).
func count(got []received, kind, subject, event string) int {
	n := 0
	for _, r := range got {
		if r.kind == kind && r.subj == subject && r.event == event {
			n++
		}
	}
	return n
}

// metric is the value of a counter or gauge of reg (summed over labels matching labels).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, want := range labels {
				for _, l := range m.GetLabel() {
					if l.GetName() == k && l.GetValue() != want {
						continue next
					}
				}
			}
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}

// moreEvaluations waits for n more evaluations of the alerter registered in reg.
func (e *env) moreEvaluations(reg *prometheus.Registry, n int) {
	e.t.Helper()
	from := metric(e.t, reg, "locks_alert_evaluations_total", nil)
	testenv.Eventually(e.t, 30*time.Second, fmt.Sprintf("%d more evaluations", n), func() bool {
		return metric(e.t, reg, "locks_alert_evaluations_total", nil) >= from+float64(n)
	})
}
