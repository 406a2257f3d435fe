package tracing_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, false},
	} {
		if got := tracing.Enabled(env(tc.env)); got != tc.want {
			t.Errorf("Enabled(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

// Without an endpoint there is no provider and no tracer: the parts skip tracing.
func TestOffWithoutAnEndpoint(t *testing.T) {
	t.Parallel()
	tr, err := tracing.Setup(t.Context(), env(nil), "v0")
	if err != nil || tr != nil || tr.Tracer("x") != nil || tr.Shutdown(t.Context()) != nil {
		t.Fatalf("Setup without an endpoint = %v, %v", tr, err)
	}
	_, err = tracing.Setup(t.Context(), env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}), "v0")
	if !errors.Is(err, tracing.ErrProtocol) {
		t.Fatalf("http/json protocol: %v", err)
	}
}

// With OTEL_EXPORTER_OTLP_ENDPOINT, spans reach a real OTLP/HTTP receiver with service.name;
// OTEL_TRACES_SAMPLER=parentbased_traceidratio at 0 drops a root span but keeps the child
// of a sampled parent from a traceparent.
func TestSetupExportsByTheVariables(t *testing.T) {
	recv := testenv.OTLP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "locks-test")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	tr, err := tracing.Setup(t.Context(), os.Getenv, "v1.2.3")
	if err != nil || tr == nil {
		t.Fatalf("Setup = %v, %v", tr, err)
	}
	tracer := tr.Tracer("test")
	_, root := tracer.Start(t.Context(), "root", trace.WithAttributes(attribute.String("sensor.id", "s1")))
	root.End()

	h := nats.Header{}
	h.Set(tracing.Traceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	parent := tracing.ExtractNATS(h)
	if !parent.IsValid() || !parent.IsSampled() || parent.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("ExtractNATS = %v", parent)
	}
	ctx, child := tracer.Start(trace.ContextWithRemoteSpanContext(t.Context(), parent), "child")
	out := nats.Header{}
	tracing.InjectNATS(ctx, out)
	child.End()
	if got := out.Get(tracing.Traceparent); got != "00-0af7651916cd43dd8448eb211c80319c-"+child.SpanContext().SpanID().String()+"-01" {
		t.Errorf("injected traceparent %q", got)
	}
	if err := tr.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the child span at the receiver", func() bool { return len(recv.Named("child")) == 1 })
	c := recv.Named("child")[0]
	if c.Service != "locks-test" || c.TraceID != "0af7651916cd43dd8448eb211c80319c" || c.ParentSpanID != "b7ad6b7169203331" {
		t.Errorf("child span = %+v", c)
	}
	if n := len(recv.Named("root")); n != 0 {
		t.Errorf("a root span was exported at ratio 0 (%d)", n)
	}
}

// OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports over OTLP/gRPC; the traces' own variable wins
// over the general one.
func TestSetupExportsOverGRPC(t *testing.T) {
	for _, tc := range []struct{ name, general, traces string }{
		{"general", "grpc", ""},
		{"traces' own", "http/protobuf", "grpc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv := testenv.OTLP(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.GRPCURL)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.general)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", tc.traces)
			tr, err := tracing.Setup(t.Context(), os.Getenv, "v1.2.3")
			if err != nil || tr == nil {
				t.Fatalf("Setup = %v, %v", tr, err)
			}
			_, span := tr.Tracer("test").Start(t.Context(), "over-grpc")
			span.End()
			if err := tr.Shutdown(t.Context()); err != nil {
				t.Fatal(err)
			}
			if n := len(recv.Named("over-grpc")); n != 1 {
				t.Fatalf("%d spans at the gRPC receiver, want 1", n)
			}
		})
	}
}
