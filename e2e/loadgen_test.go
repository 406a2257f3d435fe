package e2e_test

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A small load run of `locks loadgen` against the whole system. With --webhooks the fleet is
// registered through the API, its readings (5% invalid) go through RabbitMQ, and the run's
// own receiver checks that every expected state change arrives exactly once, correctly
// signed, and that exactly the silent sensors are declared lost, once each; in both cases the
// bridge's counters must show published = recorded + invalid. The second case slips a reading
// of its own into the queue during the run: the books must not balance, and the load
// generator must say so and exit non-zero.
func TestLoadgenBooksBalance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		intruder bool
	}{
		{name: "webhooks", args: []string{"--webhooks", "--sensors=300", "--rate=1000", "--duration=5s",
			"--change-ratio=0.2", "--silent-ratio=0.05", "--invalid-ratio=0.05", "--settle=20s", "--seed=11", "--prefix=lg"}},
		{name: "intruder", intruder: true, args: []string{"--sensors=100", "--rate=500", "--duration=4s",
			"--invalid-ratio=0.05", "--settle=10s", "--seed=12", "--prefix=lh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := start(t, "LOCKS_LOST_AFTER=3s")
			quiet(t)
			oneLoadRun(t)
			cmd := exec.Command(locksBin, append([]string{"loadgen"}, tc.args...)...)
			cmd.Env = append(os.Environ(),
				"LOCKS_AMQP_URL="+s.rabbit.URL, "LOCKS_AMQP_QUEUE="+s.rabbit.Queue,
				"LOCKS_HTTP_ADDR="+s.http, "LOCKS_API_TOKENS="+s.token, "LOCKS_LOST_AFTER=3s")
			var out syncBuffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.intruder {
				// Once the run is recording, one reading that is not in its books.
				testenv.Eventually(t, 30*time.Second, "the bridge to record the run's readings", func() bool {
					return s.metric("locks_bridge_readings_accepted_total") > 10
				})
				s.publish(reading("intruder", 1))
			}
			err := cmd.Wait()
			text := out.String()
			t.Logf("locks loadgen:\n%s", text)
			m := regexp.MustCompile(`published (\d+), recorded (\d+), invalid (\d+), changes (\d+)(?:, notifications received (\d+), lost events (\d+), missing (\d+), duplicates (\d+))?\n`).FindStringSubmatch(text)
			if m == nil {
				t.Fatal("no final summary line with published, recorded, invalid, changes")
			}
			n := func(i int) int64 { v, _ := strconv.ParseInt(m[i], 10, 64); return v }
			published, recorded, invalid := n(1), n(2), n(3)
			if invalid == 0 {
				t.Fatal("the run sent no invalid message; the test proves nothing about them")
			}
			if tc.intruder {
				if err == nil || recorded != published-invalid+1 || !bytes.Contains([]byte(text), []byte("MISMATCH: recorded")) {
					t.Fatalf("with one foreign reading: exit %v, recorded %d of published %d − invalid %d; want a non-zero exit and recorded one more",
						err, recorded, published, invalid)
				}
				return
			}
			if err != nil {
				t.Fatalf("loadgen: %v", err)
			}
			if recorded != published-invalid || !bytes.Contains([]byte(text), []byte("the books balance")) || bytes.Contains([]byte(text), []byte("MISMATCH")) {
				t.Fatalf("the books do not balance: published %d, recorded %d, invalid %d", published, recorded, invalid)
			}
			// The 15 silent sensors are lost exactly once each, and no sensor while it was fed
			// (loadgen's own verdict above). On a slow machine the settle outlasts
			// LOCKS_LOST_AFTER after the load's end, and the whole fleet, silent now, is
			// rightly declared lost too: at least 15.
			if m[5] == "" || n(7) != 0 || n(8) != 0 || n(6) < 15 {
				t.Fatalf("notifications: received %s, lost %s, missing %s, duplicates %s; want at least the 15 silent sensors lost, none missing or duplicated", m[5], m[6], m[7], m[8])
			}
		})
	}
}
