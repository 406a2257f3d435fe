package natsx

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MinServerVersion is the oldest NATS server this system runs against. 2.11 brought
// per-message TTLs and the limit markers the liveness bucket expires keys with; the rest it
// uses is older (subject transforms with partition() and multi-filter consumers since 2.10,
// direct gets since 2.9). An older server would accept the streams and ignore the TTLs, so
// no sensor would ever be declared lost.
const MinServerVersion = "2.11.0"

// CheckServerVersion refuses a server version (nats.Conn.ConnectedServerVersion) older than
// MinServerVersion, or one it cannot read, in one line saying what to do.
func CheckServerVersion(v string) error {
	need, _ := parseVersion(MinServerVersion)
	got, ok := parseVersion(v)
	if !ok {
		return fmt.Errorf("NATS server version %q is unreadable; this system needs %s or later", v, MinServerVersion)
	}
	if slices.Compare(got[:], need[:]) < 0 {
		return fmt.Errorf("NATS server %s is too old: this system needs %s or later "+
			"(per-message TTLs and limit markers for sensor liveness); upgrade the servers", v, MinServerVersion)
	}
	return nil
}

// parseVersion reads major.minor.patch, with an optional leading "v" and a pre-release or
// build suffix ("2.12.0-RC.1") that does not change the feature set it is checked for.
func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}
