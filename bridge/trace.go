package bridge

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// SpanAppend is the span of one reading from its decode to READINGS' ack of its append.
const SpanAppend = "bridge.append"

// startAppend starts a reading's trace (Deps.Tracer set): its span, linked to the AMQP
// message's own traceparent header when the publisher sent one, names the sensor, the
// message_id and the subject; msg's headers then carry the span's traceparent into READINGS.
func (b *Bridge) startAppend(ctx context.Context, d amqp.Delivery, sensorID, messageID, subject string) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		attribute.String("sensor.id", sensorID),
		attribute.String("messaging.message.id", messageID),
		attribute.String("messaging.destination.name", subject),
		attribute.Bool("messaging.rabbitmq.redelivered", d.Redelivered),
	)}
	if tp, ok := d.Headers[tracing.Traceparent].(string); ok {
		if sc := tracing.FromTraceparent(tp); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	return b.tracer.Start(ctx, SpanAppend, opts...)
}

// endAppend ends a reading's span with the outcome of its append.
func endAppend(it item, err error) {
	if it.span == nil {
		return
	}
	if it.dup {
		it.span.SetAttributes(attribute.Bool("reading.duplicate", true))
	}
	if err != nil {
		it.span.SetStatus(codes.Error, err.Error())
	}
	it.span.End()
}
