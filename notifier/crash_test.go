package notifier

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// child starts a notifier process; env adds variables (NAME=value) to its environment.
func (e *env) child(schedule, crash string, env ...string) *testenv.Child {
	e.t.Helper()
	out := testenv.ChildLog(e.t, "child: ", func(l string) bool { return strings.Contains(l, "EVENTS consumer") })
	return testenv.StartChild(e.t, out, append([]string{childEnv + "=1",
		"LOCKS_POSTGRES_URL=" + e.pgURL, "LOCKS_NATS_URL=" + e.nats.URL, "LOCKS_RETRY_SCHEDULE=" + schedule,
		"LOCKS_WEBHOOK_ALLOW_PRIVATE=true", "LOCKS_WEBHOOK_TIMEOUT=1s", "LOCKS_PARTITIONS=4",
		crashpoint.Env + "=" + crash}, env...)...)
}

// TestCrashAndNATSRestart kills the notifier at its worst moments, restarts NATS, starts a
// new notifier, and counts: every attempt still happens, exactly once, with one record each.
func TestCrashAndNATSRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		crash string
		// failFirst: the first attempt fails, so the crash leaves a delivery waiting for its
		// next attempt; otherwise the crash leaves rows committed and EVENTS unacknowledged,
		// the delivery leased at intake and never attempted: it is attempted when its lease,
		// short in the crashing child, ends.
		failFirst bool
		wantHits  int
		wantRecs  string
	}{
		{"waiting for the next attempt", CrashAfterFinishCommit, true, 2, "1:retry,2:delivered"},
		{"deliveries committed, EVENTS not acked", CrashAfterIngestCommit, false, 1, "1:delivered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			rc := newReceiver(t, func(n int, _ http.ResponseWriter, _ *http.Request) int {
				if tc.failFirst && n == 1 {
					return http.StatusInternalServerError
				}
				return http.StatusOK
			})
			e.client("c1", rc.URL)
			e.sensor("s1", "here")
			e.subscribe("c1", "s1")
			first := e.child("1500ms", tc.crash, leaseEnv+"=3s")
			e.publish(testEvent("s1", 1, 1))
			testenv.Eventually(t, 15*time.Second, "the child to die at "+tc.crash, first.Exited)
			if first.ExitCode() != crashpoint.ExitCode {
				t.Fatalf("child exited with %d, want %d (crash point %s)", first.ExitCode(), crashpoint.ExitCode, tc.crash)
			}
			before := rc.count()
			if want := map[bool]int{true: 1, false: 0}[tc.failFirst]; before != want {
				t.Fatalf("receiver got %d requests before the crash, want %d", before, want)
			}
			e.nats.Restart(300 * time.Millisecond)

			second := e.child("1500ms", "")
			testenv.Eventually(t, 20*time.Second, "the delivery after the restarts", func() bool { return rc.count() >= tc.wantHits })
			testenv.Eventually(t, 10*time.Second, "the attempt records", func() bool { return len(e.records("c1")) >= tc.wantHits })
			time.Sleep(2 * time.Second) // a doubled attempt or record would show by now
			if got := rc.count(); got != tc.wantHits {
				t.Fatalf("receiver got %d requests, want exactly %d", got, tc.wantHits)
			}
			for _, h := range rc.got() {
				if h.header.Get("webhook-id") != event.ID("s1", 1) {
					t.Fatalf("webhook-id %q", h.header.Get("webhook-id"))
				}
			}
			if got := outcomes(e.records("c1")); got != tc.wantRecs {
				t.Fatalf("records %s, want %s", got, tc.wantRecs)
			}
			var state string
			var attempts int
			if err := e.pool.QueryRow(t.Context(), `SELECT state, attempts FROM notifier_deliveries`).Scan(&state, &attempts); err != nil {
				t.Fatal(err)
			}
			if state != StateDelivered || attempts != tc.wantHits {
				t.Fatalf("row %s after %d attempts", state, attempts)
			}
			second.Stop(t, 20*time.Second)
			if second.ExitCode() != 0 {
				t.Fatalf("second child exited with %d", second.ExitCode())
			}
		})
	}
}

// TestNATSRestartWhileRunning: the notifier rides out a NATS restart and delivers events
// appended after it, with their records.
func TestNATSRestartWhileRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.subscribed(rc.URL)
	e.start()
	e.publish(testEvent("s1", 1, 1))
	testenv.Eventually(t, 10*time.Second, "first delivery", func() bool { return rc.count() == 1 })
	e.nats.Restart(300 * time.Millisecond)
	e.publish(testEvent("s1", 2, 0))
	testenv.Eventually(t, 20*time.Second, "delivery after the restart", func() bool { return rc.count() == 2 })
	testenv.Eventually(t, 10*time.Second, "records", func() bool { return len(e.records("c1")) == 2 })
	if got := outcomes(e.records("c1")); got != "1:delivered,1:delivered" {
		t.Fatalf("records %s", got)
	}
}
