package natsx_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// deploy/nats/accounts.conf is the generator's output for the default 16 partitions: the
// cluster's users and the embedded server's per-part users grant the same.
func TestAccountsConfIsGenerated(t *testing.T) {
	t.Parallel()
	got, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := natsx.AccountsConf(16)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatal("deploy/nats/accounts.conf differs from natsx.AccountsConf(16): run `go run ./cmd/locks nats-accounts --partition-count=16 > deploy/nats/accounts.conf`")
	}
}
