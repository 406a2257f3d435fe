package state

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// SpanApply is the span of one batch a partition applies in one transaction.
const SpanApply = "state.apply"

// startApply starts a batch's span (Deps.Tracer set). One span covers many readings, so it
// is the root of a trace of its own, linked to the span of each reading whose READINGS
// message carries a traceparent (the bridge's append); the SDK keeps up to its link limit
// (OTEL_SPAN_LINK_COUNT_LIMIT, 128 by default).
func (s *Projector) startApply(ctx context.Context, p int, msgs []jetstream.Msg) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(msgs))
	for _, m := range msgs {
		if sc := tracing.ExtractNATS(m.Headers()); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return s.tracer.Start(ctx, SpanApply, trace.WithNewRoot(), trace.WithLinks(links...), trace.WithAttributes(
		attribute.Int("partition", p),
		attribute.Int("batch.messages", len(msgs)),
	))
}

// SpanEvent is the span of one event a reading (or a liveness_timeout fact) derived, from
// its derivation to the commit of its outbox row.
const SpanEvent = "state.event"

// startEvents starts a span for each event b derived (while tracing): a child of the span
// of its READINGS message, so that a state change joins its reading's trace and a
// connection_lost the watchdog's decision; a connection_restored is the root of a trace of
// its own (a decision about the sensor's silence, not about the reading's value), linked to
// the reading. Each links the batch's state.apply span, and its traceparent replaces the
// message's on the event's outbox row.
func (b *batch) startEvents(ctx context.Context, tracer trace.Tracer) {
	apply := trace.Link{SpanContext: trace.SpanContextFromContext(ctx)}
	b.evSpans = make([]trace.Span, len(b.evs))
	for i, e := range b.evs {
		parent := tracing.FromTraceparent(b.evTP[i])
		opts := []trace.SpanStartOption{trace.WithAttributes(
			attribute.String("sensor.id", e.SensorID),
			attribute.String("event.id", e.ID),
			attribute.String("event.type", e.Type),
			attribute.Int64("sensor.revision", e.Revision),
			attribute.Int("partition", e.Partition),
			attribute.Int64("messaging.nats.stream_sequence", int64(e.Seq)),
		)}
		pctx := ctx
		switch {
		case e.Type == event.TypeConnectionRestored || !parent.IsValid():
			opts = append(opts, trace.WithNewRoot(), trace.WithLinks(apply))
			if parent.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: parent}))
			}
		default:
			pctx = trace.ContextWithRemoteSpanContext(ctx, parent)
			opts = append(opts, trace.WithLinks(apply))
		}
		sctx, span := tracer.Start(pctx, SpanEvent, opts...)
		b.evSpans[i], b.evTP[i] = span, tracing.TraceparentOf(sctx)
	}
}

// endEvents ends the spans of b's events once the batch committed (err nil) or failed.
func (b *batch) endEvents(err error) {
	for _, span := range b.evSpans {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// endApply ends a batch's span with what it applied and derived.
func endApply(span trace.Span, applied, skipped, events int, err error) {
	span.SetAttributes(attribute.Int("batch.applied", applied), attribute.Int("batch.skipped", skipped),
		attribute.Int("batch.events", events))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
