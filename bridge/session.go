package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

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

// session consumes the queue over one pair of RabbitMQ connections until ctx ends or a
// connection fails: the reader hands each delivery to handle, the acker acks what is durable.
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
	chans, err := b.openChannels(conn, pubConn)
	if err != nil {
		return err
	}
	deliveries, err := b.consume(chans.ch)
	if err != nil {
		return err
	}
	b.m.standby.Set(0) // this bridge is the queue's consumer now
	stopFresh, err := b.startRegistry(ctx)
	if err != nil {
		return err
	}
	defer stopFresh()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	pubClosed := pubConn.NotifyClose(make(chan *amqp.Error, 1))
	b.m.connects.Inc()
	b.log.Info("connected to RabbitMQ", "queue", b.cfg.Queue, "prefetch", b.cfg.Prefetch,
		"connection_name", b.cfg.ConnectionName)

	dctx, stopDrain := b.drainContext(ctx)
	defer stopDrain()

	sess, err := startSession(ctx, b.js, time.Now())
	if err != nil {
		return err
	}
	appendMsg, err := b.appender(ctx, dctx)
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
		b.acker(dctx, chans.ch, sess, pending, chans.returns, fail)
	}()

	readErr := b.read(ctx, closed, pubClosed, deliveries, pending, func(d amqp.Delivery) item {
		return b.handle(ctx, chans.pub, d, ord, sess, appendMsg)
	})
	close(pending)
	<-ackerDone
	if failErr != nil {
		return failErr
	}
	return readErr
}

// channels are a session's AMQP channels: ch consumes and acks, pub publishes to the
// invalid queue with confirms, and returns carries what RabbitMQ could not route.
type channels struct {
	ch, pub *amqp.Channel
	returns <-chan amqp.Return
}

// openChannels opens the session's channels on conn and pubConn and declares both queues.
func (b *Bridge) openChannels(conn, pubConn *amqp.Connection) (channels, error) {
	ch, err := conn.Channel()
	if err != nil {
		return channels{}, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return channels{}, fmt.Errorf("set prefetch: %w", err)
	}
	if err := declareQueue(conn, b.cfg.Queue, nil); err != nil {
		return channels{}, err
	}
	invalidArgs := amqp.Table{"x-max-length": int64(b.cfg.InvalidMaxLength), "x-overflow": "drop-head"}
	if err := declareQueue(conn, b.cfg.InvalidQueue, invalidArgs); err != nil {
		return channels{}, err
	}
	pub, err := pubConn.Channel()
	if err != nil {
		return channels{}, fmt.Errorf("open publishing channel: %w", err)
	}
	if err := pub.Confirm(false); err != nil {
		return channels{}, fmt.Errorf("publisher confirms: %w", err)
	}
	// amqp091-go blocks its reader on a full return channel; at most MaxInFlight (+ the one
	// the reader holds) invalid publishes are outstanding before the session fails on the
	// first return, so this never fills.
	returns := pub.NotifyReturn(make(chan amqp.Return, b.cfg.MaxInFlight+2))
	return channels{ch: ch, pub: pub, returns: returns}, nil
}

// consume makes this bridge the one consumer of the queue (exclusive): with two consumers,
// RabbitMQ hands a sensor's next readings to one bridge while the other still holds its
// earlier ones (stalled on a NATS failover), and they reach READINGS out of order
// (invariant 4). A second bridge process is a standby: its Consume is refused (errStandby)
// until the active one is gone.
func (b *Bridge) consume(ch *amqp.Channel) (<-chan amqp.Delivery, error) {
	deliveries, err := ch.Consume(b.cfg.Queue, "", false, true, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
		return nil, fmt.Errorf("%w: %s", errStandby, ae.Reason)
	}
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", b.cfg.Queue, err)
	}
	return deliveries, nil
}

// startRegistry loads the registry before the first delivery is handled (a bridge taking
// over starts from what the registry and the state projection hold now) and keeps it fresh
// until stop is called.
func (b *Bridge) startRegistry(ctx context.Context) (stop func(), err error) {
	if err := b.sensors.load(ctx); err != nil {
		return nil, err
	}
	fctx, stopFresh := context.WithCancel(ctx)
	freshDone := make(chan struct{})
	go func() {
		defer close(freshDone)
		b.sensors.keepFresh(fctx, b.cfg.RegistryRefresh)
	}()
	return func() {
		stopFresh()
		<-freshDone
	}, nil
}

// drainContext outlives ctx by DrainTimeout, so a stopping bridge still acks what
// JetStream has acknowledged instead of leaving it all to redelivery.
func (b *Bridge) drainContext(ctx context.Context) (dctx context.Context, stop func()) {
	dctx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	stopDrain := context.AfterFunc(ctx, func() { time.AfterFunc(b.cfg.DrainTimeout, cancelDrain) })
	return dctx, func() {
		stopDrain()
		cancelDrain()
	}
}

// read hands each delivery to handle and queues its item for the acker until ctx ends or
// a connection or the channel closes, which it returns as the error.
func (b *Bridge) read(ctx context.Context, closed, pubClosed <-chan *amqp.Error, deliveries <-chan amqp.Delivery, pending chan<- item, handle func(amqp.Delivery) item) error {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			return closedErr("RabbitMQ connection closed", e)
		case e := <-pubClosed:
			return closedErr("RabbitMQ publishing connection closed", e)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("RabbitMQ channel closed")
			}
			it := handle(d)
			b.m.inFlight.Inc()
			pending <- it // bounded: blocks while MaxInFlight messages await their ack
		}
	}
	return nil
}

// closedErr is what a closed connection ends the session with: what, with RabbitMQ's
// reason when it gave one.
func closedErr(what string, e *amqp.Error) error {
	if e == nil {
		return errors.New(what)
	}
	return fmt.Errorf("%s: %w", what, e)
}

// appender is how this session appends readings: in atomic batches when READINGS allows
// them, each alone otherwise. The batcher lives until dctx ends (the session's end, or its
// drain's).
func (b *Bridge) appender(ctx, dctx context.Context) (appender, error) {
	atomic, err := natsx.AllowsAtomic(ctx, b.js, natsx.ReadingsStream)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", natsx.ReadingsStream, err)
	}
	if !atomic {
		return func(msg *nats.Msg) (appendFuture, error) { return b.js.PublishMsgAsync(msg) }, nil
	}
	bt := newBatcher(dctx, b.js, &b.m, b.cfg.PublishTimeout)
	go bt.run()
	return bt.add, nil
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
