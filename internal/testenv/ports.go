package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// FreeAddr is a loopback address with a port that nothing listens on and that no other
// test process on this machine is handed while t runs.
//
// A port the kernel picks for a listener on port 0 comes from the ephemeral range, the
// same range it draws from for the local end of every outgoing connection: between the
// moment the probe closes and the moment the server under test binds, any client on the
// machine (a test's Postgres pool, a RabbitMQ channel) can take it. FreeAddr picks from
// below that range instead, where only listeners bind, and reserves the port with a lock
// file so that two test binaries running at once never pick the same one.
func FreeAddr(t testing.TB) string {
	t.Helper()
	lo, hi := listenerPorts()
	for range 200 {
		port := lo + rand.IntN(hi-lo)
		if !reservePort(t, port) {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken by a listener outside the tests; the reservation ends with t
		}
		_ = ln.Close()
		return addr
	}
	t.Fatalf("no free loopback port in %d-%d after 200 tries", lo, hi)
	return ""
}

// freePort is the port of FreeAddr.
func freePort(t testing.TB) int {
	_, p, _ := net.SplitHostPort(FreeAddr(t))
	n, _ := strconv.Atoi(p)
	return n
}

// listenerPorts is the range FreeAddr draws from: the ports below the kernel's ephemeral
// range, above the well-known and registered services' usual ones.
func listenerPorts() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				hi = n
			}
		}
	}
	return hi - 10000, hi
}

// reservePort takes an exclusive lock on the port's file in a directory every test process
// shares, held until t ends (or the process dies, when the kernel drops it).
func reservePort(t testing.TB, port int) bool {
	dir := filepath.Join(os.TempDir(), "locks-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("port reservations: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("port reservations: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return false
	}
	t.Cleanup(func() { _ = f.Close() })
	return true
}
