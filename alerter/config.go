package alerter

import (
	"errors"
	"fmt"
	"net/mail"
	"net/url"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/whsign"
)

// Defaults of Config.
const (
	IntervalDefault = 10 * time.Second
	// LagDefault: a projection partition whose oldest unapplied reading is older than this
	// is lagging or stuck.
	LagDefault = 2 * time.Minute
	// SetAsideQuietDefault: a set_aside alert resolves after this long without a new record.
	SetAsideQuietDefault  = 15 * time.Minute
	MassLossShareDefault  = 0.2
	MassLossMinDefault    = 10
	MassLossWindowDefault = time.Minute
	// ProcessStaleDefault: a process registry key not updated for this long (it is written
	// every 5 s) belongs to a process that stopped reporting.
	ProcessStaleDefault = 15 * time.Second
	MaxPerMinuteDefault = 20
	SendTimeoutDefault  = 10 * time.Second
	// PollDefault is how often the senders look for notices when nothing woke them.
	PollDefault = time.Second
	// EmailFromDefault is the sender of the e-mails when LOCKS_ALERT_EMAIL_FROM is not set.
	EmailFromDefault = "lock-sensors@localhost"
)

// RetryDefault spaces the attempts of a notice its channel refused; it is never given up.
var RetryDefault = backoff.Policy{Min: time.Second, Max: 5 * time.Minute}

// Config is what the alerter needs besides its dependencies.
type Config struct {
	// Interval is how often every condition is evaluated (LOCKS_ALERT_INTERVAL).
	Interval time.Duration
	// Lag is the age of a partition's oldest unapplied reading past which its projection is
	// lagging (LOCKS_ALERT_LAG).
	Lag time.Duration
	// LagProjections are the projections watched for lag (a rebuild's shadow lags by design).
	LagProjections []string
	// SetAsideQuiet is the quiet time after which a set_aside alert resolves
	// (LOCKS_ALERT_SET_ASIDE_QUIET).
	SetAsideQuiet time.Duration
	// MassLossShare and MassLossMin: mass_loss fires when more than this share of the sensors,
	// and at least MassLossMin of them, went silent within MassLossWindow and are lost
	// (LOCKS_ALERT_MASS_LOSS_SHARE, LOCKS_ALERT_MASS_LOSS_MIN).
	MassLossShare  float64
	MassLossMin    int
	MassLossWindow time.Duration
	// ProcessStale is the age of a process registry entry past which part_stopped fires.
	ProcessStale time.Duration

	// SMTPURL is smtp://user:pass@host:port (STARTTLS required unless ?tls=none) or smtps://… (TLS);
	// empty: no e-mail (LOCKS_ALERT_SMTP_URL).
	SMTPURL string
	// EmailTo and EmailFrom address the e-mails (LOCKS_ALERT_EMAIL_TO, LOCKS_ALERT_EMAIL_FROM).
	EmailTo   []string
	EmailFrom string
	// WebhookURL and WebhookSecret (whsec_…): the operator webhook, signed like client
	// webhooks; empty URL: none (LOCKS_ALERT_WEBHOOK_URL, LOCKS_ALERT_WEBHOOK_SECRET).
	WebhookURL    string
	WebhookSecret string
	// MaxPerMinute bounds the notices sent per channel in any minute; the rest wait
	// (LOCKS_ALERT_MAX_PER_MINUTE).
	MaxPerMinute int
	// SendTimeout bounds one SMTP session or webhook request.
	SendTimeout time.Duration
	// Retry spaces the attempts of a refused notice.
	Retry backoff.Policy
	// Poll is how often the senders look for notices when nothing woke them.
	Poll time.Duration
}

func (c *Config) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = IntervalDefault
	}
	if c.Lag <= 0 {
		c.Lag = LagDefault
	}
	if c.LagProjections == nil {
		c.LagProjections = []string{"state", "history"}
	}
	if c.SetAsideQuiet <= 0 {
		c.SetAsideQuiet = SetAsideQuietDefault
	}
	if c.MassLossShare <= 0 {
		c.MassLossShare = MassLossShareDefault
	}
	if c.MassLossMin <= 0 {
		c.MassLossMin = MassLossMinDefault
	}
	if c.MassLossWindow <= 0 {
		c.MassLossWindow = MassLossWindowDefault
	}
	if c.ProcessStale <= 0 {
		c.ProcessStale = ProcessStaleDefault
	}
	if c.MaxPerMinute <= 0 {
		c.MaxPerMinute = MaxPerMinuteDefault
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = SendTimeoutDefault
	}
	if c.Retry == (backoff.Policy{}) {
		c.Retry = RetryDefault
	}
	if c.Poll <= 0 {
		c.Poll = PollDefault
	}
	if c.EmailFrom == "" {
		c.EmailFrom = EmailFromDefault
	}
}

// Validate reports the first bad field (after defaults).
func (c Config) Validate() error {
	if c.MassLossShare >= 1 {
		return fmt.Errorf("alerter: mass loss share %v: want more than 0 and less than 1", c.MassLossShare)
	}
	if c.SMTPURL != "" {
		if _, err := parseSMTPURL(c.SMTPURL); err != nil {
			return fmt.Errorf("alerter: SMTP URL: %w", err)
		}
		if len(c.EmailTo) == 0 {
			return errors.New("alerter: an SMTP URL needs recipients (LOCKS_ALERT_EMAIL_TO)")
		}
		for _, to := range append([]string{c.EmailFrom}, c.EmailTo...) {
			if _, err := mail.ParseAddress(to); err != nil {
				return fmt.Errorf("alerter: e-mail address %q: %w", to, err)
			}
		}
	}
	if c.WebhookURL != "" {
		u, err := url.Parse(c.WebhookURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return errors.New("alerter: webhook URL: want an http or https URL")
		}
		if _, err := whsign.Signature(c.WebhookSecret, "", time.Time{}, time.Time{}, "", 0, nil); err != nil {
			return fmt.Errorf("alerter: webhook secret (LOCKS_ALERT_WEBHOOK_SECRET): %w", err)
		}
	}
	return nil
}

// channels are the configured notice channels.
func (c Config) channels() []string {
	var out []string
	if c.SMTPURL != "" {
		out = append(out, channelEmail)
	}
	if c.WebhookURL != "" {
		out = append(out, channelWebhook)
	}
	return out
}
