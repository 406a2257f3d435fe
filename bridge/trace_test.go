package bridge

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// readingHeaders are the traceparent headers of READINGS' messages, in order.
func (e *env) readingHeaders(t *testing.T, n int) []string {
	t.Helper()
	c, err := e.nats.JS.OrderedConsumer(t.Context(), natsx.ReadingsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for m := range batch.Messages() {
		out = append(out, m.Headers().Get(tracing.Traceparent))
	}
	if len(out) != n {
		t.Fatalf("read %d of %d READINGS messages", len(out), n)
	}
	return out
}

// With a tracer, each reading gets a bridge.append span, exported over OTLP, naming its
// sensor and message_id, linked to the AMQP message's own traceparent; its READINGS message
// carries the span's traceparent. Without one, no header is added.
func TestBridgeTracesEachAppend(t *testing.T) {
	t.Parallel()
	recv := testenv.OTLP(t)
	tp := recv.Provider(t)
	e := newEnv(t, "")
	e.tracer = tp.Tracer("bridge")
	const upstream = "4bf92f3577b34da6a3ce929d0e0e4736"
	e.publish(t, []amqp.Publishing{
		{Body: []byte(`{"sensor_id":"s1","data":1}`), MessageId: "m-1",
			Headers: amqp.Table{tracing.Traceparent: "00-" + upstream + "-00f067aa0ba902b7-01"}},
		{Body: []byte(`{"sensor_id":"s2","data":0}`)},
		{Body: []byte(`{"sensor_id":"s1","data":0}`), MessageId: "m-2"},
	})
	e.start(t, Config{})
	testenv.Eventually(t, time.Minute, "three readings", func() bool { return e.streamMsgs(t) == 3 })
	headers := e.readingHeaders(t, 3)
	testenv.Eventually(t, 10*time.Second, "three bridge.append spans", func() bool {
		_ = tp.ForceFlush(t.Context())
		return len(recv.Named(SpanAppend)) == 3
	})
	spans := map[string]testenv.Span{} // by "traceid-spanid"
	for _, s := range recv.Named(SpanAppend) {
		spans[s.TraceID+"-"+s.SpanID] = s
	}
	want := []struct{ sensor, messageID, link string }{
		{"s1", "m-1", upstream + "/00f067aa0ba902b7"}, {"s2", "", ""}, {"s1", "m-2", ""},
	}
	for i, h := range headers {
		f := strings.Split(h, "-")
		if len(f) != 4 || f[3] != "01" {
			t.Errorf("READINGS message %d: traceparent %q", i, h)
			continue
		}
		s, ok := spans[f[1]+"-"+f[2]]
		if !ok {
			t.Errorf("READINGS message %d: traceparent %q names no exported span", i, h)
			continue
		}
		if s.ParentSpanID != "" || f[1] == upstream || s.Error {
			t.Errorf("span %d is not a new, successful root: %+v", i, s)
		}
		// Without an AMQP message_id the reading's id is derived from the message (identity.go).
		if id := s.Attrs["messaging.message.id"]; s.Attrs["sensor.id"] != want[i].sensor ||
			(want[i].messageID == "" && !strings.HasPrefix(id, "sha256:")) || (want[i].messageID != "" && id != want[i].messageID) ||
			!strings.HasPrefix(s.Attrs["messaging.destination.name"], "readings.") {
			t.Errorf("span %d attributes %v, want sensor %s message_id %q", i, s.Attrs, want[i].sensor, want[i].messageID)
		}
		if got := strings.Join(s.Links, ","); got != want[i].link {
			t.Errorf("span %d links %q, want %q", i, got, want[i].link)
		}
	}

	plain := newEnv(t, "")
	plain.publish(t, []amqp.Publishing{{Body: []byte(`{"sensor_id":"s1","data":1}`)}})
	plain.start(t, Config{})
	testenv.Eventually(t, time.Minute, "a reading without tracing", func() bool { return plain.streamMsgs(t) == 1 })
	if h := plain.readingHeaders(t, 1); h[0] != "" {
		t.Errorf("without a tracer READINGS got traceparent %q", h[0])
	}
}
