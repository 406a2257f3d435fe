package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// `locks run` failing to reach NATS or RabbitMQ names the variable, and neither its log
// nor its error line shows the URL's password.
func TestRunFailuresHideURLPasswords(t *testing.T) {
	t.Parallel()
	const secret = "hunter2-url-password"
	for _, c := range []struct{ env, want string }{
		{"LOCKS_NATS_URL=nats://locks:" + secret + "@" + testenv.FreeAddr(t), "LOCKS_NATS_URL=nats://locks:xxxxx@"},
		{"LOCKS_AMQP_URL=amqp://guest:" + secret + "@" + testenv.FreeAddr(t) + "/", "LOCKS_AMQP_URL=amqp://guest:xxxxx@"},
	} {
		t.Run(c.env, func(t *testing.T) {
			t.Parallel()
			env := []string{c.env, "LOCKS_HTTP_ADDR=" + testenv.FreeAddr(t), "LOCKS_DATA_DIR=" + t.TempDir(), "GOGC=100"}
			if !strings.HasPrefix(c.env, "LOCKS_AMQP_URL=") {
				env = append(env, "LOCKS_AMQP_URL="+testenv.AMQPURL())
			}
			getenv := func(k string) string {
				for _, e := range env {
					if name, v, _ := strings.Cut(e, "="); name == k {
						return v
					}
				}
				return ""
			}
			var stderr bytes.Buffer
			code := run([]string{"run", "--targets=bridge"}, getenv, &bytes.Buffer{}, &stderr)
			if code != 1 || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("exit %d, want 1 and an error with %q:\n%s", code, c.want, stderr.String())
			}
			if strings.Contains(stderr.String(), secret) {
				t.Fatalf("the output shows the password:\n%s", stderr.String())
			}
		})
	}
}
