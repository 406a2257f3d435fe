// Package tracing sets up OpenTelemetry traces from the standard OTEL_* variables and carries
// a trace's context (W3C traceparent) in NATS message headers and webhook requests.
//
// Tracing is off unless an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Off, Setup returns a nil *Tracing whose Tracer is
// nil, and the parts, given a nil trace.Tracer, skip every tracing call behind one branch:
// no span, no context, no header.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ServiceNameDefault is service.name unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say
// otherwise.
const ServiceNameDefault = "lock-sensors"

// ErrProtocol is an OTEL_EXPORTER_OTLP_PROTOCOL other than http/protobuf and grpc.
var ErrProtocol = errors.New("OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf or grpc")

// Tracing is the process's tracer provider; nil when tracing is off.
type Tracing struct {
	tp *sdktrace.TracerProvider
}

// Enabled tells whether the variables ask for traces: an OTLP endpoint is set, and neither
// OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup builds the tracer provider the OTEL_* variables describe, or nil when they ask for
// none. The exporter is OTLP over HTTP (http/protobuf, the default) or gRPC, as
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or else OTEL_EXPORTER_OTLP_PROTOCOL says; endpoint,
// headers, timeout and compression come from OTEL_EXPORTER_OTLP_*. The sampler is
// OTEL_TRACES_SAMPLER (default parentbased_always_on; parentbased_traceidratio with
// OTEL_TRACES_SAMPLER_ARG for a ratio), read by the SDK. The exporter reads the process's
// environment itself, so getenv must be os.Getenv outside tests of Enabled.
func Setup(ctx context.Context, getenv func(string) string, version string) (*Tracing, error) {
	if !Enabled(getenv) {
		return nil, nil
	}
	protocol := "http/protobuf"
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		switch p := getenv(k); p {
		case "":
		case "http/protobuf", "grpc":
			protocol = p // the traces' own variable, read last, wins
		default:
			return nil, fmt.Errorf("%s=%q: %w", k, p, ErrProtocol)
		}
	}
	var exp sdktrace.SpanExporter
	var err error
	if protocol == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter (%s): %w", protocol, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", ServiceNameDefault), attribute.String("service.version", version)),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithFromEnv())
	if err != nil && res == nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return &Tracing{tp: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))}, nil
}

// Tracer is the tracer of a part; nil when tracing is off.
func (t *Tracing) Tracer(name string) trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tp.Tracer(name)
}

// Shutdown exports what is buffered and stops; nothing when tracing is off.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// w3c is the W3C Trace Context propagator: traceparent (and tracestate).
var w3c = propagation.TraceContext{}

// Traceparent is the header name W3C Trace Context gives the context.
const Traceparent = "traceparent"

// natsHeader carries a context in NATS headers under their exact W3C names (NATS header
// names are case-sensitive, unlike HTTP's).
type natsHeader nats.Header

func (h natsHeader) Get(k string) string { return nats.Header(h).Get(k) }
func (h natsHeader) Set(k, v string)     { nats.Header(h).Set(k, v) }
func (h natsHeader) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// InjectNATS writes ctx's span context into h (nothing when ctx has none).
func InjectNATS(ctx context.Context, h nats.Header) { w3c.Inject(ctx, natsHeader(h)) }

// ExtractNATS is the span context of h's traceparent, or an invalid one.
func ExtractNATS(h nats.Header) trace.SpanContext {
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), natsHeader(h)))
}

// InjectHTTP writes ctx's span context into an HTTP request's header.
func InjectHTTP(ctx context.Context, h http.Header) { w3c.Inject(ctx, propagation.HeaderCarrier(h)) }

// TraceparentOf is the traceparent header value of ctx's span, or "" when it has none.
func TraceparentOf(ctx context.Context) string {
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c[Traceparent]
}

// FromTraceparent is the span context a traceparent value names, or an invalid one.
func FromTraceparent(v string) trace.SpanContext {
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier{Traceparent: v}))
}
