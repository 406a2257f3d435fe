package testenv

import (
	"net"
	"strconv"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/freeport"
)

// FreeAddr is a loopback address with a port that nothing listens on, outside the range the
// kernel takes outgoing connections' ports from, and that no other test process on this
// machine is handed while t runs (freeport).
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, release, err := freeport.Reserve("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return addr
}

// freePort is the port of FreeAddr.
func freePort(t testing.TB) int {
	_, p, _ := net.SplitHostPort(FreeAddr(t))
	n, _ := strconv.Atoi(p)
	return n
}
