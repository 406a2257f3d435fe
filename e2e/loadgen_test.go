package e2e_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A small load run of `locks loadgen --webhooks` against the whole system: the fleet is
// registered through the API, its readings (5% invalid) go through RabbitMQ, and the run's
// own receiver checks that every expected state change arrives exactly once, correctly
// signed, and that exactly the silent sensors are declared lost, once each.
func TestLoadgenBooksBalance(t *testing.T) {
	t.Parallel()
	s := start(t, "LOCKS_LOST_AFTER=3s")
	cmd := exec.Command(locksBin, "loadgen", "--webhooks", "--sensors=300", "--rate=1000", "--duration=5s",
		"--change-ratio=0.2", "--silent-ratio=0.05", "--invalid-ratio=0.05", "--settle=20s", "--seed=11", "--prefix=lg")
	cmd.Env = append(os.Environ(),
		"LOCKS_AMQP_URL="+s.rabbit.URL, "LOCKS_AMQP_QUEUE="+s.rabbit.Queue,
		"LOCKS_HTTP_ADDR="+s.http, "LOCKS_API_TOKENS="+s.token, "LOCKS_LOST_AFTER=3s")
	out, err := cmd.CombinedOutput()
	t.Logf("locks loadgen:\n%s", out)
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	if !strings.Contains(string(out), "the books balance") || strings.Contains(string(out), "MISMATCH") {
		t.Fatal("the books do not balance")
	}
}
