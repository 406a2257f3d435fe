package e2e_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// tracedHook is one request the tracing test's receiver got.
type tracedHook struct {
	id, traceparent string
	status          int
}

// One trace per reading that changed the state, in a real Jaeger (OTLP over gRPC): the
// bridge's append, the state projector's event, the relay's publish, the notifier's intake
// and every attempt, each the child of the one before, in causal order, with their
// attributes; a retried delivery shows each attempt; and the receiver got a traceparent
// naming its attempt's span in that trace.
func TestReadingTraceInJaeger(t *testing.T) {
	t.Parallel()
	j := testenv.StartJaeger(t)
	s := start(t, "OTEL_EXPORTER_OTLP_ENDPOINT="+j.OTLPGRPC, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_BSP_SCHEDULE_DELAY=100", "LOCKS_RETRY_SCHEDULE=300ms,600ms")

	var mu sync.Mutex
	var got []tracedHook
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		h := tracedHook{id: req.Header.Get("webhook-id"), traceparent: req.Header.Get("traceparent"), status: http.StatusNoContent}
		mu.Lock()
		defer mu.Unlock()
		// The second event's first attempt fails: it is retried.
		seen, events := false, map[string]bool{}
		for _, g := range got {
			seen = seen || g.id == h.id
			events[g.id] = true
		}
		if !seen && len(events) == 1 {
			h.status = http.StatusServiceUnavailable
		}
		got = append(got, h)
		w.WriteHeader(h.status)
	}))
	t.Cleanup(rcv.Close)
	var client struct {
		ID string `json:"id"`
	}
	if code := s.call("POST", "/v1/clients", map[string]string{"name": "traced", "webhook_url": rcv.URL + "/hook"}, &client); code != 200 {
		t.Fatalf("create client: %d", code)
	}
	if code := s.call("POST", "/v1/sensors", map[string]string{"id": "doorT", "address": "traced"}, nil); code != 200 {
		t.Fatalf("register: %d", code)
	}
	if code := s.call("PUT", "/v1/sensors/doorT/clients/"+client.ID, nil, nil); code != 200 {
		t.Fatalf("subscribe: %d", code)
	}
	ch, err := s.rabbit.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(s.rabbit.Queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publish := func(messageID string, data int) {
		if err := ch.PublishWithContext(t.Context(), "", s.rabbit.Queue, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent,
			ContentType: "application/json", MessageId: messageID, Body: []byte(fmt.Sprintf(`{"sensor_id":"doorT","data":%d}`, data))}); err != nil {
			t.Fatal(err)
		}
	}
	// The first reading (revision 1), a repeat (no event), the change (revision 2), after
	// the first webhook so that the receiver knows which event to fail once.
	publish("m1", 1)
	publish("m2", 1)
	testenv.Eventually(t, 30*time.Second, "the first webhook", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 })
	publish("m3", 0)
	testenv.Eventually(t, 30*time.Second, "the second event's two attempts", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 })
	mu.Lock()
	hooks := append([]tracedHook(nil), got...)
	mu.Unlock()
	host := strings.TrimPrefix(rcv.URL, "http://")

	for _, want := range []struct {
		messageID string
		revision  int64
		attempts  []tracedHook
	}{{"m1", 1, hooks[:1]}, {"m3", 2, hooks[1:]}} {
		f := strings.Split(want.attempts[0].traceparent, "-")
		if len(f) != 4 || f[3] != "01" {
			t.Fatalf("revision %d: traceparent %q", want.revision, want.attempts[0].traceparent)
		}
		traceID := f[1]
		var tr *testenv.JaegerTrace
		byName := map[string][]testenv.JaegerSpan{}
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("revision %d's trace in Jaeger", want.revision), func() bool {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if tr, err = j.Trace(ctx, traceID); err != nil || tr == nil {
				return false
			}
			clear(byName)
			for _, sp := range tr.Spans {
				byName[sp.OperationName] = append(byName[sp.OperationName], sp)
			}
			return len(byName["notifier.attempt"]) == len(want.attempts) && len(byName["bridge.append"]) == 1 &&
				len(byName["state.event"]) == 1 && len(byName["outbox.publish"]) == 1 && len(byName["notifier.intake"]) == 1
		})
		eventID := want.attempts[0].id
		// The chain, each a child of the one before and starting no earlier.
		chain := []struct {
			name string
			tags map[string]string
		}{
			{"bridge.append", map[string]string{"sensor.id": "doorT", "messaging.message.id": want.messageID}},
			{"state.event", map[string]string{"sensor.id": "doorT", "event.id": eventID, "event.type": "state_changed",
				"sensor.revision": fmt.Sprint(want.revision)}},
			{"outbox.publish", map[string]string{"messaging.message.id": eventID}},
			{"notifier.intake", map[string]string{"event.id": eventID, "sensor.id": "doorT"}},
		}
		var parent testenv.JaegerSpan
		for i, c := range chain {
			sp := byName[c.name][0]
			if i == 0 && sp.Parent() != "" {
				t.Errorf("revision %d: bridge.append has a parent %s; want the trace's root", want.revision, sp.Parent())
			}
			if i > 0 && (sp.Parent() != parent.SpanID || sp.StartTime < parent.StartTime) {
				t.Errorf("revision %d: %s (parent %s, start %d) is not a later child of %s (%s, start %d)",
					want.revision, c.name, sp.Parent(), sp.StartTime, parent.OperationName, parent.SpanID, parent.StartTime)
			}
			for k, v := range c.tags {
				if sp.Tag(k) != v {
					t.Errorf("revision %d: %s tag %s = %q, want %q", want.revision, c.name, k, sp.Tag(k), v)
				}
			}
			parent = sp
		}
		attempts := map[string]testenv.JaegerSpan{}
		for _, sp := range byName["notifier.attempt"] {
			attempts[sp.Tag("webhook.attempt")] = sp
		}
		last := parent.StartTime
		for k, h := range want.attempts {
			sp, ok := attempts[fmt.Sprint(k+1)]
			if !ok {
				t.Fatalf("revision %d: no span of attempt %d among %v", want.revision, k+1, attempts)
			}
			if sp.Parent() != parent.SpanID || sp.StartTime < last {
				t.Errorf("revision %d attempt %d: parent %s start %d, want a child of notifier.intake %s after %d",
					want.revision, k+1, sp.Parent(), sp.StartTime, parent.SpanID, last)
			}
			last = sp.StartTime
			if sp.Tag("http.response.status_code") != fmt.Sprint(h.status) || sp.Tag("server.address") != host ||
				sp.Tag("webhook.event_id") != eventID || sp.Tag("webhook.latency_ms") == "" {
				t.Errorf("revision %d attempt %d span tags %+v (status sent %d)", want.revision, k+1, sp.Tags, h.status)
			}
			if wantTP := "00-" + traceID + "-" + sp.SpanID + "-01"; h.traceparent != wantTP {
				t.Errorf("revision %d attempt %d: the receiver got traceparent %q, want %q", want.revision, k+1, h.traceparent, wantTP)
			}
		}
	}

	// A rebuild of the state replays READINGS into shadow tables: it exports no span (the
	// traces stay as they were) and writes no outbox row, while the traceparents stay in the
	// log. A reading after it is traced as before: its trace, exported after anything the
	// rebuild could have exported, is the barrier.
	if code := s.call("POST", "/v1/projections/state:rebuild", map[string]any{}, nil); code != 200 {
		t.Fatalf("start the state rebuild: %d", code)
	}
	testenv.Eventually(t, 60*time.Second, "the state rebuild done", func() bool {
		var list struct {
			Projections []struct {
				Name    string `json:"name"`
				Rebuild struct {
					Phase string `json:"phase"`
				} `json:"rebuild"`
			} `json:"projections"`
		}
		s.call("GET", "/v1/projections", nil, &list)
		for _, p := range list.Projections {
			if p.Name == "state" {
				if p.Rebuild.Phase == "REBUILD_PHASE_FAILED" {
					t.Fatalf("the state rebuild failed")
				}
				return p.Rebuild.Phase == "REBUILD_PHASE_DONE"
			}
		}
		return false
	})
	publish("m4", 1)
	testenv.Eventually(t, 30*time.Second, "the webhook after the rebuild", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 4 })
	mu.Lock()
	after := got[3]
	mu.Unlock()
	afterTrace := strings.Split(after.traceparent, "-")[1]
	testenv.Eventually(t, 30*time.Second, "the trace of the reading after the rebuild", func() bool {
		tr, err := j.Trace(t.Context(), afterTrace)
		if err != nil || tr == nil {
			return false
		}
		for _, sp := range tr.Spans {
			if sp.OperationName == "notifier.attempt" {
				return true
			}
		}
		return false
	})
	ops, err := j.Operations(t.Context(), "lock-sensors", "state.event")
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 3 {
		t.Errorf("%d state.event spans after the rebuild, want 3 (revisions 1, 2, and 3 after it): the rebuild exported spans", len(ops))
	}
	for _, sp := range ops {
		if sp.TraceID == afterTrace && sp.Tag("sensor.revision") != "3" {
			t.Errorf("the event after the rebuild has revision %s, want 3", sp.Tag("sensor.revision"))
		}
	}
}
