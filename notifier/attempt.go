package notifier

import (
	"context"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// attempt makes one HTTP attempt of c and decides what follows, in a span when tracing.
func (n *Notifier) attempt(ctx context.Context, c claimed) result {
	if n.tracer == nil {
		return n.attemptOnce(ctx, c)
	}
	ctx, span := n.startAttempt(ctx, c)
	r := n.attemptOnce(ctx, c)
	endAttempt(span, r)
	return r
}

// attemptOnce is attempt without its span.
func (n *Notifier) attemptOnce(ctx context.Context, c claimed) result {
	start := time.Now()
	n.m.claim.Between(c.due, start)
	r := result{c: c, at: start}
	fail := func(msg string) result {
		r.errText = msg
		k := c.attempts + 1 - c.attemptBase // this attempt's number within its schedule
		d := n.policy.Delay(k, rand.Float64(), RetryAfter(r.status, r.retryAfter, time.Now()))
		if d == Stop {
			r.state = StateDead
		} else {
			r.state, r.delay = StatePending, d
		}
		return r
	}
	e, err := event.DecodeEvent(c.payload)
	if err != nil {
		r.state, r.errText = StateDead, err.Error() // can never be sent
		return r
	}
	body, err := Body(e, c.address)
	if err != nil {
		r.state, r.errText = StateDead, err.Error()
		return r
	}
	h, err := Headers(c.secrets, c.eventID, start, body)
	if err != nil {
		return fail(err.Error())
	}
	if n.tracer != nil {
		tracing.InjectHTTP(ctx, h) // the receiver can join the attempt's trace
	}
	resp, err := n.send.post(ctx, c.url, h, body)
	r.latency = time.Since(start)
	n.m.attempt.Since(start)
	r.status = resp.status
	r.retryAfter = resp.retryAfter
	if err != nil && ctx.Err() != nil {
		r.aborted = true // our shutdown, not the receiver's failure
		return r
	}
	n.m.latency.WithLabelValues(statusClass(resp.status, err)).Observe(r.latency.Seconds())
	switch {
	case err != nil:
		return fail(err.Error())
	case resp.status >= 200 && resp.status < 300:
		r.state = StateDelivered
		n.m.lag.Observe(time.Since(e.OccurredAt).Seconds())
		return r
	default:
		return fail("HTTP " + strconv.Itoa(resp.status))
	}
}

// statusClass is the latency metric's label of an attempt's answer.
func statusClass(status int, err error) string {
	if err != nil || status < 100 {
		return "error"
	}
	return strconv.Itoa(status/100) + "xx"
}
