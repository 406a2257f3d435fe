package natsx_test

import (
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func TestCheckServerVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v  string
		ok bool
	}{
		{"2.11.0", true},
		{"2.11.12", true},
		{"v2.12.1", true},
		{"2.15.2", true},
		{"2.12.0-RC.3", true},
		{"3.0.0", true},
		{"2.10.29", false},
		{"2.9.25", false},
		{"1.99.99", false},
		{"", false},
		{"2.11", false},
		{"two.eleven.zero", false},
	} {
		err := natsx.CheckServerVersion(tc.v)
		if (err == nil) != tc.ok {
			t.Errorf("CheckServerVersion(%q) = %v, want ok=%t", tc.v, err, tc.ok)
		}
		if err != nil && (strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), natsx.MinServerVersion)) {
			t.Errorf("CheckServerVersion(%q) = %q, want one line naming %s", tc.v, err, natsx.MinServerVersion)
		}
	}
}

// The server this module embeds, and tests against, is one the check lets through.
func TestCheckServerVersionOfEmbedded(t *testing.T) {
	t.Parallel()
	env := testenv.NATS(t)
	if err := natsx.CheckServerVersion(env.NC.ConnectedServerVersion()); err != nil {
		t.Fatal(err)
	}
}
