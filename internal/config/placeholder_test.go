package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// A secret setting still holding an example file's CHANGE_ME is refused at start, naming the
// variable and without its value; the same word elsewhere (a queue name) is not a secret.
func TestPlaceholdersRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env, value string
		refused    bool
	}{
		{"LOCKS_POSTGRES_URL", "postgres://locks:CHANGE_ME@pg.internal:5432/locks", true},
		{"LOCKS_AMQP_URL", "amqps://locks:CHANGE_ME@rabbitmq.internal:5671/", true},
		{"LOCKS_CLICKHOUSE_URL", "clickhouse://locks:CHANGE_ME@ch:9000/locks", true},
		{"LOCKS_NATS_URL", "nats://bridge:CHANGEME1@nats-1:4222,nats://bridge:CHANGEME1@nats-2:4222", true},
		{"LOCKS_API_TOKENS", "CHANGE_ME_TO_16_OR_MORE_CHARACTERS", true},
		{"LOCKS_API_TOKENS", "a-real-token-0123456789,change_me-0123456789", true},
		{"LOCKS_ALERT_SMTP_URL", "smtp://alerts:CHANGE_ME@mail.internal:587", true},
		{"LOCKS_ALERT_WEBHOOK_SECRET", "whsec_CHANGE_ME", true},
		{"LOCKS_POSTGRES_URL", "postgres://locks:s3cret@pg.internal:5432/locks", false},
		{"LOCKS_AMQP_QUEUE", "CHANGE_ME", false},
	} {
		t.Run(c.env+"="+c.value, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{c.env: c.value}
			if c.env == "LOCKS_ALERT_SMTP_URL" {
				env["LOCKS_ALERT_EMAIL_TO"] = "ops@example.com"
			}
			_, err := config.Load(func(k string) string { return env[k] }, nil, nil)
			var ce *config.Error
			switch {
			case !c.refused && err != nil:
				t.Fatalf("refused: %v", err)
			case !c.refused:
			case !errors.As(err, &ce) || ce.Var != c.env || !strings.Contains(err.Error(), "placeholder CHANGE_ME"):
				t.Fatalf("error %v, want a config.Error naming %s and the placeholder", err, c.env)
			case c.env == "LOCKS_API_TOKENS" && strings.Contains(err.Error(), "0123456789"):
				t.Errorf("error %q shows the token", err)
			}
		})
	}
}
