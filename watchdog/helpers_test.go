package watchdog

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

const testPartitions = 4

// env is one test's real servers: embedded NATS, a fresh Postgres database, and a private
// RabbitMQ queue drained by a minimal test bridge (RabbitMQ → READINGS), whose depth and
// consumer count feed the watchdog's Lag hook.
type env struct {
	t      testing.TB
	nats   *testenv.NATSEnv
	pg     *pgxpool.Pool
	pgURL  string
	rabbit *testenv.RabbitEnv
	lag    LagFunc
	// leaseTTL is the partition leases' TTL, in the bucket and in every watchdog of the
	// test (0: lease.TTLDefault).
	leaseTTL time.Duration

	mu     sync.Mutex
	bridge context.CancelFunc
	// bridgeJS is the test bridge's own connection, slower to reconnect than the
	// watchdog's, as a separate bridge process may well be.
	bridgeJS jetstream.JetStream
}

func newEnv(t testing.TB, lostAfter time.Duration) *env {
	t.Helper()
	return newEnvLeases(t, lostAfter, 0)
}

// newEnvLeases is newEnv with partition leases of leaseTTL (0: lease.TTLDefault).
func newEnvLeases(t testing.TB, lostAfter, leaseTTL time.Duration) *env {
	t.Helper()
	e := &env{t: t, nats: testenv.NATS(t), leaseTTL: leaseTTL}
	e.pgURL, e.pg = testenv.Postgres(t)
	e.rabbit = testenv.RabbitMQ(t)
	ctx := context.Background()
	if err := natsx.Declare(ctx, e.nats.JS, natsx.StreamsConfig{Partitions: testPartitions, LostAfter: lostAfter, LeaseTTL: leaseTTL}); err != nil {
		t.Fatal(err)
	}
	ch, err := e.rabbit.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.rabbit.Queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
	bnc, err := nats.Connect(e.nats.URL, nats.MaxReconnects(-1), nats.ReconnectWait(time.Second), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bnc.Close)
	if e.bridgeJS, err = jetstream.New(bnc); err != nil {
		t.Fatal(err)
	}
	e.lag = RabbitLag(e.rabbit.URL, e.rabbit.Queue, 0, 50*time.Millisecond)
	e.startBridge()
	t.Cleanup(e.stopBridge)
	return e
}

type sensorMsg struct {
	SensorID string `json:"sensor_id"`
	Data     uint8  `json:"data"`
}

// startBridge drains the queue into READINGS, as the real bridge does, acking after the append.
func (e *env) startBridge() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// Its own connection, as a bridge process has.
	conn, err := amqp.Dial(e.rabbit.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	_ = ch.Qos(100, 0, false)
	deliveries, err := ch.ConsumeWithContext(ctx, e.rabbit.Queue, "", false, false, false, false, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			var m sensorMsg
			if err := json.Unmarshal(d.Body, &m); err != nil {
				_ = d.Nack(false, false)
				continue
			}
			if _, err := e.appendWith(context.Background(), e.bridgeJS, m.SensorID, d.MessageId); err != nil {
				_ = d.Nack(false, true)
				continue
			}
			_ = d.Ack(false)
		}
	}()
	e.mu.Lock()
	e.bridge = func() {
		// Cancel the consumer and let the loop finish what was delivered before closing:
		// an ack on a closed channel would be a connection error.
		cancel()
		<-done
		_ = ch.Close()
		_ = conn.Close()
	}
	e.mu.Unlock()
}

func (e *env) stopBridge() {
	e.mu.Lock()
	stop := e.bridge
	e.bridge = nil
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// publishRabbit is a sensor publishing a reading to RabbitMQ.
func (e *env) publishRabbit(sensor string, n int) {
	e.t.Helper()
	ch, err := e.rabbit.Conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer ch.Close()
	body, _ := json.Marshal(sensorMsg{SensorID: sensor, Data: 1})
	if err := ch.PublishWithContext(context.Background(), "", e.rabbit.Queue, false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body, MessageId: fmt.Sprintf("%s-%d", sensor, n)}); err != nil {
		e.t.Fatal(err)
	}
}

// append writes a reading straight to READINGS, received now.
func (e *env) append(ctx context.Context, sensor, id string) (time.Time, error) {
	return e.appendWith(ctx, e.nats.JS, sensor, id)
}

func (e *env) appendWith(ctx context.Context, js jetstream.JetStream, sensor, id string) (time.Time, error) {
	now, _, err := e.appendSeq(ctx, js, sensor, id)
	return now, err
}

// appendSeq is appendWith that also returns the reading's READINGS sequence.
func (e *env) appendSeq(ctx context.Context, js jetstream.JetStream, sensor, id string) (time.Time, uint64, error) {
	now := time.Now().UTC()
	if id == "" {
		id = fmt.Sprintf("%s@%d", sensor, now.UnixNano())
	}
	b, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: sensor, Data: 1, Time: now, ReceivedTime: now, MessageID: id})
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: natsx.ReadingsSubject(sensor), Data: b}, jetstream.WithMsgID(id))
	if err != nil {
		return now, 0, err
	}
	return now, ack.Sequence, nil
}

func (e *env) reading(sensor string) time.Time {
	e.t.Helper()
	var at time.Time
	var err error
	for i := 0; i < 50; i++ { // NATS may be restarting
		if at, err = e.append(context.Background(), sensor, ""); err == nil {
			return at
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("append reading: %v", err)
	return at
}

// start runs a watchdog until the returned stop is called (or the test ends).
func (e *env) start(cfg Config) (*Watchdog, *prometheus.Registry, func()) {
	e.t.Helper()
	return e.startOn(cfg, e.nats.JS)
}

// startOn is start with the watchdog's own connection to NATS (through a proxy, say).
func (e *env) startOn(cfg Config, js jetstream.JetStream) (*Watchdog, *prometheus.Registry, func()) {
	e.t.Helper()
	if cfg.PartitionCount == 0 {
		cfg.PartitionCount = testPartitions
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = e.leaseTTL
	}
	reg := prometheus.NewRegistry()
	w, err := New(cfg, Deps{JS: js, PG: e.pg, Logger: testenv.Logger(e.t), Registerer: reg, Lag: e.lag})
	if err != nil {
		e.t.Fatal(err)
	}
	stop := testenv.RunPart(e.t, "watchdog", w.Run, 20*time.Second)
	return w, reg, stop
}

// handDriven is a watchdog that is not running, for a test to drive settle by hand, and
// READINGS as settle reads it.
func (e *env) handDriven(lostAfter time.Duration) (*Watchdog, jetstream.Stream) {
	e.t.Helper()
	w, err := New(Config{PartitionCount: testPartitions, LostAfter: lostAfter, LeaseTTL: e.leaseTTL},
		Deps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(e.t), Registerer: prometheus.NewRegistry(), Lag: e.lag})
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := e.nats.JS.Stream(context.Background(), natsx.ReadingsStream)
	if err != nil {
		e.t.Fatal(err)
	}
	return w, s
}

type seenFact struct {
	fact event.Log
	seq  uint64
	seen time.Time
}

// facts collects every liveness_timeout appended to READINGS.
type facts struct {
	mu  sync.Mutex
	all []seenFact
}

func (e *env) collectFacts() *facts {
	e.t.Helper()
	f := &facts{}
	oc, err := e.nats.JS.OrderedConsumer(context.Background(), natsx.ReadingsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		l, err := event.DecodeLog(m.Data())
		if err != nil || l.Kind != event.KindLivenessTimeout {
			return
		}
		md, _ := m.Metadata()
		f.mu.Lock()
		f.all = append(f.all, seenFact{fact: l, seq: md.Sequence.Stream, seen: time.Now()})
		f.mu.Unlock()
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cc.Stop)
	return f
}

func (f *facts) of(sensor string) []seenFact {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []seenFact
	for _, s := range f.all {
		if s.fact.SensorID == sensor {
			out = append(out, s)
		}
	}
	return out
}

// waitFact polls until sensor has a fact or the deadline passes.
func (f *facts) waitFact(sensor string, deadline time.Time) (seenFact, bool) {
	for time.Now().Before(deadline) {
		if got := f.of(sensor); len(got) > 0 {
			return got[0], true
		}
		time.Sleep(20 * time.Millisecond)
	}
	got := f.of(sensor)
	if len(got) > 0 {
		return got[0], true
	}
	return seenFact{}, false
}

func counter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// settle is settleDeferred with its declared mark written at once: one expiry settled as the
// workers settle each of a batch.
func (w *Watchdog) settle(ctx context.Context, readings jetstream.Stream, sensor string, c candidate) error {
	mark, err := w.settleDeferred(ctx, readings, sensor, c)
	if mark != nil {
		w.writeMark(ctx, *mark)
	}
	return err
}
