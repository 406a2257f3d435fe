package outbox

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// SpanPublish is the span of one row's publish, from the start of its round to JetStream's
// acknowledgement (or the round's failure).
const SpanPublish = "outbox.publish"

// errNotRelayed ends the span of a row its round did not get acknowledged.
var errNotRelayed = errors.New("not acknowledged in this round; published again by a later one")

// startPublish starts a span for each row that carries a Traceparent (Deps.Tracer set), a
// child of the row's trace, and puts the span's own traceparent in its place: the message
// then leads the consumer to the publish, and the publish to what wrote the row. A row
// published again after a failure gets a new span each time; the stream keeps the message
// of the first acknowledged one.
func (r *Relay) startPublish(ctx context.Context, rows []Row) map[int64]trace.Span {
	spans := make(map[int64]trace.Span)
	for i := range rows {
		o := &rows[i]
		sc := tracing.FromTraceparent(o.Traceparent)
		if !sc.IsValid() {
			continue
		}
		sctx, span := r.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, sc), SpanPublish,
			trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
				attribute.String("messaging.system", "nats"),
				attribute.String("messaging.destination.name", o.Subject),
				attribute.String("messaging.message.id", o.MsgID),
				attribute.String("outbox.name", r.cfg.Name),
				attribute.String("outbox.key", o.Key),
				attribute.Int64("outbox.seq", o.Seq),
			))
		o.Traceparent = tracing.TraceparentOf(sctx)
		spans[o.ID] = span
	}
	return spans
}

// endPublish ends the spans of a round: those of acked rows as done, the others with err.
func endPublish(spans map[int64]trace.Span, acked []Row, err error) {
	for _, o := range acked {
		if span, ok := spans[o.ID]; ok {
			span.End()
			delete(spans, o.ID)
		}
	}
	if err == nil {
		err = errNotRelayed
	}
	for _, span := range spans {
		span.SetStatus(codes.Error, err.Error())
		span.End()
	}
}
