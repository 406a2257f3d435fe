package ui

import (
	"testing"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// An endpoint is failing when attempts failed and deliveries are dead or waiting for a
// retry; failed attempts alone (since delivered) or waiting deliveries alone are not.
func TestClientStatFailing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		stats *locksv1.ClientStats
		want  bool
	}{
		{"stats unread", nil, false},
		{"all delivered", &locksv1.ClientStats{Delivered: 5}, false},
		{"failed, then delivered", &locksv1.ClientStats{Delivered: 5, FailedAttempts: 2, Retried: 1}, false},
		{"waiting, never attempted", &locksv1.ClientStats{Pending: 3}, false},
		{"failed and waiting for a retry", &locksv1.ClientStats{FailedAttempts: 1, Pending: 1}, true},
		{"failed and dead", &locksv1.ClientStats{FailedAttempts: 2, Dead: 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (clientStat{ClientStats: tc.stats}).Failing(); got != tc.want {
				t.Errorf("Failing() = %v, want %v", got, tc.want)
			}
		})
	}
}
