package config_test

import (
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

func TestDefaultsMatchContract(t *testing.T) {
	t.Parallel()
	c := config.Default()
	if c.AMQPURL != "amqp://guest:guest@127.0.0.1:5672/" ||
		c.PostgresURL != "postgres://postgres@127.0.0.1:5432/locks?sslmode=disable" ||
		c.ClickHouseURL != "clickhouse://127.0.0.1:9000/locks" ||
		c.NATSURL != "" || c.DataDir != "./.locks" ||
		c.HTTPAddr != "127.0.0.1:8080" || c.GRPCAddr != "127.0.0.1:9090" ||
		len(c.APITokens) != 0 || c.LostAfter != time.Hour ||
		c.WebhookTimeout != 10*time.Second || c.WebhookAllowPrivate ||
		c.Partitions != 16 || len(c.RetrySchedule) != 9 {
		t.Fatalf("defaults differ from docs/contract.md section 4: %+v", c)
	}
}

func TestBadValuesNameTheVariable(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"LOCKS_LOST_AFTER":            "abc",
		"LOCKS_POSTGRES_URL":          "mysql://x",
		"LOCKS_AMQP_URL":              "::",
		"LOCKS_NATS_URL":              "http://x",
		"LOCKS_HTTP_ADDR":             "8080",
		"LOCKS_NATS_LISTEN":           "4222",
		"LOCKS_RETRY_SCHEDULE":        "1s,-2s",
		"LOCKS_WEBHOOK_TIMEOUT":       "0s",
		"LOCKS_WEBHOOK_LEASE_MARGIN":  "4s",
		"LOCKS_WEBHOOK_ALLOW_PRIVATE": "maybe",
		"LOCKS_PARTITIONS":            "0",
		"LOCKS_API_TOKENS":            "short",
		"LOCKS_UI_REFRESH":            "6s",
	}
	for k, v := range cases {
		t.Run(k, func(t *testing.T) {
			t.Parallel()
			_, err := config.Load(func(name string) string {
				if name == k {
					return v
				}
				return ""
			}, nil, nil)
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Var != k || !errors.Is(err, config.ErrUsage) {
				t.Fatalf("%s=%q: error %v, want a config.Error naming %s", k, v, err, k)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
		})
	}
}

func TestFlagOverridesEnvironment(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	vals := config.Register(fs)
	if err := fs.Parse([]string{"--lost-after=5s", "--partition-count=4", "--api-tokens=0123456789abcdef,fedcba9876543210"}); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(func(k string) string {
		if k == "LOCKS_LOST_AFTER" {
			return "2h"
		}
		if k == "LOCKS_RETRY_SCHEDULE" {
			return "1s, 2s"
		}
		return ""
	}, fs, vals)
	if err != nil {
		t.Fatal(err)
	}
	if c.LostAfter != 5*time.Second || c.Partitions != 4 || len(c.APITokens) != 2 ||
		len(c.RetrySchedule) != 2 || c.RetrySchedule[1] != 2*time.Second {
		t.Fatalf("got %+v", c)
	}
	fs2 := flag.NewFlagSet("x", flag.ContinueOnError)
	vals2 := config.Register(fs2)
	_ = fs2.Parse([]string{"--lost-after=xyz"})
	if _, err := config.Load(func(string) string { return "" }, fs2, vals2); err == nil || !strings.Contains(err.Error(), "--lost-after") {
		t.Fatalf("bad flag: %v, want an error naming --lost-after", err)
	}
}

// Issue 25, item 10: every LOCKS_ setting the example files give a placeholder (CHANGE_ME
// and the like) is refused at start, naming the variable; a flag too.
func TestPlaceholdersRefused(t *testing.T) {
	t.Parallel()
	found := 0
	for _, f := range []string{"../../deploy/systemd/locks.env.example", "../../deploy/compose/example.env"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "#"), "=")
			if !ok || !strings.HasPrefix(k, "LOCKS_") || config.RefusePlaceholders(v) == nil {
				continue
			}
			if _, known := config.Register(flag.NewFlagSet("x", flag.ContinueOnError))[k]; !known {
				continue // a variable of the NATS server's, not of locks
			}
			found++
			_, err := config.Load(func(name string) string {
				if name == k {
					return v
				}
				return ""
			}, nil, nil)
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Var != k || !strings.Contains(err.Error(), "placeholder") {
				t.Errorf("%s=%s from %s: error %v, want the placeholder refused", k, v, f, err)
			}
		}
	}
	if found < 4 {
		t.Fatalf("only %d placeholders found in the example files", found)
	}
	fs := flag.NewFlagSet("locks run", flag.ContinueOnError)
	vals := config.Register(fs)
	if err := fs.Parse([]string{"--api-tokens=change_me_0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(func(string) string { return "" }, fs, vals); err == nil || !strings.Contains(err.Error(), "--api-tokens") {
		t.Fatalf("a placeholder given as a flag: %v", err)
	}
}
