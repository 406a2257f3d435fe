// Package freeport finds a TCP port for a server that is about to start, on a machine where
// many other processes open connections at the same time.
//
// A port the kernel picks for a listener on port 0 comes from the ephemeral range, the same
// range it draws from for the local end of every outgoing connection: between the moment a
// probe closes and the moment the server binds, any client on the machine can take it.
// Reserve picks from below that range instead, where only listeners bind, and takes a lock
// file per port so that two processes using this package never pick the same one.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Reserve returns host:port with a port nothing listens on, reserved against every other
// caller of Reserve on the machine until release is called (or the process ends).
func Reserve(host string) (addr string, release func(), err error) {
	lo, hi := portRange()
	if err := os.MkdirAll(filepath.Dir(lockPath(lo)), 0o777); err != nil {
		return "", nil, fmt.Errorf("port reservations: %w", err)
	}
	for range 200 {
		port := lo + rand.IntN(hi-lo)
		f, ok, err := lock(lockPath(port))
		if err != nil {
			return "", nil, err
		}
		if !ok {
			continue
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			_ = f.Close() // taken by a listener that does not use this package
			continue
		}
		_ = ln.Close()
		return addr, func() { _ = f.Close() }, nil
	}
	return "", nil, fmt.Errorf("no free port on %s in %d-%d after 200 tries", host, lo, hi)
}

// portRange is the ports Reserve draws from: the ten thousand below the kernel's ephemeral range.
func portRange() (lo, hi int) {
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

// lockPath is the file whose lock reserves port.
func lockPath(port int) string {
	return filepath.Join(os.TempDir(), "locks-ports", strconv.Itoa(port))
}

// lock takes an exclusive lock on the file at path without waiting; ok is false when another
// open file holds it.
func lock(path string) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false, fmt.Errorf("port reservations: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("port reservations: %w", err)
	}
	return f, true, nil
}
