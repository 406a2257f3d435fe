package alerter

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// child starts an alerter process configured by cfg, dying at crash point crash if set.
func (e *env) child(cfg Config, crash string) *testenv.Child {
	e.t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return testenv.StartChild(e.t, nil, childEnv+"=1", "ALERTER_TEST_PG="+e.pgURL, "ALERTER_TEST_NATS="+e.nats.URL,
		"ALERTER_TEST_CONFIG="+string(raw), crashpoint.Env+"="+crash)
}

// unsent counts the notices not marked sent.
func (e *env) unsent() int {
	e.t.Helper()
	var n int
	if err := e.pg.QueryRow(e.t.Context(), `SELECT count(*) FROM alert_notices WHERE sent_at IS NULL`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestKilledWhileSendingSendsAfterRestart kills the alerter process in the middle of an
// SMTP transaction (the message sent, the server's answer not yet given): a new process
// sends it, and the server accepts it once.
func TestKilledWhileSendingSendsAfterRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	cfg.Interval, cfg.SendTimeout = 200*time.Millisecond, 30*time.Second
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.smtp.setHold(func([]byte) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(entered)
		<-release
		return errors.New("the client went away")
	})
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	first := e.child(cfg, "")
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the child never sent the e-mail")
	}
	// The webhook goes its own way: let it finish, so that the kill hits only the e-mail.
	testenv.Eventually(t, 30*time.Second, "the webhook notice marked sent", func() bool { return e.unsent() == 1 })
	first.Kill()
	close(release)
	if n := len(e.smtp.got()); n != 0 {
		t.Fatalf("%d e-mails accepted before the restart, want 0", n)
	}
	e.child(cfg, "")
	testenv.Eventually(t, 30*time.Second, "the notices sent after the restart", func() bool { return e.unsent() == 0 })
	if m := e.smtp.got(); len(m) != 1 || m[0].id != "<alert_1_firing@lock-sensors>" || m[0].kind != KindEndpointDisabled {
		t.Errorf("e-mails %+v, want the firing notice once", m)
	}
	if h := e.hook.got(); len(h) != 1 || h[0].id != "alert_1_firing" {
		t.Errorf("webhooks %+v, want the firing notice once", h)
	}
}

// TestCrashAfterAcceptSendsAgainWithTheSameID kills the alerter between a channel's accept
// and the sent mark: the next process sends that notice again (at least once), with the
// same Message-ID and webhook-id so that the receiver can drop the copy.
func TestCrashAfterAcceptSendsAgainWithTheSameID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config()
	cfg.Interval = 200 * time.Millisecond
	cfg.WebhookURL, cfg.WebhookSecret = "", "" // one channel: the crash is after its send
	e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at) VALUES ('c1', 'c1', 'http://x', $1, now())`, testSecret)
	first := e.child(cfg, CrashAfterSend)
	testenv.Eventually(t, 30*time.Second, "the child to die at "+CrashAfterSend, first.Exited)
	if first.ExitCode() != crashpoint.ExitCode {
		t.Fatalf("child exit code %d, want %d", first.ExitCode(), crashpoint.ExitCode)
	}
	if n := e.unsent(); n != 1 {
		t.Fatalf("%d notices unsent after the crash, want 1", n)
	}
	e.child(cfg, "")
	testenv.Eventually(t, 30*time.Second, "the notice marked sent after the restart", func() bool { return e.unsent() == 0 })
	m := e.smtp.got()
	if len(m) != 2 || m[0].id != m[1].id || m[0].id != "<alert_1_firing@lock-sensors>" {
		t.Errorf("e-mails %+v, want the firing notice twice with one Message-ID", m)
	}
}
