package sdnotify_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/sdnotify"
)

func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func read(t *testing.T, l *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 256)
	if err := l.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := l.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

// systemd's side, as it listens: a datagram per state on a path socket and on an abstract one
// (NOTIFY_SOCKET=@name); nothing sent and no error without a socket; an error when the
// socket is gone.
func TestNotify(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "notify")
	l := listen(t, path)
	for _, state := range []string{sdnotify.Ready, sdnotify.Stopping} {
		if sent, err := sdnotify.Notify(path, state); !sent || err != nil {
			t.Fatalf("Notify(%s): %v %v", state, sent, err)
		}
		if got := read(t, l); got != state {
			t.Fatalf("systemd got %q, want %q", got, state)
		}
	}

	abstract := fmt.Sprintf("lock-sensors-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	la := listen(t, "\x00"+abstract)
	if sent, err := sdnotify.Notify("@"+abstract, sdnotify.Ready); !sent || err != nil {
		t.Fatalf("abstract: %v %v", sent, err)
	}
	if got := read(t, la); got != sdnotify.Ready {
		t.Fatalf("abstract: got %q", got)
	}

	if sent, err := sdnotify.Notify("", sdnotify.Ready); sent || err != nil {
		t.Fatalf("no socket: %v %v, want nothing sent, no error", sent, err)
	}
	if sent, err := sdnotify.Notify(filepath.Join(t.TempDir(), "gone"), sdnotify.Ready); sent || err == nil {
		t.Fatalf("missing socket: %v %v, want an error", sent, err)
	}
}
