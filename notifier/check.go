package notifier

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/staterev"
)

// SetAsideConsumer names the notifier in set-aside records and their metric.
const SetAsideConsumer = "notifier"

// checkBatch keeps the real events of batch. Anyone can publish to EVENTS, so each message
// is checked (event.CheckEvent) and its revision compared with the sensor's state: the state
// projector writes an event's outbox row in the transaction that sets that revision, so an
// event ahead of the state is forged — and its delivery row would supersede every later
// real event of the sensor. What fails is set aside and acked; an error is transient
// (Postgres or NATS unreachable) and the whole batch is tried again.
func (n *Notifier) checkBatch(ctx context.Context, batch []jetstream.Msg) (evs []event.Event, payloads [][]byte, ok []jetstream.Msg, err error) {
	type refused struct {
		m   jetstream.Msg
		why error
	}
	var bad []refused
	for _, m := range batch {
		e, err := event.CheckEvent(m.Subject(), m.Data(), n.cfg.PartitionCount)
		if err != nil {
			bad = append(bad, refused{m, err})
			continue
		}
		evs, payloads, ok = append(evs, e), append(payloads, m.Data()), append(ok, m)
	}
	if len(evs) > 0 {
		ids := make([]string, len(evs))
		for i, e := range evs {
			ids[i] = e.SensorID
		}
		state, err := staterev.Of(ctx, n.db, ids)
		if err != nil {
			return nil, nil, nil, err
		}
		k := 0
		for i, e := range evs {
			if e.Revision > state[e.SensorID] {
				bad = append(bad, refused{ok[i], event.Invalid(event.ReasonRevisionAhead,
					"revision %d of sensor %s is ahead of its state (revision %d)", e.Revision, e.SensorID, state[e.SensorID])})
				continue
			}
			evs[k], payloads[k], ok[k] = e, payloads[i], ok[i]
			k++
		}
		evs, payloads, ok = evs[:k], payloads[:k], ok[:k]
	}
	for _, b := range bad {
		var seq uint64
		if md, err := b.m.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		if err := n.setAside.SetAside(ctx, natsx.EventsStream, seq, b.m.Subject(), b.m.Data(), b.why); err != nil {
			return nil, nil, nil, err
		}
		if err := b.m.Ack(); err != nil {
			n.log.Debug("ack a set-aside EVENTS message (redelivered, recorded once)", "err", err)
		}
	}
	return evs, payloads, ok, nil
}
