package watchdog

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// declaredMark is the declared value settle owes a sensor's key once its fact is appended.
// Marking the key only spares a restart from settling the expiry again (which would find the
// fact as the sensor's last message and append nothing), so in a burst the marks wait until
// every queued expiry has its fact: each is a key write, and its delivery to the watch,
// that would otherwise delay the facts still queued.
type declaredMark struct {
	sensor   string
	received time.Time // of the reading the fact follows
	seq      uint64
	rev      uint64 // the marker's revision: the key must still be at it
	expect   bool
}

// writeMark publishes m without waiting: a failed or refused write (the key changed since the
// expiry) leaves the marker, which a restart settles again, harmlessly.
func (w *Watchdog) writeMark(ctx context.Context, m declaredMark) {
	var opts []jetstream.PublishOpt
	if m.expect {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(m.rev))
	}
	put := &nats.Msg{Subject: w.kvSubject(m.sensor), Data: encodeValue(m.received, m.seq, true), Header: nats.Header{}}
	if _, err := w.js.PublishMsgAsync(put, opts...); err != nil {
		put = &nats.Msg{Subject: put.Subject, Data: put.Data, Header: nats.Header{}}
		if _, err := w.js.PublishMsg(ctx, put, opts...); err != nil && !isWrongLastSeq(err) && ctx.Err() == nil {
			w.log.Debug("mark liveness key declared", "sensor", m.sensor, "err", err)
		}
	}
}
