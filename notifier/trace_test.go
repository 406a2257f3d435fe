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
// its attempt number, host, status and outcome, a child of the span the EVENTS message's
// traceparent names (the reading's); each request carries the traceparent of its attempt's
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
	e.client("c1", rc.URL)
	e.sensor("s1", "here")
	e.subscribe("c1", "s1")
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
			s.TraceID != readingTrace || s.ParentSpanID != readingSpan {
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
