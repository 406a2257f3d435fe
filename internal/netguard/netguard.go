// Package netguard decides which IP addresses a webhook may reach. The API judges a
// webhook_url with it when the URL is stored, and the notifier judges the resolved address
// again when it connects (DNS may answer differently later, or rebind between a check and a
// dial), so both must agree on one list; it lives here, once.
package netguard

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// ErrForbidden says an address is loopback, private or otherwise not a public destination.
var ErrForbidden = errors.New("address is loopback, private or otherwise not public")

type blocked struct {
	p   netip.Prefix
	why string
}

func r(prefix, why string) blocked { return blocked{netip.MustParsePrefix(prefix), why} }

// ranges are the destinations a webhook must not reach, most specific first where they
// nest. Each is either the local machine or network, or an address that reaches nothing on
// the public internet (so a URL naming it is a probe, not a receiver).
var ranges = []blocked{
	r("0.0.0.0/32", "unspecified"),
	r("0.0.0.0/8", "this-network"),
	r("10.0.0.0/8", "private"),
	r("100.64.0.0/10", "carrier-grade NAT"),
	r("127.0.0.0/8", "loopback"),
	r("169.254.0.0/16", "link-local"),
	r("172.16.0.0/12", "private"),
	r("192.0.0.0/24", "IETF protocol assignments"),
	r("192.88.99.0/24", "6to4 relay anycast"), // deprecated (RFC 7526); relays reach anywhere
	r("192.168.0.0/16", "private"),
	r("198.18.0.0/15", "benchmarking"),
	r("224.0.0.0/4", "multicast"),
	r("255.255.255.255/32", "broadcast"),
	r("240.0.0.0/4", "reserved"),

	r("::/128", "unspecified"),
	r("::1/128", "loopback"),
	r("64:ff9b:1::/48", "local-use NAT64"),
	r("100::/64", "discard-only"),
	// Teredo carries an obfuscated IPv4 address and is reached through a relay that tunnels
	// to it: the address a connection ends at is not the one judged.
	r("2001::/32", "Teredo"),
	r("fc00::/7", "private"), // unique local
	r("fe80::/10", "link-local"),
	r("fec0::/10", "site-local"),
	r("ff00::/8", "multicast"),
}

// embedding are IPv6 ranges that carry an IPv4 address, which a gateway (NAT64, a 6to4
// relay) or the host's own stack may turn into a connection to that IPv4 address: they are
// judged by the address they carry. IPv4-mapped ::ffff:a.b.c.d is unmapped before any check.
var embedding = []struct {
	p    netip.Prefix
	kind string
	at   int // byte offset of the IPv4 address
}{
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64", 12},
	{netip.MustParsePrefix("2002::/16"), "6to4", 2},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible", 12}, // after :: and ::1 above
}

// Reason says why a is not a public address ("loopback", "private", …), or "" when a
// webhook may reach it.
func Reason(a netip.Addr) string {
	if !a.IsValid() {
		return "invalid"
	}
	// A prefix never contains an address with a zone (fe80::1%eth0): judge it without.
	a = a.WithZone("").Unmap()
	for _, b := range ranges {
		if b.p.Contains(a) {
			return b.why
		}
	}
	if a.Is6() {
		b := a.As16()
		for _, e := range embedding {
			if e.p.Contains(a) {
				v4 := netip.AddrFrom4([4]byte(b[e.at : e.at+4]))
				if why := Reason(v4); why != "" {
					return fmt.Sprintf("%s (%s form of %s)", why, e.kind, v4)
				}
				return ""
			}
		}
	}
	return ""
}

// Control is a net.Dialer Control function that refuses to connect to an address Reason
// refuses: it sees the address the dialer is about to connect to, after DNS.
func Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrForbidden, address)
	}
	if why := Reason(ap.Addr()); why != "" {
		return fmt.Errorf("%w: %s is %s", ErrForbidden, ap.Addr(), why)
	}
	return nil
}
