package alerter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
)

// CrashAfterSend is the crash point between a channel accepting a notice and the notice
// being marked sent: the notice goes again after a restart, with the same Message-ID and
// webhook-id.
const CrashAfterSend = "alerter.after_send"

// notice is one row of alert_notices with its alert.
type notice struct {
	id, alertID            int64
	event, channel         string
	attempts               int
	due                    time.Time
	kind, subject, summary string
	details                json.RawMessage
	firedAt                time.Time
	resolvedAt             *time.Time
}

// noticeID is stable across attempts and restarts: receivers de-duplicate by it.
func (n notice) noticeID() string { return fmt.Sprintf("alert_%d_%s", n.alertID, n.event) }

// sender sends one channel's notices in the order they were written, at most MaxPerMinute
// in any minute (counted from the sent marks in Postgres, so a restart keeps the limit);
// a notice the channel refuses is tried again, never dropped, and holds the ones after it.
type sender struct {
	a       *Alerter
	channel string
	send    func(ctx context.Context, n notice) error
	wakeC   chan struct{}
}

func (a *Alerter) newSender(channel string) *sender {
	s := &sender{a: a, channel: channel, wakeC: make(chan struct{}, 1)}
	switch channel {
	case channelEmail:
		s.send = a.sendEmail
	case channelWebhook:
		s.send = a.sendWebhook
	}
	return s
}

// wake makes the sender look for notices now.
func (s *sender) wake() {
	select {
	case s.wakeC <- struct{}{}:
	default:
	}
}

// sleep waits d, or less if woken.
func (s *sender) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-s.wakeC:
		return true
	case <-t.C:
		return true
	}
}

func (s *sender) run(ctx context.Context) error {
	for {
		wait, err := s.step(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.a.log.Warn("alert notices: database error; trying again", "channel", s.channel, "err", err)
			wait = s.a.cfg.Poll
		}
		if wait > 0 {
			if !s.sleep(ctx, wait) {
				return ctx.Err()
			}
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// step sends the next notice if it is due and the rate allows, and says how long to wait
// before the next step.
func (s *sender) step(ctx context.Context) (time.Duration, error) {
	pg := s.a.d.PG
	var waiting int64
	var n notice
	err := pg.QueryRow(ctx, `SELECT count(*) OVER (), n.id, n.alert_id, n.event, n.channel, n.attempts, n.next_attempt_at,
			a.kind, a.subject, a.summary, a.details, a.fired_at, a.resolved_at
		FROM alert_notices n JOIN alerts a ON a.id = n.alert_id
		WHERE n.channel = $1 AND n.sent_at IS NULL ORDER BY n.id LIMIT 1`, s.channel).Scan(
		&waiting, &n.id, &n.alertID, &n.event, &n.channel, &n.attempts, &n.due,
		&n.kind, &n.subject, &n.summary, &n.details, &n.firedAt, &n.resolvedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		s.a.m.waiting.WithLabelValues(s.channel).Set(0)
		return s.a.cfg.Poll, nil
	}
	if err != nil {
		return 0, fmt.Errorf("next notice: %w", err)
	}
	s.a.m.waiting.WithLabelValues(s.channel).Set(float64(waiting))
	if d := time.Until(n.due); d > 0 {
		return min(d, s.a.cfg.Poll), nil
	}
	// The rate limit: the sends of the last minute, by Postgres' clock.
	var sent int64
	var freeIn float64
	if err := pg.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM min(sent_at) + interval '1 minute' - now()), 0)
		FROM alert_notices WHERE channel = $1 AND sent_at > now() - interval '1 minute'`, s.channel).Scan(&sent, &freeIn); err != nil {
		return 0, fmt.Errorf("count the notices of the last minute: %w", err)
	}
	if sent >= int64(s.a.cfg.MaxPerMinute) {
		return max(time.Duration(freeIn*float64(time.Second)), 10*time.Millisecond), nil
	}

	// Sent with a context of its own, bounded by the send timeout: a stop that began now lets
	// the send finish and be marked before the lock is given up, so that the next holder does
	// not send the notice again. Only a process killed mid-send leaves it to be sent twice.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.a.cfg.SendTimeout)
	err = s.send(sctx, n)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		s.a.m.failures.WithLabelValues(s.channel).Inc()
		delay := s.a.cfg.Retry.Next(n.attempts + 1)
		s.a.log.Warn("alert notice not accepted; trying again", "channel", s.channel, "notice", n.noticeID(),
			"attempt", n.attempts+1, "retry_in", delay, "err", err)
		if _, err := pg.Exec(ctx, `UPDATE alert_notices SET attempts = attempts + 1, last_error = $2,
			next_attempt_at = now() + $3::interval WHERE id = $1`, n.id, err.Error(), delay); err != nil {
			return 0, fmt.Errorf("record a failed notice: %w", err)
		}
		return 0, nil
	}
	crashpoint.Hit(CrashAfterSend)
	// Marked with a context of its own too: the channel has the notice.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.a.cfg.SendTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		_, err = pg.Exec(mctx, `UPDATE alert_notices SET sent_at = now(), attempts = attempts + 1 WHERE id = $1`, n.id)
		if err == nil || !backoff.Sleep(mctx, backoff.Policy{Min: 50 * time.Millisecond, Max: time.Second}.Next(attempt)) {
			break
		}
	}
	if err != nil {
		return 0, fmt.Errorf("mark notice %s sent (it will be sent again): %w", n.noticeID(), err)
	}
	s.a.m.sent.WithLabelValues(s.channel).Inc()
	s.a.log.Info("alert notice sent", "channel", s.channel, "notice", n.noticeID(), "kind", n.kind, "subject", n.subject)
	return 0, nil
}
