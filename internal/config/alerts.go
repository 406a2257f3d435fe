package config

import (
	"errors"
	"net/mail"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/whsign"
)

// Alerts configures the alerter (LOCKS_ALERT_*; docs/monitoring.md, "Alerts").
type Alerts struct {
	Interval      time.Duration
	Lag           time.Duration
	SetAsideQuiet time.Duration
	MassLossShare float64
	MassLossMin   int
	SMTPURL       string
	EmailTo       []string
	EmailFrom     string
	WebhookURL    string
	WebhookSecret string
	MaxPerMinute  int
}

// alertSecrets are the alert variables an error never shows (URLs: without their passwords).
var alertSecrets = []string{"LOCKS_ALERT_SMTP_URL", "LOCKS_ALERT_WEBHOOK_URL", "LOCKS_ALERT_WEBHOOK_SECRET"}

func alertSettings() []setting {
	dur := func(dst func(*Alerts) *time.Duration) func(*Config, string) error {
		return func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return errors.New("must be a positive duration (e.g. 10s, 2m)")
			}
			*dst(&c.Alerts) = d
			return nil
		}
	}
	positive := func(dst func(*Alerts) *int) func(*Config, string) error {
		return func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return errors.New("must be a positive integer")
			}
			*dst(&c.Alerts) = n
			return nil
		}
	}
	return []setting{
		{"LOCKS_ALERT_INTERVAL", "10s", "how often the alerter evaluates every alert condition (docs/monitoring.md, Alerts)", dur(func(a *Alerts) *time.Duration { return &a.Interval })},
		{"LOCKS_ALERT_LAG", "2m", "age of a projection partition's oldest unapplied reading past which projection_lag fires", dur(func(a *Alerts) *time.Duration { return &a.Lag })},
		{"LOCKS_ALERT_SET_ASIDE_QUIET", "15m", "time without a new set-aside message after which set_aside resolves", dur(func(a *Alerts) *time.Duration { return &a.SetAsideQuiet })},
		{"LOCKS_ALERT_MASS_LOSS_SHARE", "0.2", "mass_loss fires when more than this share of the sensors (and at least LOCKS_ALERT_MASS_LOSS_MIN) are lost and went silent within one minute of each other", func(c *Config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f >= 1 {
				return errors.New("must be a number between 0 and 1 (exclusive)")
			}
			c.Alerts.MassLossShare = f
			return nil
		}},
		{"LOCKS_ALERT_MASS_LOSS_MIN", "10", "fewest sensors lost together for mass_loss", positive(func(a *Alerts) *int { return &a.MassLossMin })},
		{"LOCKS_ALERT_SMTP_URL", "", "smtp://user:pass@host:port (STARTTLS required; ?tls=none to send in the clear) or smtps://... (TLS) for the alert e-mails; empty: no e-mail", func(c *Config, v string) error {
			if v != "" {
				u, err := url.Parse(v)
				if err != nil || (u.Scheme != "smtp" && u.Scheme != "smtps") || u.Hostname() == "" {
					return errors.New("must be smtp://[user:pass@]host[:port] or smtps://… (percent-encode / ? # @ : in the user name or password)")
				}
				if m := u.Query().Get("tls"); m != "" && m != "starttls" && (m != "none" || u.Scheme != "smtp") {
					return errors.New("tls= must be starttls (the default) or none (smtp:// only)")
				}
			}
			c.Alerts.SMTPURL = v
			return nil
		}},
		{"LOCKS_ALERT_EMAIL_TO", "", "comma-separated recipients of the alert e-mails (required with LOCKS_ALERT_SMTP_URL)", func(c *Config, v string) error {
			c.Alerts.EmailTo = nil
			if strings.TrimSpace(v) == "" {
				return nil
			}
			as, err := mail.ParseAddressList(v)
			if err != nil {
				return errors.New("must be a comma-separated list of e-mail addresses")
			}
			for _, a := range as {
				c.Alerts.EmailTo = append(c.Alerts.EmailTo, a.String())
			}
			return nil
		}},
		{"LOCKS_ALERT_EMAIL_FROM", "lock-sensors@localhost", "sender of the alert e-mails", func(c *Config, v string) error {
			if _, err := mail.ParseAddress(v); err != nil {
				return errors.New("must be an e-mail address")
			}
			c.Alerts.EmailFrom = v
			return nil
		}},
		{"LOCKS_ALERT_WEBHOOK_URL", "", "the operator webhook receiving the alerts, signed like client webhooks; empty: no webhook", func(c *Config, v string) error {
			if v != "" {
				u, err := url.Parse(v)
				if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return errors.New("must be an http:// or https:// URL")
				}
			}
			c.Alerts.WebhookURL = v
			return nil
		}},
		{"LOCKS_ALERT_WEBHOOK_SECRET", "", "the operator webhook's whsec_<base64> signing secret (required with LOCKS_ALERT_WEBHOOK_URL)", func(c *Config, v string) error {
			if v != "" {
				if _, err := whsign.Signature(v, "", time.Time{}, time.Time{}, "", 0, nil); err != nil {
					return errors.New("must be whsec_ followed by base64")
				}
			}
			c.Alerts.WebhookSecret = v
			return nil
		}},
		{"LOCKS_ALERT_MAX_PER_MINUTE", "20", "most alert notices sent per channel in any minute; the others wait, in order", positive(func(a *Alerts) *int { return &a.MaxPerMinute })},
	}
}

// checkAlerts reports what the alert variables lack together.
func checkAlerts(a Alerts) *Error {
	switch {
	case a.SMTPURL != "" && len(a.EmailTo) == 0:
		return &Error{Var: "LOCKS_ALERT_EMAIL_TO", Reason: "LOCKS_ALERT_SMTP_URL is set: name the recipients"}
	case a.WebhookURL != "" && a.WebhookSecret == "":
		return &Error{Var: "LOCKS_ALERT_WEBHOOK_SECRET", Reason: "LOCKS_ALERT_WEBHOOK_URL is set: give the secret its receiver verifies (whsec_<base64>)"}
	}
	return nil
}
