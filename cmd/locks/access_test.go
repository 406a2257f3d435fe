package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// natsUsers are the users of deploy/nats/accounts.conf.
var natsUsers = []string{"admin", "bridge", "state", "history", "notifier", "watchdog", "api", "alerter"}

// accessServer is a NATS server loaded with deploy/nats/accounts.conf, as a cluster's node
// includes it, with a password per user.
type accessServer struct {
	srv  *server.Server
	pass map[string]string
}

func startAccessServer(t *testing.T) *accessServer {
	t.Helper()
	conf, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := &accessServer{pass: map[string]string{}}
	// The committed file reads the passwords from variables; defined here at its top, since
	// an included file does not see its includer's variables (only the environment).
	var vars strings.Builder
	for _, u := range natsUsers {
		a.pass[u] = "pw-" + u + "-" + testenv.Name("x")
		fmt.Fprintf(&vars, "LOCKS_NATS_%s_PASSWORD: %q\n", strings.ToUpper(u), a.pass[u])
	}
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), append([]byte(vars.String()), conf...), 0o600); err != nil {
		t.Fatal(err)
	}
	main := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream {store_dir: %q}\ninclude ./accounts.conf\n", filepath.Join(dir, "js"))
	if err := os.WriteFile(filepath.Join(dir, "server.conf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "server.conf"))
	if err != nil {
		t.Fatalf("deploy/nats/accounts.conf: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	a.srv, err = server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go a.srv.Start()
	if !a.srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS not ready within 10 s")
	}
	t.Cleanup(a.srv.Shutdown)
	return a
}

// url is the server's URL with user's password in it (the way LOCKS_NATS_URL carries one).
func (a *accessServer) url(user string) string {
	return strings.Replace(a.srv.ClientURL(), "nats://", "nats://"+user+":"+a.pass[user]+"@", 1)
}

// violations collects the permissions violations the server reports to a connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		v.mu.Lock()
		v.errs = append(v.errs, err.Error())
		v.mu.Unlock()
	}
}

func (v *violations) about(subject string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range v.errs {
		if strings.Contains(e, subject) {
			return true
		}
	}
	return false
}

func (a *accessServer) connect(t *testing.T, user string) (jetstream.JetStream, *violations) {
	t.Helper()
	v := &violations{}
	opts := []nats.Option{nats.ErrorHandler(v.handler)}
	if user != "admin" {
		opts = append(opts, nats.CustomInboxPrefix(natsx.InboxPrefix(user)))
	}
	return testenv.JetStream(t, a.url(user), "test-"+user, opts...), v
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// Issue 15's must-show: a client without credentials, or with the wrong part's credentials,
// cannot publish to READINGS or EVENTS: the server refuses the connection, or the publish
// with a permissions violation, and the stream's message count does not move. The parts
// allowed to append (the bridge and the watchdog to READINGS, the state projector to EVENTS)
// can, so the refusals are the permissions' doing.
func TestOnlyTheRightPartsMayAppend(t *testing.T) {
	t.Parallel()
	a := startAccessServer(t)
	admin, _ := a.connect(t, "admin")
	if err := natsx.Declare(t.Context(), admin, natsx.StreamsConfig{Partitions: 4, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}

	for _, url := range []string{a.srv.ClientURL(), strings.Replace(a.url("bridge"), a.pass["bridge"], "wrong", 1)} {
		nc, err := nats.Connect(url, nats.MaxReconnects(0))
		if err == nil {
			nc.Close()
			t.Fatalf("connected to %s without a valid credential", url)
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect without a valid credential: %v, want an authorization violation", err)
		}
	}

	readings := natsx.ReadingsSubject("door1")
	events := natsx.EventsSubject(0, "door1")
	for _, c := range []struct {
		user, subject, stream string
		allowed               bool
	}{
		{"bridge", readings, natsx.ReadingsStream, true},
		{"watchdog", readings, natsx.ReadingsStream, true},
		{"state", events, natsx.EventsStream, true},
		{"bridge", events, natsx.EventsStream, false},
		{"watchdog", events, natsx.EventsStream, false},
		{"notifier", events, natsx.EventsStream, false},
		{"history", events, natsx.EventsStream, false},
		{"api", events, natsx.EventsStream, false},
		{"history", readings, natsx.ReadingsStream, false},
		{"state", readings, natsx.ReadingsStream, false},
		{"notifier", readings, natsx.ReadingsStream, false},
		{"api", readings, natsx.ReadingsStream, false},
	} {
		t.Run(c.user+" to "+c.stream, func(t *testing.T) {
			if !c.allowed {
				// A refused publish waits out its timeout. The refusals run side by side
				// after the allowed appends, so nothing moves the counts they compare.
				t.Parallel()
			}
			js, v := a.connect(t, c.user)
			before := streamMsgs(t, admin, c.stream)
			ctx, cancel := contextWithTimeout(t, 2*time.Second)
			_, err := js.Publish(ctx, c.subject, []byte(`{"forged":true}`))
			cancel()
			after := streamMsgs(t, admin, c.stream)
			if c.allowed {
				if err != nil || after != before+1 {
					t.Fatalf("%s publishing to %s: %v, %s went %d → %d; want it stored", c.user, c.subject, err, c.stream, before, after)
				}
				return
			}
			if err == nil || after != before {
				t.Fatalf("%s publishing to %s: err %v, %s went %d → %d; want it refused", c.user, c.subject, err, c.stream, before, after)
			}
			testenv.Eventually(t, 5*time.Second, "the server's permissions violation for "+c.subject, func() bool { return v.about(c.subject) })
		})
	}
}

func contextWithTimeout(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}

// embeddedJS connects to the embedded server of a `locks run` with data dir dataDir listening
// on listen, with the credential that run keeps there, as `locks replay` does.
func embeddedJS(t *testing.T, dataDir, listen, name string) jetstream.JetStream {
	t.Helper()
	opts, err := natsx.EmbeddedAuth(dataDir).Options()
	if err != nil {
		t.Fatal(err)
	}
	return testenv.JetStream(t, "nats://"+listen, name, opts...)
}
