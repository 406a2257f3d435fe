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

// Issue 25, item 7: the forms that leaked. A keyword/value Postgres connection string, a NATS
// token in the URL's user part, a ClickHouse URL's password in a parser's error, and the
// path of the operator's alert webhook (where chat services keep their token): none shows in
// what `locks run` prints when it cannot start.
func TestRunFailuresHideEverySecretForm(t *testing.T) {
	t.Parallel()
	const secret = "hunter2SECRETvalue0123"
	for _, c := range []struct {
		name    string
		env     []string
		targets string
	}{
		{"postgres keyword DSN", []string{"LOCKS_POSTGRES_URL=host=127.0.0.1 port=" + freePort(t) + " user=locks password=" + secret + " dbname=locks connect_timeout=2"}, "state"},
		{"nats token", []string{"LOCKS_NATS_URL=nats://" + secret + "@" + testenv.FreeAddr(t)}, "bridge"},
		{"clickhouse password, bad port", []string{"LOCKS_CLICKHOUSE_URL=clickhouse://default:" + secret + "@127.0.0.1:x/locks"}, "history"},
		{"clickhouse password, unreachable", []string{"LOCKS_CLICKHOUSE_URL=clickhouse://default:" + secret + "@" + testenv.FreeAddr(t) + "/locks?dial_timeout=1s"}, "history"},
		{"clickhouse token user", []string{"LOCKS_CLICKHOUSE_URL=clickhouse://" + secret + "@" + testenv.FreeAddr(t) + "/locks?dial_timeout=1s"}, "history"},
		{"alert webhook path", []string{"LOCKS_ALERT_WEBHOOK_URL=ftp://hooks.example.com/services/T0/" + secret}, "alerter"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := append([]string{"LOCKS_HTTP_ADDR=" + testenv.FreeAddr(t), "LOCKS_DATA_DIR=" + t.TempDir(), "GOGC=100",
				"LOCKS_AMQP_URL=" + testenv.AMQPURL(), "LOCKS_NATS_LISTEN=" + testenv.FreeAddr(t)}, c.env...)
			getenv := func(k string) string {
				v := ""
				for _, e := range env {
					if name, val, _ := strings.Cut(e, "="); name == k {
						v = val // the last one wins
					}
				}
				return v
			}
			var stdout, stderr bytes.Buffer
			code := run([]string{"run", "--targets=" + c.targets}, getenv, &stdout, &stderr)
			if code == 0 {
				t.Fatalf("exit 0, want a failure:\n%s", stderr.String())
			}
			if out := stdout.String() + stderr.String(); strings.Contains(out, secret) {
				t.Fatalf("the output shows the secret:\n%s", out)
			}
		})
	}
}

func freePort(t *testing.T) string {
	_, port, _ := strings.Cut(testenv.FreeAddr(t), ":")
	return port
}
