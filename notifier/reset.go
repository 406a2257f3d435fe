package notifier

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// listenResets resets a client's circuit breaker in this process when the admin API says
// on core NATS that an operator fixed its endpoint (a redrive, resend or re-enable), and
// wakes the dispatcher, so that the delivery goes out now instead of after the cooldown.
// A reset lost with the connection costs only that wait: the breaker still closes by itself.
// It also takes the API's registry changes of a client (endpoints.changed), after which rows
// claimed ahead for it are claimed again and read afresh (queue.go).
func (n *Notifier) listenResets(ctx context.Context) error {
	sub, err := n.js.Conn().Subscribe(natsx.NotifierResetSubject("*"), func(m *nats.Msg) {
		client := strings.TrimPrefix(m.Subject, natsx.NotifierResetPrefix)
		n.ep.reset(client)
		n.m.resets.Inc()
		n.log.Info("endpoint reset by an operator: circuit closed", "client", client)
		poke(n.wake)
	})
	if err != nil {
		return fmt.Errorf("subscribe to endpoint resets: %w", err)
	}
	changed, err := n.js.Conn().Subscribe(natsx.NotifierChangedSubject("*"), func(m *nats.Msg) {
		n.ep.changed(strings.TrimPrefix(m.Subject, natsx.NotifierChangedPrefix), time.Now())
	})
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("subscribe to registry changes: %w", err)
	}
	// Known to the server before the notifier sends anything: a reset right after is not missed.
	if err := n.js.Conn().FlushTimeout(5 * time.Second); err != nil {
		n.log.Warn("endpoint resets: flush subscription", "err", err)
	}
	go func() {
		<-ctx.Done()
		_ = sub.Unsubscribe()
		_ = changed.Unsubscribe()
	}()
	return nil
}
