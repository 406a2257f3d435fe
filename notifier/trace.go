package notifier

import (
	"context"
	"net/url"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// SpanAttempt is the span of one webhook attempt.
const SpanAttempt = "notifier.attempt"

// startAttempt starts the span of one attempt of c (Deps.Tracer set): the event, client,
// sensor, revision, attempt number and the URL's host; the request then carries its
// traceparent.
func (n *Notifier) startAttempt(ctx context.Context, c claimed) (context.Context, trace.Span) {
	host := ""
	if u, err := url.Parse(c.url); err == nil {
		host = u.Host
	}
	if sc := tracing.FromTraceparent(c.traceparent); sc.IsValid() {
		// A child of the reading's span: the attempt joins the reading's trace.
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return n.tracer.Start(ctx, SpanAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("webhook.event_id", c.eventID),
		attribute.String("webhook.client_id", c.clientID),
		attribute.String("sensor.id", c.sensorID),
		attribute.Int64("sensor.revision", c.revision),
		attribute.Int("webhook.attempt", c.attempts+1),
		attribute.String("server.address", host),
	))
}

// endAttempt ends an attempt's span with its status code, latency and outcome.
func endAttempt(span trace.Span, r result) {
	span.SetAttributes(
		attribute.Int("http.response.status_code", r.status),
		attribute.Int64("webhook.latency_ms", r.latency.Milliseconds()),
		attribute.String("webhook.outcome", r.state),
	)
	if r.aborted {
		span.SetAttributes(attribute.Bool("webhook.aborted", true))
	} else if r.state != StateDelivered {
		span.SetStatus(codes.Error, r.errText)
	}
	span.End()
}
