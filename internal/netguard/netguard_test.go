package netguard_test

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/netguard"
)

// Every refused range, at its edges where that matters, and public addresses next to them.
func TestReason(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		addr string
		want string // a word of the reason; "" = allowed
	}{
		{"127.0.0.1", "loopback"}, {"127.255.255.254", "loopback"}, {"::1", "loopback"},
		{"10.0.0.1", "private"}, {"172.16.0.1", "private"}, {"172.31.255.255", "private"}, {"192.168.1.1", "private"},
		{"169.254.169.254", "link-local"}, {"fe80::1", "link-local"}, {"fe80::1%eth0", "link-local"},
		{"100.64.0.1", "carrier-grade NAT"}, {"100.127.255.255", "carrier-grade NAT"},
		{"198.18.0.1", "benchmarking"}, {"198.19.255.255", "benchmarking"},
		{"192.88.99.1", "6to4 relay anycast"}, {"2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"}, {"2001::1", "Teredo"},
		{"192.0.0.1", "IETF"}, {"192.0.0.170", "IETF"},
		{"240.0.0.1", "reserved"}, {"254.1.2.3", "reserved"}, {"255.255.255.255", "broadcast"},
		{"224.0.0.1", "multicast"}, {"239.255.255.250", "multicast"}, {"ff02::1", "multicast"}, {"ff05::2", "multicast"},
		{"0.0.0.0", "unspecified"}, {"::", "unspecified"}, {"0.1.2.3", "this-network"},
		{"fc00::1", "private"}, {"fd12:3456::1", "private"},
		{"fec0::1", "site-local"}, {"feff::1", "site-local"},
		{"100::1", "discard"}, {"64:ff9b:1::a00:1", "NAT64"},
		// IPv6 forms that carry an IPv4 address are judged by it.
		{"::ffff:127.0.0.1", "loopback"}, {"::ffff:10.0.0.1", "private"}, {"::ffff:198.18.0.1", "benchmarking"},
		{"64:ff9b::10.0.0.1", "NAT64 form of 10.0.0.1"}, {"64:ff9b::127.0.0.1", "loopback"}, {"64:ff9b::169.254.169.254", "link-local"},
		{"2002:a00:1::1", "6to4 form of 10.0.0.1"}, {"2002:7f00:1::", "loopback"}, {"2002:a9fe:a9fe::1", "link-local"},
		{"::10.0.0.1", "IPv4-compatible form of 10.0.0.1"}, {"::127.0.0.1", "loopback"}, {"::192.168.0.1", "private"},
		// Public.
		{"8.8.8.8", ""}, {"93.184.216.34", ""}, {"203.0.113.7", ""}, {"1.1.1.1", ""},
		{"100.63.255.255", ""}, {"100.128.0.0", ""}, {"198.17.255.255", ""}, {"198.20.0.0", ""},
		{"172.32.0.1", ""}, {"192.0.1.1", ""}, {"223.255.255.255", ""},
		{"2606:4700::1111", ""}, {"2001:4860:4860::8888", ""}, {"192.88.98.255", ""}, {"192.88.100.0", ""}, {"2a00:1450:4001:82a::200e", ""}, {"::ffff:8.8.8.8", ""},
		{"64:ff9b::8.8.8.8", ""}, {"2002:808:808::1", ""}, {"::8.8.8.8", ""}, {"fbff::1", ""}, {"ff00::", "multicast"},
	} {
		t.Run(c.addr, func(t *testing.T) {
			t.Parallel()
			got := netguard.Reason(netip.MustParseAddr(c.addr))
			if (got == "") != (c.want == "") || !strings.Contains(got, c.want) {
				t.Fatalf("Reason(%s) = %q, want %q", c.addr, got, c.want)
			}
			err := netguard.Control("tcp", netip.AddrPortFrom(netip.MustParseAddr(c.addr), 443).String(), nil)
			if (err == nil) != (c.want == "") || (err != nil && !errors.Is(err, netguard.ErrForbidden)) {
				t.Fatalf("Control(%s) = %v, want refused: %v", c.addr, err, c.want != "")
			}
		})
	}
	if netguard.Reason(netip.Addr{}) == "" {
		t.Fatal("the zero Addr is allowed")
	}
}

// The dialer refuses before connecting: a listener on loopback gets no connection.
func TestControlRefusesTheDial(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{Control: netguard.Control}
	if c, err := d.DialContext(t.Context(), "tcp", ln.Addr().String()); !errors.Is(err, netguard.ErrForbidden) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial %s: %v, want ErrForbidden", ln.Addr(), err)
	}
}
