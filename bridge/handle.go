package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// ErrorHeader names the reason of an invalid message in the invalid queue.
const ErrorHeader = "x-lock-sensors-error"

// SizeHeader carries the original size in bytes of a body that was too big: the invalid
// queue keeps only its first InvalidPrefix bytes.
const SizeHeader = "x-lock-sensors-original-size"

// InvalidPrefix is how much of a too-big body the invalid queue keeps: enough to see what
// sent it, never a flood's worth.
const InvalidPrefix = MaxBodySize

// item is one received message on its way to its AMQP ack, in delivery order.
type item struct {
	tag   uint64
	start time.Time
	// One of: a reading's append (msg, and future or pubErr), or an invalid message's confirm.
	msg    *nats.Msg
	future appendFuture
	pubErr error
	// lost is closed when the NATS connection the append went out on is lost.
	lost    <-chan struct{}
	confirm *amqp.DeferredConfirmation
	reason  string
	// dup: a redelivered reading an earlier session had appended; it is acked, not appended.
	dup bool
	// done is closed once the acker has resolved a reading's append (or given up on it).
	done chan struct{}
	// span is the reading's trace span while tracing is on (trace.go), ended when resolved.
	span trace.Span
}

// appender starts one append to READINGS: alone (PublishMsgAsync) or in a batch (batch.go).
type appender func(*nats.Msg) (appendFuture, error)

// handle starts the work on one delivery: an async append, or a confirmed publish to the
// invalid queue. It never blocks on the result.
func (b *Bridge) handle(ctx context.Context, pub *amqp.Channel, d amqp.Delivery, ord *order, sess *session, appendMsg appender) item {
	now := time.Now().UTC()
	it := item{tag: d.DeliveryTag, start: now}
	r, err := Decode(d.Body, now)
	if err == nil {
		err = CheckMessageID(d.MessageId)
	}
	if err != nil {
		var ie *InvalidError
		reason, msg := ReasonNotJSON, err.Error()
		if errors.As(err, &ie) {
			reason = ie.Reason
		}
		return b.toInvalid(ctx, pub, d, it, reason, msg)
	}
	b.skew.observe(r)
	if !r.Time.Equal(r.ReceivedTime) { // the sensor sent a ts
		b.m.sensorStage.Between(r.Time, r.ReceivedTime)
	}
	t := b.sensors.decide(ctx, r.SensorID, now)
	if t == trackRefuse {
		return b.toInvalid(ctx, pub, d, it, ReasonUnregistered,
			fmt.Sprintf("sensor_id %s is not registered, and LOCKS_ACCEPT_UNREGISTERED is false", r.SensorID))
	}
	id := MessageID(d)
	origin := sess.id + "/" + strconv.FormatUint(d.DeliveryTag, 10)
	body, err := event.MarshalLog(event.Log{
		V: event.Version, Kind: event.KindReading, SensorID: r.SensorID, Data: r.Data,
		Time: r.Time, ReceivedTime: r.ReceivedTime, MessageID: id, Origin: origin, Untracked: t == trackNone,
	})
	if err != nil { // cannot happen for a decoded reading; never ack what was not appended
		it.pubErr = fmt.Errorf("encode reading: %w", err)
		return it
	}
	msg := &nats.Msg{Subject: natsx.ReadingsSubject(r.SensorID), Data: body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, natsMsgID(r.SensorID, d.MessageId, origin))
	if b.tracer != nil {
		ctx, it.span = b.startAppend(ctx, d, r.SensorID, id, msg.Subject)
		tracing.InjectNATS(ctx, msg.Header)
	}
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
	it.lost = natsx.Lost(b.js.Conn())
	it.future, it.pubErr = appendMsg(msg)
	return it
}

// toInvalid publishes d to the invalid queue with its reason, under publisher confirms: the
// acker acks d once the invalid queue has it.
func (b *Bridge) toInvalid(ctx context.Context, pub *amqp.Channel, d amqp.Delivery, it item, reason, msg string) item {
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
