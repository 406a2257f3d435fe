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

// With a tracer, each event an applied reading derives leaves through the outbox with the
// reading's traceparent: the EVENTS message carries it, for the notifier and any other
// consumer to join the reading's trace. Without a tracer no EVENTS message carries one.
func TestEventsCarryTheReadingsTraceparent(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{true, false} {
		t.Run(fmt.Sprint("traced=", traced), func(t *testing.T) {
			t.Parallel()
			e := newStateEnv(t, 2)
			if traced {
				e.tracer = testenv.OTLP(t).Provider(t).Tracer("state")
			}
			now := time.Now().UTC()
			want := map[string]string{} // event's sensor/data → traceparent
			for i, r := range []struct {
				sensor string
				data   uint8
			}{{"s1", 1}, {"s2", 0}, {"s1", 1}, {"s1", 0}} {
				l := event.Log{V: event.Version, Kind: event.KindReading, SensorID: r.sensor, Data: r.data,
					Time: now, ReceivedTime: now.Add(time.Duration(i) * time.Millisecond), MessageID: fmt.Sprint("m", i)}
				tp := fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)
				m := &nats.Msg{Subject: natsx.ReadingsSubject(l.SensorID), Data: stateJSON(t, l), Header: nats.Header{}}
				m.Header.Set(tracing.Traceparent, tp)
				if _, err := e.nats.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID(stateMsgID(l))); err != nil {
					t.Fatal(err)
				}
				if i != 2 { // the third repeats s1's state: no event
					want[fmt.Sprint(r.sensor, "/", r.data)+fmt.Sprint("#", i)] = tp
				}
			}
			e.runState(t, e.nats.JS, nil)
			var got []jetstream.Msg
			testenv.Eventually(t, 20*time.Second, "three EVENTS messages", func() bool {
				got = readEventMsgs(t, e.nats.JS)
				return len(got) == 3
			})
			var tps []string
			for _, m := range got {
				tps = append(tps, m.Headers().Get(tracing.Traceparent))
			}
			slices.Sort(tps)
			var wantTPs []string
			if traced {
				for _, tp := range want {
					wantTPs = append(wantTPs, tp)
				}
			} else {
				wantTPs = []string{"", "", ""}
			}
			slices.Sort(wantTPs)
			if !slices.Equal(tps, wantTPs) {
				t.Errorf("EVENTS traceparents %q, want %q", tps, wantTPs)
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
