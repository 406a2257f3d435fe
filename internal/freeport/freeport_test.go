package freeport

import (
	"net"
	"strconv"
	"testing"
)

// A reserved port lies below the kernel's ephemeral range, where no outgoing connection's
// local end can take it, and no other caller gets it until it is released.
func TestReserveIsExclusiveAndOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := portRange()
	held := map[int]func(){}
	for range 50 {
		addr, release, err := Reserve("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if port < lo || port >= hi {
			t.Fatalf("port %d outside %d-%d", port, lo, hi)
		}
		if held[port] != nil {
			t.Fatalf("port %d handed out twice", port)
		}
		held[port] = release
	}
	for port, release := range held {
		f, ok, err := lock(lockPath(port))
		if err != nil || ok {
			t.Fatalf("port %d: locked again while held (ok %v, err %v)", port, ok, err)
		}
		release()
		f, ok, err = lock(lockPath(port))
		if err != nil || !ok {
			t.Fatalf("port %d: not free after its release (ok %v, err %v)", port, ok, err)
		}
		_ = f.Close()
	}
}

// A port some other server listens on is never handed out.
func TestReserveSkipsPortsInUse(t *testing.T) {
	lo, hi := portRange()
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	busy := map[string]bool{}
	// A hundred servers spread over the range: 200 draws that did not check would hit one
	// of them most of the time.
	for p := lo; p < hi && len(lns) < 100; p += (hi - lo) / 100 {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		lns = append(lns, ln)
		busy[ln.Addr().String()] = true
	}
	for range 200 {
		addr, release, err := Reserve("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		release()
		if busy[addr] {
			t.Fatalf("%s handed out while a server listens on it", addr)
		}
	}
}
