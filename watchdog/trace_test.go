package watchdog

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// With a tracer, declaring a sensor lost is a watchdog.lost span exported over OTLP: the
// root of a trace of its own, linked to the span of the sensor's last reading (its READINGS
// traceparent), whose traceparent the liveness_timeout fact carries into READINGS.
func TestLostIsTracedLinkedToTheLastReading(t *testing.T) {
	t.Parallel()
	const lostAfter = time.Second
	recv := testenv.OTLP(t)
	tp := recv.Provider(t)
	e := newEnv(t, lostAfter)
	w, err := New(Config{PartitionCount: testPartitions, LostAfter: lostAfter},
		Deps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry(), Lag: e.lag, Tracer: tp.Tracer("watchdog")})
	if err != nil {
		t.Fatal(err)
	}
	readings, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	w.parts[partition.Of("traced", testPartitions)] = &partState{lease: t.Context()}
	const readingTrace, readingSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	now := time.Now().UTC()
	b, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: "traced", Data: 1, Time: now, ReceivedTime: now, MessageID: "r1"})
	m := &nats.Msg{Subject: natsx.ReadingsSubject("traced"), Data: b, Header: nats.Header{}}
	m.Header.Set(tracing.Traceparent, "00-"+readingTrace+"-"+readingSpan+"-01")
	if _, err := e.nats.JS.PublishMsg(t.Context(), m, jetstream.WithMsgID("r1")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lostAfter) // the reading must be older than lost_after for settle to declare
	if err := w.settle(t.Context(), readings, "traced", candidate{}); err != nil {
		t.Fatal(err)
	}
	fact, err := readings.GetLastMsgForSubject(t.Context(), natsx.ReadingsStoredSubject(partition.Of("traced", testPartitions), "traced"))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := event.DecodeLog(fact.Data); err != nil || l.Kind != event.KindLivenessTimeout {
		t.Fatalf("last READINGS message %s: %v, want the fact", fact.Data, err)
	}
	sc := tracing.ExtractNATS(fact.Header)
	if !sc.IsValid() {
		t.Fatalf("the fact carries no traceparent: %v", fact.Header)
	}
	testenv.Eventually(t, 10*time.Second, "the watchdog.lost span", func() bool {
		_ = tp.ForceFlush(t.Context())
		return len(recv.Named(SpanLost)) == 1
	})
	s := recv.Named(SpanLost)[0]
	if s.TraceID != sc.TraceID().String() || s.SpanID != sc.SpanID().String() || s.ParentSpanID != "" || s.TraceID == readingTrace ||
		len(s.Links) != 1 || s.Links[0] != readingTrace+"/"+readingSpan || s.Attrs["sensor.id"] != "traced" || s.Error {
		t.Errorf("watchdog.lost span %+v, fact's traceparent %v", s, sc)
	}
}
