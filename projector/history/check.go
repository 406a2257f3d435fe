package history

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// Name names the history projector in set-aside records and their metric.
const Name = "history"

// checkMsg checks a READINGS or EVENTS message before it becomes a row (DELIVERIES is
// written by the notifier alone, and only decoded). A message that fails is set aside
// here, before the sink acks it with no row; refused says so. An error means the record
// could not be written before ctx ended: the message must not be acked.
func (h *Projector) checkMsg(ctx context.Context, stream string, msg jetstream.Msg, md *jetstream.MsgMetadata) (refused bool, err error) {
	var bad error
	switch stream {
	case natsx.ReadingsStream:
		_, bad = event.CheckLog(msg.Subject(), msg.Data(), h.cfg.PartitionCount)
	case natsx.EventsStream:
		_, bad = event.CheckEvent(msg.Subject(), msg.Data(), h.cfg.PartitionCount)
	}
	if bad == nil {
		return false, nil
	}
	if err := h.setAside.SetAside(ctx, stream, md.Sequence.Stream, msg.Subject(), msg.Data(), bad); err != nil {
		return true, err
	}
	return true, nil
}
