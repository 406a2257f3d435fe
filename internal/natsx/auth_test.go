package natsx_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The embedded server admits only the credential it made in its data dir: a client without
// it, or with another data dir's, is refused; the process's own (EmbeddedAuth) is accepted.
// The credential is made once, readable by its owner only, and kept across restarts.
func TestEmbeddedRequiresItsCredential(t *testing.T) {
	t.Parallel()
	dir, other := t.TempDir(), t.TempDir()
	if _, err := natsx.EmbeddedUser(other); err != nil {
		t.Fatal(err)
	}
	log := testenv.Logger(t)
	var first []byte
	for run := range 2 {
		ns, err := natsx.Embedded(dir, "127.0.0.1:0", natsx.Sync{Always: true}, 4, log)
		if err != nil {
			t.Fatal(err)
		}
		url := ns.ClientURL()
		if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil || !errors.Is(err, nats.ErrAuthorization) {
			if nc != nil {
				nc.Close()
			}
			t.Fatalf("run %d: connect without a credential: %v, want an authorization violation", run, err)
		}
		opts, err := natsx.EmbeddedAuth(other).Options()
		if err != nil {
			t.Fatal(err)
		}
		if nc, err := nats.Connect(url, append(opts, nats.MaxReconnects(0))...); err == nil || !errors.Is(err, nats.ErrAuthorization) {
			if nc != nil {
				nc.Close()
			}
			t.Fatalf("run %d: connect with another data dir's credential: %v, want an authorization violation", run, err)
		}
		opts, err = natsx.EmbeddedAuth(dir).Options()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := natsx.Connect(url, "own", log, opts...)
		if err != nil {
			t.Fatalf("run %d: connect with the data dir's credential: %v", run, err)
		}
		if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
			t.Fatalf("run %d: JetStream with the data dir's credential: %v", run, err)
		}
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()

		fi, err := os.Stat(natsx.EmbeddedNkeyFile(dir))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("credential file mode %v, want 0600", fi.Mode().Perm())
		}
		seed, _ := os.ReadFile(natsx.EmbeddedNkeyFile(dir))
		if run == 0 {
			first = seed
		} else if string(seed) != string(first) {
			t.Fatal("a restart made a new credential; clients holding the first would be locked out")
		}
	}
}

// The credential options refuse what cannot work before dialling, naming no secret.
func TestAuthOptionsRefuseBadFiles(t *testing.T) {
	t.Parallel()
	for _, a := range []natsx.Auth{
		{Creds: "/nonexistent/x.creds"},
		{Nkey: "/nonexistent/x.nk"},
		{CA: "/nonexistent/ca.pem"},
		{Cert: "/nonexistent/c.pem"},
		{Cert: "/nonexistent/c.pem", Key: "/nonexistent/k.pem"},
		{Creds: "a", Nkey: "b"},
	} {
		if _, err := a.Options(); err == nil {
			t.Errorf("%+v: no error", a)
		}
	}
}
