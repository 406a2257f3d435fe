package systemd

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// locks.env.example as it is, with every commented setting enabled too, is refused at start
// while a CHANGE_ME is left in it; with the placeholders replaced it is a configuration locks
// accepts (each part's own file adding its NATS user).
func TestEnvExampleRefusedUntilChanged(t *testing.T) {
	ex, err := os.ReadFile("locks.env.example")
	if err != nil {
		t.Fatal(err)
	}
	asIs, all := map[string]string{}, map[string]string{}
	for _, line := range strings.Split(string(ex), "\n") {
		commented := strings.HasPrefix(line, "#")
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "#"), "=")
		if !ok || !strings.HasPrefix(k, "LOCKS_") {
			continue
		}
		if !commented {
			asIs[k] = v
		}
		all[k] = v
	}
	for name, env := range map[string]map[string]string{"as it is": asIs, "every line": all} {
		_, err := config.Load(func(k string) string { return env[k] }, nil, nil)
		var ce *config.Error
		if !errors.As(err, &ce) || !strings.Contains(ce.Reason, "CHANGE_ME") {
			t.Errorf("%s: %v, want a placeholder refused", name, err)
		}
		changed := map[string]string{}
		for k, v := range env {
			changed[k] = regexp.MustCompile(`(?i)change_?me`).ReplaceAllString(v, "s3cret")
		}
		if name == "every line" {
			changed["LOCKS_API_TOKENS"] = "a-real-token-0123456789"
			changed["LOCKS_ALERT_WEBHOOK_SECRET"] = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="
		}
		if _, err := config.Load(func(k string) string { return changed[k] }, nil, nil); err != nil {
			t.Errorf("%s, placeholders replaced: %v", name, err)
		}
	}
}
