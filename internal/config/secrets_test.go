package config_test

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// A bad value of a variable that holds a secret is named, but the error shows neither the
// tokens nor a URL's password, even when the password is what makes the URL unparsable.
func TestErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env, value string
		secrets    []string
	}{
		{"LOCKS_API_TOKENS", "short-hunter2", []string{"hunter2"}},
		{"LOCKS_API_TOKENS", "a-good-token-0123456789, hunter2", []string{"hunter2", "a-good-token-0123456789"}},
		{"LOCKS_POSTGRES_URL", "mysql://u:hunter2@db.internal/locks", []string{"hunter2"}},
		{"LOCKS_POSTGRES_URL", "postgres://u:hun/ter2@db.internal/locks", []string{"hun", "ter2"}},
		{"LOCKS_POSTGRES_URL", "postgres://u@db.internal:x/locks?password=hunter2", []string{"hunter2"}},
		{"LOCKS_AMQP_URL", "http://guest:hunter2@mq.internal:5672/", []string{"hunter2"}},
		{"LOCKS_AMQP_URL", "amqp://guest:hunter2@mq.internal:notaport/", []string{"hunter2"}},
		{"LOCKS_CLICKHOUSE_URL", "clickhouse://default:hun#ter2@ch.internal/locks", []string{"hun", "ter2"}},
		{"LOCKS_NATS_URL", "nats://a:hunter2@n1:4222,http://b:hunter2@n2:4222", []string{"hunter2"}},
	} {
		t.Run(c.env+"="+c.value, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(func(k string) string {
				if k == c.env {
					return c.value
				}
				return ""
			}, nil, nil)
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Var != c.env {
				t.Fatalf("error %v, want a config.Error naming %s", err, c.env)
			}
			for _, s := range c.secrets {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q shows %q", err, s)
				}
			}
		})
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	vals := config.Register(fs)
	if err := fs.Parse([]string{"--api-tokens=hunter2-flag"}); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(func(string) string { return "" }, fs, vals); err == nil || !strings.Contains(err.Error(), "--api-tokens") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("--api-tokens too short: %v, want an error naming the flag without the token", err)
	}
}
