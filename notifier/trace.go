package notifier

import (
	"context"
	"net/url"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// SpanIntake is the span of one event's intake: from the EVENTS message to the commit of
// its deliveries.
const SpanIntake = "notifier.intake"

// startIntake starts a span per event of ok (Deps.Tracer set), a child of the span its
// EVENTS message's traceparent names (the relay's publish), and returns the spans'
// traceparents, which the event's deliveries keep for their attempts.
func (n *Notifier) startIntake(ctx context.Context, evs []event.Event, ok []jetstream.Msg) ([]trace.Span, []string) {
	spans, tps := make([]trace.Span, len(ok)), make([]string, len(ok))
	for i, m := range ok {
		e := evs[i]
		pctx := ctx
		if sc := tracing.ExtractNATS(m.Headers()); sc.IsValid() {
			pctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
		sctx, span := n.tracer.Start(pctx, SpanIntake, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			attribute.String("event.id", e.ID),
			attribute.String("event.type", e.Type),
			attribute.String("sensor.id", e.SensorID),
			attribute.Int64("sensor.revision", e.Revision),
		))
		spans[i], tps[i] = span, tracing.TraceparentOf(sctx)
	}
	return spans, tps
}

// endIntake ends the intake spans once the deliveries committed (err nil) or failed.
func endIntake(spans []trace.Span, err error) {
	for _, span := range spans {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

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
