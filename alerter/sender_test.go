package alerter

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestRateLimitHoldsBackWithoutDropping fires five alerts with a limit of three notices a
// minute: three go out per channel, the other two wait (and are counted as waiting), and
// once the minute has passed (the sent marks moved back a minute) they go too.
func TestRateLimitHoldsBackWithoutDropping(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	cfg.MaxPerMinute = 3
	a, reg := e.alerter(cfg, Deps{})
	testenv.RunPart(t, "alerter", a.Run, 15*time.Second)
	for i := range 5 {
		e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ($1, $1, 'http://x', $2, now())`,
			fmt.Sprintf("c%d", i), testSecret)
	}
	testenv.Eventually(t, 20*time.Second, "three notices per channel", func() bool {
		return len(e.smtp.got()) == 3 && len(e.hook.got()) == 3
	})
	e.moreEvaluations(reg, 5)
	for _, ch := range []string{channelEmail, channelWebhook} {
		if w := metric(t, reg, "locks_alert_notices_waiting", map[string]string{"channel": ch}); w != 2 {
			t.Errorf("%s: %v notices waiting, want 2", ch, w)
		}
	}
	if m, h := len(e.smtp.got()), len(e.hook.got()); m != 3 || h != 3 {
		t.Fatalf("within the minute: %d e-mails, %d webhooks; want 3 each", m, h)
	}
	// The minute passes.
	e.exec(`UPDATE alert_notices SET sent_at = sent_at - interval '1 minute' WHERE sent_at IS NOT NULL`)
	testenv.Eventually(t, 20*time.Second, "the two held notices per channel", func() bool {
		return len(e.smtp.got()) == 5 && len(e.hook.got()) == 5
	})
	for i := range 5 {
		subject := fmt.Sprintf("client/c%d", i)
		if count(e.smtp.got(), KindEndpointDisabled, subject, eventFiring) != 1 || count(e.hook.got(), KindEndpointDisabled, subject, eventFiring) != 1 {
			t.Errorf("%s: not received once on each channel", subject)
		}
	}
}

// TestRefusedNoticeIsRetriedInOrder: the webhook receiver refuses the first two attempts;
// the notice is tried again until accepted, and the one written after it waits for it.
func TestRefusedNoticeIsRetriedInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.hook.mu.Lock()
	e.hook.status = func(n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	}
	e.hook.mu.Unlock()
	cfg := e.config()
	a, _ := e.alerter(cfg, Deps{})
	testenv.RunPart(t, "alerter", a.Run, 15*time.Second)
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	testenv.Eventually(t, 20*time.Second, "the firing notice by webhook", func() bool { return len(e.hook.got()) == 1 })
	e.exec(`UPDATE clients SET disabled_at = NULL`)
	testenv.Eventually(t, 20*time.Second, "the resolved notice by webhook", func() bool { return len(e.hook.got()) == 2 })
	got := e.hook.got()
	if got[0].event != eventFiring || got[1].event != eventResolved {
		t.Errorf("webhooks %+v, want firing then resolved", got)
	}
	var attempts int
	if err := e.pg.QueryRow(t.Context(), `SELECT attempts FROM alert_notices WHERE channel = 'webhook' AND event = 'firing'`).Scan(&attempts); err != nil || attempts != 3 {
		t.Errorf("firing webhook notice: %d attempts (%v), want 3", attempts, err)
	}
}

// TestOneActiveAlerter runs two alerters on one database: one holds the lock and sends, the
// other waits; when the first stops, the second takes over, and no notice goes twice.
func TestOneActiveAlerter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	a1, reg1 := e.alerter(cfg, Deps{})
	stop1 := testenv.RunPart(t, "alerter 1", a1.Run, 15*time.Second)
	reg2 := e.standby(cfg, reg1)
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	testenv.Eventually(t, 20*time.Second, "the firing notices", func() bool { return len(e.smtp.got()) == 1 && len(e.hook.got()) == 1 })
	if metric(t, reg2, "locks_alerter_active", nil) != 0 || metric(t, reg2, "locks_alert_evaluations_total", nil) != 0 {
		t.Fatal("alerter 2 evaluated while alerter 1 held the lock")
	}
	stop1()
	testenv.Eventually(t, 20*time.Second, "alerter 2 active", func() bool { return metric(t, reg2, "locks_alerter_active", nil) == 1 })
	e.exec(`UPDATE clients SET disabled_at = NULL`)
	testenv.Eventually(t, 20*time.Second, "the resolved notices", func() bool { return len(e.smtp.got()) == 2 && len(e.hook.got()) == 2 })
	e.moreEvaluations(reg2, 3)
	if len(e.smtp.got()) != 2 || len(e.hook.got()) != 2 {
		t.Errorf("e-mails %+v, webhooks %+v; want firing and resolved once each", e.smtp.got(), e.hook.got())
	}
}

// TestStopMidSendSendsOnce stops the active alerter while its webhook notice is in flight:
// the receiver has the notice and has not answered yet. The stop lets the send finish and be
// marked before the lock is given up, so the alerter that takes over sends nothing again.
func TestStopMidSendSendsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	a1, reg1 := e.alerter(cfg, Deps{})
	// Run by hand, not by RunPart: its stop waits for Run, which here waits for the
	// receiver that calls the stop.
	ctx1, stop1 := context.WithCancel(t.Context())
	defer stop1()
	done1 := make(chan error, 1)
	go func() { done1 <- a1.Run(ctx1) }()
	reg2 := e.standby(cfg, reg1)

	// The first webhook request stops alerter 1 before the receiver answers it.
	e.hook.mu.Lock()
	e.hook.status = func(n int) int {
		if n == 1 {
			stop1()
		}
		return http.StatusNoContent
	}
	e.hook.mu.Unlock()
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	select {
	case err := <-done1:
		if err != nil {
			t.Fatalf("alerter 1: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("alerter 1 did not stop within 20 s of the webhook request that stopped it")
	}
	if n := metric(t, reg1, "locks_alert_notices_sent_total", map[string]string{"channel": "webhook"}); n != 1 {
		t.Fatalf("alerter 1 marked %v webhook notices sent; want the one in flight at its stop", n)
	}
	testenv.Eventually(t, 20*time.Second, "alerter 2 active", func() bool { return metric(t, reg2, "locks_alerter_active", nil) == 1 })
	testenv.Eventually(t, 20*time.Second, "the firing e-mail", func() bool { return len(e.smtp.got()) >= 1 })
	e.moreEvaluations(reg2, 3)
	if len(e.smtp.got()) != 1 || len(e.hook.got()) != 1 {
		t.Errorf("e-mails %+v, webhooks %+v; want the firing notice once on each channel", e.smtp.got(), e.hook.got())
	}
}

// TestFailuresDoNotShowSecrets: a refused SMTP login and an unreachable webhook whose URL
// carries a token are recorded and logged without the password or the token.
func TestFailuresDoNotShowSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	cfg.SMTPURL = "smtp://" + smtpUser + ":wrong-pass-0xdead@" + e.smtp.addr + "?tls=none"
	cfg.WebhookURL = "http://" + testenv.FreeAddr(t) + "/hook?token=tok-0xbeef"
	logs := &lockedBuffer{}
	a, _ := e.alerter(cfg, Deps{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	testenv.RunPart(t, "alerter", a.Run, 15*time.Second)
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	var errs []string
	testenv.Eventually(t, 20*time.Second, "both notices failing", func() bool {
		rows, err := e.pg.Query(t.Context(), `SELECT last_error FROM alert_notices WHERE last_error IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		errs, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err == nil && len(errs) == 2
	})
	for _, s := range append(errs, logs.String()) {
		if strings.Contains(s, "wrong-pass-0xdead") || strings.Contains(s, "tok-0xbeef") {
			t.Errorf("a secret is shown: %s", s)
		}
	}
}

// lockedBuffer is a log sink the test reads while the alerter writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Issue 25, item 10: the operator webhook's client is the client webhooks' guarded one: a
// redirect is the receiver's answer (the notice fails with its status), never followed to
// an address nobody chose; and the token in the URL's path never shows in the recorded error
// or the log (item 7).
func TestWebhookRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var elsewhere atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(target.Close)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/stolen", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirector.Close)
	cfg := e.config()
	cfg.SMTPURL, cfg.EmailTo = "", nil
	cfg.WebhookURL = redirector.URL + "/services/T0/sec-0xpath"
	logs := &lockedBuffer{}
	a, _ := e.alerter(cfg, Deps{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	testenv.RunPart(t, "alerter", a.Run, 15*time.Second)
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	var errs []string
	testenv.Eventually(t, 20*time.Second, "the notice failing", func() bool {
		rows, err := e.pg.Query(t.Context(), `SELECT last_error FROM alert_notices WHERE last_error IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		errs, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err == nil && len(errs) >= 1
	})
	if !strings.Contains(errs[0], "307") {
		t.Errorf("the notice's error %q does not name the redirect's status", errs[0])
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect was followed: its target got %d requests", n)
	}
	for _, s := range append(errs, logs.String()) {
		if strings.Contains(s, "sec-0xpath") {
			t.Errorf("the webhook path's token is shown: %s", s)
		}
	}
}

// Issue 25, item 10: smtp:// requires STARTTLS unless the URL says tls=none. A server that
// does not offer it (or a network that strips the offer) gets no login and no message; the
// notice fails saying why.
func TestEmailRequiresSTARTTLS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	cfg.WebhookURL, cfg.WebhookSecret = "", ""
	cfg.SMTPURL = "smtp://" + smtpUser + ":not-the-pass@" + e.smtp.addr
	a, _ := e.alerter(cfg, Deps{})
	testenv.RunPart(t, "alerter", a.Run, 15*time.Second)
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	var errs []string
	testenv.Eventually(t, 20*time.Second, "the notice failing", func() bool {
		rows, err := e.pg.Query(t.Context(), `SELECT last_error FROM alert_notices WHERE last_error IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		errs, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err == nil && len(errs) >= 1
	})
	if !strings.Contains(errs[0], "STARTTLS") {
		t.Errorf("the notice's error %q does not say STARTTLS is missing", errs[0])
	}
	e.smtp.mu.Lock()
	tried := e.smtp.authFailures
	e.smtp.mu.Unlock()
	if tried != 0 || len(e.smtp.got()) != 0 {
		t.Fatalf("without TLS the server got %d logins and %d messages, want none", tried, len(e.smtp.got()))
	}
}
