package state

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

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

// endApply ends a batch's span with what it applied and derived.
func endApply(span trace.Span, applied, skipped, events int, err error) {
	span.SetAttributes(attribute.Int("batch.applied", applied), attribute.Int("batch.skipped", skipped),
		attribute.Int("batch.events", events))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
