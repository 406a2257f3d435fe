package testenv

import (
	"net"
	"strconv"
	"testing"
)

// A port FreeAddr hands out lies below the kernel's ephemeral range, where no outgoing
// connection's local end can take it, and stays reserved until its test ends.
func TestFreeAddrIsReservedAndOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := listenerPorts()
	seen := map[int]bool{}
	for range 50 {
		_, p, err := net.SplitHostPort(FreeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < lo || port >= hi {
			t.Fatalf("port %d outside %d-%d", port, lo, hi)
		}
		if seen[port] {
			t.Fatalf("port %d handed out twice", port)
		}
		seen[port] = true
	}
	var held int
	for port := range seen {
		held = port
		break
	}
	// Another test (or test binary) asking for the same port is refused while t runs...
	t.Run("other", func(t *testing.T) {
		if reservePort(t, held) {
			t.Fatalf("port %d reserved twice", held)
		}
	})
	// ...and given it once the holder is done.
	var free int
	t.Run("holder", func(t *testing.T) { free = freePort(t) })
	t.Run("after", func(t *testing.T) {
		if !reservePort(t, free) {
			t.Fatalf("port %d still reserved after its test ended", free)
		}
	})
}
