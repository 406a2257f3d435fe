package bridge

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// ErrorHeader names the reason of an invalid message in the invalid queue.
const ErrorHeader = "x-lock-sensors-error"

// SizeHeader carries the original size in bytes of a body that was too big: the invalid
// queue keeps only its first InvalidPrefix bytes.
const SizeHeader = "x-lock-sensors-original-size"

// InvalidPrefix is how much of a too-big body the invalid queue keeps: enough to see what
// sent it, never a flood's worth.
const InvalidPrefix = MaxBodySize

// CrashAfterPublish is the crash point between JetStream's ack of an append and the AMQP ack.
const CrashAfterPublish = "bridge.after_publish"

// Config is what the bridge is told; zero fields take the defaults.
type Config struct {
	AMQPURL string
	// Queue is the readings queue (declared durable if missing).
	Queue string
	// InvalidQueue defaults to Queue + ".invalid".
	InvalidQueue string
	// Prefetch is the AMQP QoS: how many unacked messages RabbitMQ sends ahead (default 1000;
	// 3000 was no faster on the 2-core test machine and doubled the append latency).
	Prefetch int
	// MaxInFlight bounds the appends awaiting JetStream's ack (default Prefetch).
	MaxInFlight int
	// ConnectionName is the AMQP connection_name client property (default "locks-bridge")
	// of the consuming connection, shown by `rabbitmqctl list_connections client_properties`;
	// the connection publishing to the invalid queue is named ConnectionName + "-invalid".
	ConnectionName string
	// ReconnectMin and ReconnectMax bound the backoff between RabbitMQ sessions (250ms, 10s).
	ReconnectMin, ReconnectMax time.Duration
	// PublishTimeout is how long an append waits for JetStream's ack before it is retried
	// (default 5s); a retry carries the same Nats-Msg-Id, so it is never recorded twice.
	PublishTimeout time.Duration
	// DrainTimeout bounds how long a stopping bridge waits for the appends in flight so
	// that it can ack them (default 10s); what it cannot ack is redelivered and de-duplicated.
	DrainTimeout time.Duration
	// InvalidMaxLength caps the invalid queue when the bridge declares it (default 100,000
	// messages, the oldest dropped first), so a flood of bad messages cannot fill
	// RabbitMQ's disk. A queue that already exists keeps its own arguments and policies.
	InvalidMaxLength int
	// ClockSkewMax is how far a reading's ts may be from its receive time before it is counted
	// in locks_bridge_clock_skew_total (default ClockSkewMaxDefault; see clock.go).
	ClockSkewMax time.Duration
}

func (c *Config) setDefaults() {
	if c.InvalidQueue == "" && c.Queue != "" {
		c.InvalidQueue = c.Queue + ".invalid"
	}
	if c.Prefetch <= 0 {
		c.Prefetch = 1000
	}
	if c.MaxInFlight <= 0 || c.MaxInFlight > c.Prefetch {
		c.MaxInFlight = c.Prefetch
	}
	if c.ConnectionName == "" {
		c.ConnectionName = "locks-bridge"
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 250 * time.Millisecond
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = max(10*time.Second, c.ReconnectMin)
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 5 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.InvalidMaxLength <= 0 {
		c.InvalidMaxLength = 100_000
	}
	if c.ClockSkewMax <= 0 {
		c.ClockSkewMax = ClockSkewMaxDefault
	}
}

// Validate says what is wrong with a configuration (after defaults).
func (c Config) Validate() error {
	switch {
	case c.AMQPURL == "":
		return errors.New("bridge: AMQP URL is empty")
	case c.Queue == "":
		return errors.New("bridge: queue name is empty")
	case c.InvalidQueue == c.Queue:
		return errors.New("bridge: the invalid queue must differ from the readings queue")
	}
	return nil
}

// Deps are the bridge's collaborators; none may be nil.
type Deps struct {
	// JS is used for its NATS connection (which must reconnect by itself, as
	// natsx.Connect's does); the bridge makes its own JetStream context on it with a bounded
	// async publisher.
	JS         jetstream.JetStream
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Bridge moves readings from RabbitMQ to READINGS.
type Bridge struct {
	cfg Config
	js  jetstream.JetStream
	log *slog.Logger
	m   metrics
	// skew counts readings whose sensor clock is off (clock.go).
	skew *clockSkew
	// lastRetryLog is only touched by the acker goroutine.
	lastRetryLog time.Time
}

type metrics struct {
	accepted   prometheus.Counter
	invalid    *prometheus.CounterVec
	duplicates prometheus.Counter
	latency    prometheus.Histogram
	inFlight   prometheus.Gauge
	connects   prometheus.Counter
	retries    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_readings_accepted_total",
			Help: "Valid readings appended to READINGS (duplicates included) and acked.",
		}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_bridge_invalid_total",
			Help: "Invalid messages moved to the invalid queue, by reason.",
		}, []string{"reason"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_duplicates_total",
			Help: "Appends JetStream recognised as already recorded (a redelivery or a retry).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "locks_bridge_publish_seconds",
			Help:    "Time from the async append to JetStream's ack.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "locks_bridge_in_flight",
			Help: "Messages received and not yet acked to RabbitMQ.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_amqp_connects_total",
			Help: "Successful RabbitMQ sessions started (the first and every reconnect).",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_bridge_publish_retries_total",
			Help: "Appends retried after a failed or timed-out JetStream publish.",
		}),
	}
	for _, reason := range []string{ReasonTooBig, ReasonNotJSON, ReasonSensorID, ReasonData, ReasonTS} {
		m.invalid.WithLabelValues(reason)
	}
	for _, c := range []prometheus.Collector{m.accepted, m.invalid, m.duplicates, m.latency, m.inFlight, m.connects, m.retries} {
		if err := reg.Register(c); err != nil {
			return m, fmt.Errorf("bridge metrics: %w", err)
		}
	}
	return m, nil
}

// New checks cfg and deps and builds a bridge; nothing is dialled until Run.
func New(cfg Config, deps Deps) (*Bridge, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.JS == nil || deps.Log == nil || deps.Registerer == nil {
		return nil, errors.New("bridge: JS, Log and Registerer are required")
	}
	js, err := jetstream.New(deps.JS.Conn(),
		// Our own bound (MaxInFlight) is the one that matters; this one only must not bite first.
		jetstream.WithPublishAsyncMaxPending(2*cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("bridge: JetStream: %w", err)
	}
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	skew, err := newClockSkew(cfg.ClockSkewMax, deps.Registerer)
	if err != nil {
		return nil, err
	}
	return &Bridge{cfg: cfg, js: js, log: deps.Log.With("part", "bridge"), m: m, skew: skew}, nil
}

// Run consumes until ctx is done, reconnecting to RabbitMQ with backoff. It returns nil
// after a clean stop.
func (b *Bridge) Run(ctx context.Context) error {
	backoff := b.cfg.ReconnectMin
	for {
		start := time.Now()
		err := b.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > time.Minute {
			backoff = b.cfg.ReconnectMin
		}
		b.log.Warn("RabbitMQ session ended; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, b.cfg.ReconnectMax)
	}
}

// item is one received message on its way to its AMQP ack, in delivery order.
type item struct {
	tag   uint64
	start time.Time
	// One of: a reading's append (msg, and future or pubErr), or an invalid message's confirm.
	msg     *nats.Msg
	future  jetstream.PubAckFuture
	pubErr  error
	confirm *amqp.DeferredConfirmation
	reason  string
	// dup: a redelivered reading an earlier session had appended; it is acked, not appended.
	dup bool
	// done is closed once the acker has resolved a reading's append (or given up on it).
	done chan struct{}
}

// order keeps a sensor's readings in order in READINGS: a reading is appended only after
// the previous in-flight reading of the same sensor is durable. Without it, a failed append
// retried by the acker could land after a later reading of the same sensor that went
// through (per-sensor order is invariant 4). Different sensors still go in parallel.
type order struct {
	last   map[string]chan struct{}
	failed *atomic.Bool // the session failed: append nothing more, RabbitMQ will redeliver
	n      int
}

// wait blocks until sensor's previous reading is resolved; false means do not append.
func (o *order) wait(ctx context.Context, sensor string) bool {
	if prev, ok := o.last[sensor]; ok {
		select {
		case <-prev:
		case <-ctx.Done():
			return false
		}
	}
	return !o.failed.Load()
}

// track records done as sensor's latest in-flight reading, dropping resolved entries now
// and then so that the map holds about the in-flight window, not every sensor ever seen.
func (o *order) track(sensor string, done chan struct{}) {
	o.last[sensor] = done
	if o.n++; o.n%4096 == 0 {
		for k, ch := range o.last {
			select {
			case <-ch:
				delete(o.last, k)
			default:
			}
		}
	}
}

func (b *Bridge) dial(name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(b.cfg.AMQPURL, amqp.Config{
		Properties: props,
		Heartbeat:  10 * time.Second,
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("dial RabbitMQ: %w", err)
	}
	return conn, nil
}

func (b *Bridge) session(ctx context.Context) error {
	conn, err := b.dial(b.cfg.ConnectionName)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Publishing to the invalid queue has a connection of its own: RabbitMQ blocks a
	// publishing connection under a resource alarm, and acks must still flow meanwhile.
	pubConn, err := b.dial(b.cfg.ConnectionName + "-invalid")
	if err != nil {
		return err
	}
	defer pubConn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	if err := declareQueue(conn, b.cfg.Queue, nil); err != nil {
		return err
	}
	invalidArgs := amqp.Table{"x-max-length": int64(b.cfg.InvalidMaxLength), "x-overflow": "drop-head"}
	if err := declareQueue(conn, b.cfg.InvalidQueue, invalidArgs); err != nil {
		return err
	}
	pub, err := pubConn.Channel()
	if err != nil {
		return fmt.Errorf("open publishing channel: %w", err)
	}
	if err := pub.Confirm(false); err != nil {
		return fmt.Errorf("publisher confirms: %w", err)
	}
	// amqp091-go blocks its reader on a full return channel; at most MaxInFlight (+ the one
	// the reader holds) invalid publishes are outstanding before the session fails on the
	// first return, so this never fills.
	returns := pub.NotifyReturn(make(chan amqp.Return, b.cfg.MaxInFlight+2))
	deliveries, err := ch.Consume(b.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", b.cfg.Queue, err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	pubClosed := pubConn.NotifyClose(make(chan *amqp.Error, 1))
	b.m.connects.Inc()
	b.log.Info("connected to RabbitMQ", "queue", b.cfg.Queue, "prefetch", b.cfg.Prefetch,
		"connection_name", b.cfg.ConnectionName)

	// The drain context outlives ctx by DrainTimeout, so a stopping bridge still acks what
	// JetStream has acknowledged instead of leaving it all to redelivery.
	dctx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	stopDrain := context.AfterFunc(ctx, func() { time.AfterFunc(b.cfg.DrainTimeout, cancelDrain) })
	defer stopDrain()

	sess, err := startSession(ctx, b.js, time.Now())
	if err != nil {
		return err
	}
	pending := make(chan item, b.cfg.MaxInFlight)
	var (
		failOnce sync.Once
		failErr  error
	)
	ord := &order{last: map[string]chan struct{}{}, failed: &atomic.Bool{}}
	fail := func(err error) {
		failOnce.Do(func() {
			ord.failed.Store(true)
			failErr = err
			_ = conn.Close() // unacked messages go back to the queue
			_ = pubConn.Close()
		})
	}
	ackerDone := make(chan struct{})
	go func() {
		defer close(ackerDone)
		b.acker(dctx, ch, sess, pending, returns, fail)
	}()

	var readErr error
read:
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			break read
		case e := <-closed:
			readErr = errors.New("RabbitMQ connection closed")
			if e != nil {
				readErr = fmt.Errorf("RabbitMQ connection closed: %w", e)
			}
			break read
		case e := <-pubClosed:
			readErr = errors.New("RabbitMQ publishing connection closed")
			if e != nil {
				readErr = fmt.Errorf("RabbitMQ publishing connection closed: %w", e)
			}
			break read
		case d, ok := <-deliveries:
			if !ok {
				readErr = errors.New("RabbitMQ channel closed")
				break read
			}
			if !d.Redelivered {
				sess.firstFresh.CompareAndSwap(0, d.DeliveryTag)
			}
			it := b.handle(ctx, pub, d, ord, sess)
			b.m.inFlight.Inc()
			pending <- it // bounded: blocks while MaxInFlight messages await their ack
		}
	}
	close(pending)
	<-ackerDone
	if failErr != nil {
		return failErr
	}
	return readErr
}

// declareQueue declares q durable if it is missing, and takes it as it is if it exists, so
// that an operator may create it with arguments of their own (a quorum queue, a length
// limit) without the bridge failing on "inequivalent arg".
func declareQueue(conn *amqp.Connection, q string, args amqp.Table) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		// The failed passive declare closed the channel.
		if ch, err = conn.Channel(); err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		_, err = ch.QueueDeclare(q, true, false, false, false, args)
	}
	if err != nil {
		return fmt.Errorf("declare queue %s: %w", q, err)
	}
	return ch.Close()
}

// handle starts the work on one delivery: an async append, or a confirmed publish to the
// invalid queue. It never blocks on the result.
func (b *Bridge) handle(ctx context.Context, pub *amqp.Channel, d amqp.Delivery, ord *order, sess *session) item {
	now := time.Now().UTC()
	it := item{tag: d.DeliveryTag, start: now}
	r, err := Decode(d.Body, now)
	if err != nil {
		var ie *InvalidError
		reason, msg := ReasonNotJSON, err.Error()
		if errors.As(err, &ie) {
			reason = ie.Reason
		}
		it.reason = reason
		headers := amqp.Table{}
		for k, v := range d.Headers {
			headers[k] = v
		}
		headers[ErrorHeader] = msg
		body := d.Body
		if len(body) > InvalidPrefix {
			headers[SizeHeader] = int64(len(body))
			body = body[:InvalidPrefix]
		}
		it.confirm, it.pubErr = pub.PublishWithDeferredConfirmWithContext(ctx, "", b.cfg.InvalidQueue, true, false, amqp.Publishing{
			Headers:       headers,
			ContentType:   d.ContentType,
			DeliveryMode:  amqp.Persistent,
			CorrelationId: d.CorrelationId,
			MessageId:     d.MessageId,
			Timestamp:     d.Timestamp,
			Type:          d.Type,
			AppId:         d.AppId,
			Body:          body,
		})
		return it
	}
	b.skew.observe(r)
	id := MessageID(d)
	origin := sess.id + "/" + strconv.FormatUint(d.DeliveryTag, 10)
	body, err := json.Marshal(event.Log{
		V: event.Version, Kind: event.KindReading, SensorID: r.SensorID, Data: r.Data,
		Time: r.Time, ReceivedTime: r.ReceivedTime, MessageID: id, Origin: origin,
	})
	if err != nil { // cannot happen for a decoded reading; never ack what was not appended
		it.pubErr = fmt.Errorf("encode reading: %w", err)
		return it
	}
	msg := &nats.Msg{Subject: natsx.ReadingsSubject(r.SensorID), Data: body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, natsMsgID(r.SensorID, d.MessageId, origin))
	if !ord.wait(ctx, r.SensorID) {
		// Not appended and never acked: RabbitMQ redelivers it, in order, to the next session.
		// No done channel: nothing waits for an item that was never tracked, and the acker
		// closes the done channel of every item it gets (closing it here too panicked).
		it.pubErr = errors.New("session ended before the previous reading of the sensor was stored")
		return it
	}
	if d.Redelivered {
		// After the sensor's earlier readings of this session are resolved (ord.wait), so
		// that the look-back sees the log as it will stay.
		// Not the AMQP timestamp: it has whole seconds, and a door can close, open and close
		// again within one.
		strong := d.MessageId != "" || r.HasTS
		dup, err := sess.appended(ctx, r.SensorID, id, strong)
		if err != nil {
			it.pubErr = fmt.Errorf("check a redelivered reading: %w", err)
			return it
		}
		if dup {
			it.dup = true
			return it
		}
	}
	it.done = make(chan struct{})
	ord.track(r.SensorID, it.done)
	it.msg = msg
	it.future, it.pubErr = b.js.PublishMsgAsync(msg)
	return it
}

// acker resolves items in delivery order and acks RabbitMQ after each effect is durable,
// several at a time with multiple=true. After fail it only drains.
func (b *Bridge) acker(ctx context.Context, ch *amqp.Channel, sess *session, pending <-chan item, returns <-chan amqp.Return, fail func(error)) {
	var (
		lastTag   uint64
		lastStart time.Time
		unacked   int
		failed    bool
	)
	batch := max(1, b.cfg.Prefetch/4)
	flush := func() {
		if unacked == 0 || failed {
			return
		}
		// Recorded before the ack, so a later session never takes an acked reading for an
		// unacked one (see identity.go).
		if err := b.recordSession(ctx, sess, lastTag, lastStart); err != nil {
			failed = true
			fail(err)
			return
		}
		if err := ch.Ack(lastTag, true); err != nil {
			failed = true
			fail(fmt.Errorf("ack: %w", err))
			return
		}
		unacked = 0
		sess.acked(ctx, lastTag, sess.firstFresh.Load())
	}
	for {
		var it item
		var ok bool
		select {
		case it, ok = <-pending:
		default:
			flush() // nothing more to resolve right now
			it, ok = <-pending
		}
		if !ok {
			break
		}
		b.m.inFlight.Dec()
		if failed {
			if it.done != nil {
				close(it.done)
			}
			continue
		}
		err := b.resolve(ctx, it, returns, flush)
		if err != nil {
			flush() // what came before is done: ack it
			failed = true
			fail(err) // before done is closed: the reader must see the failure first
		}
		if it.done != nil {
			close(it.done)
		}
		if err != nil {
			continue
		}
		lastTag, lastStart = it.tag, it.start
		unacked++
		if unacked >= batch {
			flush()
		}
	}
	flush()
}

// recordSession writes the session's record, retrying while NATS is away (appends wait then
// too) until ctx ends.
func (b *Bridge) recordSession(ctx context.Context, sess *session, tag uint64, since time.Time) error {
	wait := 100 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
		err := sess.record(rctx, tag, since)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// resolve waits until the item's effect is durable. Before it blocks, it calls idle: acks
// go out as soon as the pipeline would wait anyway, so RabbitMQ's window never sits full of
// messages that are already done.
func (b *Bridge) resolve(ctx context.Context, it item, returns <-chan amqp.Return, idle func()) error {
	if it.reason != "" {
		if it.pubErr != nil {
			return fmt.Errorf("publish to %s: %w", b.cfg.InvalidQueue, it.pubErr)
		}
		select {
		case <-it.confirm.Done():
		default:
			idle()
			select {
			case <-it.confirm.Done():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if !it.confirm.Acked() {
			return fmt.Errorf("RabbitMQ did not confirm the publish to %s", b.cfg.InvalidQueue)
		}
		// RabbitMQ sends basic.return before the confirm, and amqp091-go hands it to this
		// buffered channel before it reads the confirm: a returned (unroutable) message,
		// e.g. the invalid queue deleted under us, is seen here, never acked as stored.
		select {
		case r, ok := <-returns:
			if !ok {
				return errors.New("RabbitMQ channel closed")
			}
			return fmt.Errorf("publish to %s returned: %d %s", b.cfg.InvalidQueue, r.ReplyCode, r.ReplyText)
		default:
		}
		b.m.invalid.WithLabelValues(it.reason).Inc()
		return nil
	}
	if it.dup {
		b.m.duplicates.Inc()
		b.m.accepted.Inc()
		return nil
	}
	if it.msg == nil {
		return it.pubErr
	}
	var ack *jetstream.PubAck
	err := it.pubErr
	if err == nil {
		select {
		case ack = <-it.future.Ok():
		case err = <-it.future.Err():
		default:
			idle()
			select {
			case ack = <-it.future.Ok():
			case err = <-it.future.Err():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if err != nil {
		ack, err = b.republish(ctx, it.msg, err)
		if err != nil {
			return err
		}
	}
	b.m.latency.Observe(time.Since(it.start).Seconds())
	if ack.Duplicate {
		b.m.duplicates.Inc()
	}
	crashpoint.Hit(CrashAfterPublish)
	b.m.accepted.Inc()
	return nil
}

// republish retries a failed append with the same Nats-Msg-Id until JetStream acks it or
// ctx ends. Later readings of the same sensor wait for it (see order), so a retry never
// lands after them; other sensors' readings go on.
func (b *Bridge) republish(ctx context.Context, msg *nats.Msg, first error) (*jetstream.PubAck, error) {
	wait := 100 * time.Millisecond
	err := first
	for attempt := 1; ; attempt++ {
		b.m.retries.Inc()
		// A NATS restart fails every append in flight at once: log one line per second.
		if now := time.Now(); now.Sub(b.lastRetryLog) >= time.Second || attempt%20 == 0 {
			b.lastRetryLog = now
			b.log.Warn("append to READINGS failed; retrying (further failures within 1s not logged)",
				"subject", msg.Subject, "attempt", attempt, "err", err)
		}
		pctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
		var ack *jetstream.PubAck
		ack, err = b.js.PublishMsg(pctx, msg)
		cancel()
		if err == nil {
			return ack, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("append to READINGS: %w (gave up: %w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// brokerHeaders are added by RabbitMQ itself on redelivery or dead-lettering; they must not
// make a redelivered message look new.
func brokerHeader(k string) bool {
	return k == "x-delivery-count" || k == "x-death" || strings.HasPrefix(k, "x-first-death-") ||
		strings.HasPrefix(k, "x-last-death-")
}

// MessageID is the Nats-Msg-Id of a delivery: its message_id when it has one, otherwise a
// digest of the body and of the properties a sender sets (timestamp, headers, correlation
// id, type, app id), so a redelivery gets the same id and two sends of the same body at
// different timestamps get different ones.
func MessageID(d amqp.Delivery) string {
	if d.MessageId != "" {
		return d.MessageId
	}
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(string(d.Body))
	if !d.Timestamp.IsZero() {
		field(d.Timestamp.UTC().Format(time.RFC3339Nano))
	} else {
		field("")
	}
	field(d.CorrelationId)
	field(d.Type)
	field(d.AppId)
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		if !brokerHeader(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		field(k)
		writeValue(h, d.Headers[k])
	}
	return "sha256:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:18])
}

func writeValue(h hash.Hash, v any) {
	// %T and %v are deterministic for every AMQP table type (maps print sorted).
	fmt.Fprintf(h, "%d:%T=%v;", len(fmt.Sprint(v)), v, v)
}
