package notifier

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// With a tracer, every attempt of a retried delivery is a span, exported over OTLP, with
// its attempt number, host, status and outcome, a grandchild of the span the EVENTS message's
// traceparent names (the relay's publish) through the event's intake span; each request carries the traceparent of its attempt's
// span, so the receiver can join the trace. Without one, no traceparent is sent.
func TestAttemptsAreTraced(t *testing.T) {
	t.Parallel()
	recv := testenv.OTLP(t)
	tp := recv.Provider(t)
	e := newEnv(t, 200*time.Millisecond)
	e.tracer = tp.Tracer("notifier")
	rc := newReceiver(t, func(n int, _ http.ResponseWriter, _ *http.Request) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	e.subscribed(rc.URL)
	e.start()
	ev := testEvent("s1", 1, 1)
	e.seedState(ev)
	const readingTrace, readingSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	d, _ := json.Marshal(ev)
	m := &nats.Msg{Subject: natsx.EventsSubject(partition.Of(ev.SensorID, testPartitions), ev.SensorID), Data: d, Header: nats.Header{}}
	m.Header.Set(tracing.Traceparent, "00-"+readingTrace+"-"+readingSpan+"-01")
	if _, err := e.nats.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(ev.ID)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "2 attempts", func() bool { return rc.count() >= 2 })
	testenv.Eventually(t, 10*time.Second, "2 attempt spans", func() bool {
		_ = tp.ForceFlush(t.Context())
		return len(recv.Named(SpanAttempt)) >= 2
	})
	intakes := recv.Named(SpanIntake)
	if len(intakes) != 1 {
		t.Fatalf("%d intake spans, want 1: %+v", len(intakes), intakes)
	}
	intake := intakes[0]
	if intake.TraceID != readingTrace || intake.ParentSpanID != readingSpan || intake.Error ||
		intake.Attrs["event.id"] != ev.ID || intake.Attrs["sensor.id"] != "s1" || intake.Attrs["sensor.revision"] != "1" {
		t.Errorf("intake span: %+v", intake)
	}
	spans := map[string]testenv.Span{}
	for _, s := range recv.Named(SpanAttempt) {
		spans[s.TraceID+"-"+s.SpanID] = s
	}
	host := strings.TrimPrefix(rc.URL, "http://")
	for i, h := range rc.got()[:2] {
		f := strings.Split(h.header.Get(tracing.Traceparent), "-")
		if len(f) != 4 {
			t.Fatalf("attempt %d: traceparent %q", i+1, h.header.Get(tracing.Traceparent))
		}
		s, ok := spans[f[1]+"-"+f[2]]
		if !ok {
			t.Fatalf("attempt %d: traceparent %v names no exported span", i+1, f)
		}
		wantStatus, wantOutcome := []string{"503", "200"}[i], []string{StatePending, StateDelivered}[i]
		if s.Attrs["webhook.attempt"] != strconv.Itoa(i+1) || s.Attrs["server.address"] != host || s.Attrs["webhook.event_id"] != ev.ID ||
			s.Attrs["http.response.status_code"] != wantStatus || s.Attrs["webhook.outcome"] != wantOutcome || s.Error != (i == 0) ||
			s.TraceID != readingTrace || s.ParentSpanID != intake.SpanID {
			t.Errorf("attempt %d span: %+v", i+1, s)
		}
	}

	plain := newEnv(t)
	rc2 := newReceiver(t, nil)
	plain.client("c1", rc2.URL)
	plain.sensor("s1", "here")
	plain.subscribe("c1", "s1")
	plain.start()
	plain.publish(testEvent("s1", 1, 1))
	testenv.Eventually(t, 15*time.Second, "an attempt without tracing", func() bool { return rc2.count() >= 1 })
	if tp := rc2.got()[0].header.Get(tracing.Traceparent); tp != "" {
		t.Errorf("without a tracer the webhook carried traceparent %q", tp)
	}
}

// Head sampling never changes what is delivered: an event whose trace was not sampled
// (traceparent flags 00) is delivered like any other, its request carries the unsampled
// trace's traceparent, and no span is exported.
func TestUnsampledTraceIsDeliveredAlike(t *testing.T) {
	t.Parallel()
	recv := testenv.OTLP(t)
	tp := recv.Provider(t)
	e := newEnv(t)
	e.tracer = tp.Tracer("notifier")
	rc := newReceiver(t, nil)
	e.subscribed(rc.URL)
	e.start()
	ev := testEvent("s1", 1, 1)
	e.seedState(ev)
	const readingTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	d, _ := json.Marshal(ev)
	m := &nats.Msg{Subject: natsx.EventsSubject(partition.Of(ev.SensorID, testPartitions), ev.SensorID), Data: d, Header: nats.Header{}}
	m.Header.Set(tracing.Traceparent, "00-"+readingTrace+"-00f067aa0ba902b7-00")
	if _, err := e.nats.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(ev.ID)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the delivery", func() bool { return rc.count() >= 1 })
	f := strings.Split(rc.got()[0].header.Get(tracing.Traceparent), "-")
	if len(f) != 4 || f[1] != readingTrace || f[3] != "00" {
		t.Errorf("unsampled delivery's traceparent %v, want trace %s flags 00", f, readingTrace)
	}
	_ = tp.ForceFlush(t.Context())
	if n := len(recv.Spans()); n != 0 {
		t.Errorf("%d spans exported for an unsampled trace", n)
	}
}
