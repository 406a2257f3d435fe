package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// placeholders are what the example files (deploy/systemd/locks.env.example,
// deploy/compose/example.env, the Helm values) put where a secret goes.
var placeholders = []string{"CHANGE_ME", "CHANGEME", "CHANGE-ME"}

// RefusePlaceholders refuses a setting's value that still holds an example file's
// placeholder: a copied example must not start with a password or token everybody knows
// (and one that, for the API tokens, passes the length check). The one place that decides
// what a placeholder is.
func RefusePlaceholders(v string) error {
	up := strings.ToUpper(v)
	for _, p := range placeholders {
		if strings.Contains(up, p) {
			return fmt.Errorf("holds the placeholder %s of an example file: replace it with the real value", p)
		}
	}
	return nil
}

// secretURLs are the variables whose URLs may carry a password.
var secretURLs = []string{"LOCKS_AMQP_URL", "LOCKS_POSTGRES_URL", "LOCKS_CLICKHOUSE_URL", "LOCKS_NATS_URL"}

// shown is a variable's value as an error may print it: tokens not at all, URLs without
// their passwords. A configuration error goes to the terminal, the service's journal and
// whatever collects them.
func shown(env, v string) string {
	switch {
	case env == "LOCKS_API_TOKENS":
		return redact.Mask
	case slices.Contains(secretURLs, env):
		return redact.URL(v)
	case env == "LOCKS_ALERT_WEBHOOK_SECRET":
		return redact.Mask
	case env == "LOCKS_ALERT_WEBHOOK_URL":
		// Chat services put the token in the path.
		return redact.HostOnly(v)
	case slices.Contains(alertSecrets, env):
		return redact.URL(v)
	}
	return v
}

// hiddenIn is an error's text about variable env with value v, without v's secrets: a URL
// parser quotes the URL it failed on.
func hiddenIn(env, v, text string) string {
	switch {
	case env == "LOCKS_API_TOKENS" || env == "LOCKS_ALERT_WEBHOOK_SECRET":
		for _, tok := range strings.Split(v, ",") {
			if tok = strings.TrimSpace(tok); len(tok) >= 3 {
				text = strings.ReplaceAll(text, tok, redact.Mask)
			}
		}
		return text
	case env == "LOCKS_ALERT_WEBHOOK_URL":
		if v != "" {
			text = strings.ReplaceAll(text, v, redact.HostOnly(v))
		}
		return redact.In(text, v)
	case slices.Contains(secretURLs, env) || slices.Contains(alertSecrets, env):
		return redact.In(text, v)
	}
	return text
}
