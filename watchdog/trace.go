package watchdog

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// SpanLost is the span of the decision that a sensor is lost: the append of its
// liveness_timeout fact.
const SpanLost = "watchdog.lost"

// startLost starts a lost decision's span (Deps.Tracer set): the root of a trace of its
// own, since no reading caused it, linked to the span of the sensor's last reading (last's
// traceparent, kept in READINGS); h then carries its traceparent to the fact, so that the
// connection_lost event and its webhooks join this trace.
func (w *Watchdog) startLost(ctx context.Context, sensor string, last *jetstream.RawStreamMsg, h nats.Header) trace.Span {
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("sensor.id", sensor),
		attribute.Int64("watchdog.last_reading_seq", int64(last.Sequence)),
		attribute.String("watchdog.last_reading_time", last.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00")),
	)}
	if sc := tracing.ExtractNATS(last.Header); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, span := w.tracer.Start(ctx, SpanLost, opts...)
	tracing.InjectNATS(ctx, h)
	return span
}

// endLost ends a lost decision's span with the outcome of the fact's append.
func endLost(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
