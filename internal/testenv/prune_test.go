package testenv

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLeftover(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) string { return strconv.FormatInt(now.Add(-d).Unix(), 36) }
	for _, c := range []struct {
		name string
		want bool
	}{
		{Name("locks_test"), false},
		{"locks_test_" + at(7*time.Hour) + "_0a1b2c3d", true},
		{"locks_access_" + at(7*time.Hour) + "_0a1b2c3d", true},
		{"locks_test_" + at(5*time.Hour) + "_0a1b2c3d", false},
		{"locks_test_0a1b2c3d4e5f", false},                                   // unstamped: an older run's, left to a person
		{trashPrefix + "locks_test_" + at(7*time.Hour) + "_0a1b2c3d", false}, // the janitor's
		{"locks_tmpl_0a1b2c3d4e5f", false},
		{"locks", false},
		{"locks_test_" + at(7*time.Hour) + "_0a1b2c3d_x", false},
	} {
		if got := leftover(c.name, now); got != c.want {
			t.Errorf("leftover(%q) = %v, want %v", c.name, got, c.want)
		}
	}
	if n := Name("locks_test"); !stamped.MatchString(n) || strings.Count(n, "_") != 3 {
		t.Errorf("Name made %q, which the pruner does not read", n)
	}
}
