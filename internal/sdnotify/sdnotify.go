// Package sdnotify tells systemd how a service is doing, as sd_notify(3) does: one datagram
// per state change on the unix socket systemd names in $NOTIFY_SOCKET. A unit with
// Type=notify is "started" (and the units ordered after it start) only once the process has
// sent READY=1, instead of as soon as it was forked.
package sdnotify

import (
	"net"
	"os"
)

// States a service sends (sd_notify(3)).
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// SocketEnv names the variable systemd sets for a Type=notify service.
const SocketEnv = "NOTIFY_SOCKET"

// Notify sends state to the socket named by socket (the value of $NOTIFY_SOCKET). It reports
// false, and does nothing, when socket is empty: not run by systemd, or not as Type=notify.
// A socket starting with "@" is in Linux's abstract namespace.
func Notify(socket, state string) (bool, error) {
	if socket == "" {
		return false, nil
	}
	addr := &net.UnixAddr{Name: socket, Net: "unixgram"}
	if socket[0] == '@' {
		addr.Name = "\x00" + socket[1:]
	}
	c, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return false, err
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return false, err
	}
	return true, nil
}

// FromEnv is Notify on the socket of $NOTIFY_SOCKET.
func FromEnv(state string) (bool, error) { return Notify(os.Getenv(SocketEnv), state) }
