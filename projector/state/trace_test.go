package state

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/outbox"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// With a tracer, each applied batch is a state.apply span, exported over OTLP, linked to the
// span of every reading in it whose READINGS message carries a traceparent.
func TestApplyBatchIsTracedWithLinks(t *testing.T) {
	t.Parallel()
	recv := testenv.OTLP(t)
	tp := recv.Provider(t)
	e := newStateEnv(t, 1)
	e.tracer = tp.Tracer("state")
	now := time.Now().UTC()
	var want []string
	for i := range 3 {
		l := event.Log{V: event.Version, Kind: event.KindReading, SensorID: "s1", Data: uint8(i % 2),
			Time: now, ReceivedTime: now.Add(time.Duration(i) * time.Millisecond), MessageID: fmt.Sprint("m", i)}
		traceID, spanID := fmt.Sprintf("%032x", i+1), fmt.Sprintf("%016x", i+1)
		m := &nats.Msg{Subject: natsx.ReadingsSubject(l.SensorID), Data: stateJSON(t, l), Header: nats.Header{}}
		m.Header.Set(tracing.Traceparent, "00-"+traceID+"-"+spanID+"-01")
		if _, err := e.nats.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(stateMsgID(l))); err != nil {
			t.Fatal(err)
		}
		want = append(want, traceID+"/"+spanID)
	}
	e.runState(t, e.nats.JS, nil)
	var links []string
	testenv.Eventually(t, 20*time.Second, "state.apply spans linking the three readings", func() bool {
		_ = tp.ForceFlush(t.Context())
		links = links[:0]
		for _, s := range recv.Named(SpanApply) {
			if s.Attrs["partition"] != "0" || s.ParentSpanID != "" || s.Error {
				t.Fatalf("apply span %+v", s)
			}
			links = append(links, s.Links...)
		}
		slices.Sort(links)
		return slices.Equal(links, want)
	})
	events := 0
	for _, s := range recv.Named(SpanApply) {
		var n int
		_, _ = fmt.Sscan(s.Attrs["batch.events"], &n)
		events += n
	}
	if events != 3 { // the first reading and two changes
		t.Errorf("apply spans count %d events, want 3 (links %s)", events, strings.Join(links, " "))
	}
}

// With a tracer, each event an applied message derives is a state.event span, linked to
// its batch's state.apply span, whose traceparent the outbox row keeps: the relay's
// outbox.publish span is its child and the EVENTS message carries the publish's
// traceparent. A state change and a connection_lost are children of their message's span
// (the reading's; the watchdog's decision for a liveness_timeout fact); a
// connection_restored roots a trace of its own, linked to the reading that restored the
// sensor. Without a tracer no EVENTS message carries a traceparent.
func TestEventsCarryTheReadingsTraceparent(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{true, false} {
		t.Run(fmt.Sprint("traced=", traced), func(t *testing.T) {
			t.Parallel()
			e := newStateEnv(t, 2)
			recv := testenv.OTLP(t)
			tp := recv.Provider(t)
			if traced {
				e.tracer = tp.Tracer("state")
			}
			now := time.Now().UTC()
			msgTP := map[string]string{} // a message's position → its traceparent's span id
			// traceOf is the trace id of a message's traceparent: its span id, widened.
			traceOf := func(spanID string) string { return strings.Repeat("0", 16) + spanID }
			for i, r := range []struct {
				sensor string
				kind   string
				data   uint8
			}{{"s1", event.KindReading, 1}, {"s2", event.KindReading, 0}, {"s1", event.KindReading, 1},
				{"s1", event.KindReading, 0}, {"s1", event.KindLivenessTimeout, 0}, {"s1", event.KindReading, 0}} {
				l := event.Log{V: event.Version, Kind: r.kind, SensorID: r.sensor, Data: r.data,
					Time: now, ReceivedTime: now.Add(time.Duration(i) * time.Second), MessageID: fmt.Sprint("m", i)}
				if r.kind == event.KindLivenessTimeout {
					l.Data, l.Time, l.MessageID, l.LostAfter = 0, time.Time{}, "", time.Second
				}
				spanID := fmt.Sprintf("%016x", i+1)
				m := &nats.Msg{Subject: natsx.ReadingsSubject(l.SensorID), Data: stateJSON(t, l), Header: nats.Header{}}
				m.Header.Set(tracing.Traceparent, fmt.Sprintf("00-%032x-%s-01", i+1, spanID))
				if _, err := e.nats.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(stateMsgID(l))); err != nil {
					t.Fatal(err)
				}
				msgTP[fmt.Sprint(i)] = spanID
			}
			e.runState(t, e.nats.JS, nil)
			var got []jetstream.Msg
			testenv.Eventually(t, 20*time.Second, "five EVENTS messages", func() bool {
				got = readEventMsgs(t, e.nats.JS)
				return len(got) == 5
			})
			if !traced {
				for _, m := range got {
					if h := m.Headers().Get(tracing.Traceparent); h != "" {
						t.Errorf("untraced EVENTS message with traceparent %q", h)
					}
				}
				return
			}
			// The message each event came from, by its READINGS position: the first
			// reading, s2's, s1's change, the fact, the reading that restored s1.
			wantFrom := map[string]string{"state_changed/s1/1": "0", "state_changed/s2/1": "1", "state_changed/s1/2": "3",
				"connection_lost/s1/3": "4", "connection_restored/s1/4": "5"}
			byID := func(id string) (testenv.Span, bool) {
				for _, s := range recv.Spans() {
					if s.SpanID == id {
						return s, true
					}
				}
				return testenv.Span{}, false
			}
			applies := map[string]bool{}
			testenv.Eventually(t, 10*time.Second, "the spans of five events and their publishes", func() bool {
				_ = tp.ForceFlush(t.Context())
				return len(recv.Named(SpanEvent)) == 5 && len(recv.Named(outbox.SpanPublish)) == 5
			})
			for _, s := range recv.Named(SpanApply) {
				applies[s.TraceID+"/"+s.SpanID] = true
			}
			for _, m := range got {
				ev, err := event.DecodeEvent(m.Data())
				if err != nil {
					t.Fatal(err)
				}
				key := fmt.Sprint(ev.Type, "/", ev.SensorID, "/", ev.Revision)
				from, ok := wantFrom[key]
				if !ok {
					t.Fatalf("unexpected event %s", key)
				}
				sc := tracing.FromTraceparent(m.Headers().Get(tracing.Traceparent))
				pub, ok := byID(sc.SpanID().String())
				if !ok || pub.Name != outbox.SpanPublish || pub.Attrs["messaging.message.id"] != ev.ID || pub.Error {
					t.Fatalf("%s: EVENTS traceparent names %+v, want its outbox.publish", key, pub)
				}
				evSpan, ok := byID(pub.ParentSpanID)
				if !ok || evSpan.Name != SpanEvent || evSpan.TraceID != pub.TraceID || evSpan.Attrs["event.id"] != ev.ID ||
					evSpan.Attrs["event.type"] != ev.Type || evSpan.Attrs["sensor.id"] != ev.SensorID {
					t.Fatalf("%s: the publish's parent is %+v, want its state.event", key, evSpan)
				}
				linked := map[string]bool{}
				for _, l := range evSpan.Links {
					linked[l] = true
				}
				var apply bool
				for l := range linked {
					apply = apply || applies[l]
				}
				if !apply {
					t.Errorf("%s: state.event links %v, none a state.apply span", key, evSpan.Links)
				}
				readingSpan := msgTP[from]
				if ev.Type == event.TypeConnectionRestored {
					if evSpan.ParentSpanID != "" || !linked[traceOf(readingSpan)+"/"+readingSpan] {
						t.Errorf("%s: state.event %+v, want a root linked to the reading %s", key, evSpan, readingSpan)
					}
					continue
				}
				if evSpan.ParentSpanID != readingSpan || evSpan.TraceID != traceOf(readingSpan) {
					t.Errorf("%s: state.event %+v, want a child of its message's span %s", key, evSpan, readingSpan)
				}
			}
		})
	}
}

// readEventMsgs reads the whole EVENTS stream with its headers.
func readEventMsgs(t *testing.T, js jetstream.JetStream) []jetstream.Msg {
	t.Helper()
	c, err := js.OrderedConsumer(t.Context(), natsx.EventsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	return out
}
