package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

func TestAlertSettings(t *testing.T) {
	t.Parallel()
	load := func(env map[string]string) (config.Config, error) {
		return config.Load(func(k string) string { return env[k] }, nil, nil)
	}
	c, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := c.Alerts; a.Interval != 10*time.Second || a.Lag != 2*time.Minute || a.MassLossShare != 0.2 || a.MaxPerMinute != 20 || a.SMTPURL != "" || a.WebhookURL != "" {
		t.Errorf("defaults %+v", a)
	}
	c, err = load(map[string]string{"LOCKS_ALERT_SMTP_URL": "smtp://u:p@mail:587", "LOCKS_ALERT_EMAIL_TO": "a@x.org, B <b@x.org>",
		"LOCKS_ALERT_WEBHOOK_URL": "https://ops.example/hook", "LOCKS_ALERT_WEBHOOK_SECRET": "whsec_c2VjcmV0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Alerts.EmailTo) != 2 || c.Alerts.WebhookSecret != "whsec_c2VjcmV0" {
		t.Errorf("alerts %+v", c.Alerts)
	}
	// Errors name the variable and never show a secret.
	for _, tc := range []struct {
		env     map[string]string
		varName string
		secret  string
	}{
		{map[string]string{"LOCKS_ALERT_SMTP_URL": "http://u:hunter2@mail"}, "LOCKS_ALERT_SMTP_URL", "hunter2"},
		{map[string]string{"LOCKS_ALERT_WEBHOOK_SECRET": "hunter2"}, "LOCKS_ALERT_WEBHOOK_SECRET", "hunter2"},
		{map[string]string{"LOCKS_ALERT_SMTP_URL": "smtp://u:hunter2@mail"}, "LOCKS_ALERT_EMAIL_TO", "hunter2"},
		{map[string]string{"LOCKS_ALERT_WEBHOOK_URL": "https://ops/hook?token=hunter2"}, "LOCKS_ALERT_WEBHOOK_SECRET", "hunter2"},
		{map[string]string{"LOCKS_ALERT_MASS_LOSS_SHARE": "1.5"}, "LOCKS_ALERT_MASS_LOSS_SHARE", ""},
	} {
		_, err := load(tc.env)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Var != tc.varName {
			t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.varName)
			continue
		}
		if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
			t.Errorf("error %q shows the secret", err)
		}
	}
}
