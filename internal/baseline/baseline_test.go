package baseline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

const messages = 200_000

func body(i int) []byte {
	return fmt.Appendf(nil, `{"sensor_id":"s%d","data":%d,"ts":"2026-11-22T10:00:00.123Z"}`, i%100_000, i%2)
}

// BenchmarkBareRabbitPublisher: an amqp091-go publisher with confirms, persistent messages,
// into a durable queue: the most sensors can push through RabbitMQ on this machine.
func BenchmarkBareRabbitPublisher(b *testing.B) {
	for range b.N {
		rabbit := testenv.RabbitMQ(b)
		ch, err := rabbit.Conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ch.QueueDeclare(rabbit.Queue, true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		PublishConfirmed(b, ch, rabbit.Queue, messages)
		el := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(messages)/el.Seconds(), "msgs/s")
	}
}

// PublishConfirmed publishes n readings with a window of unconfirmed messages.
func PublishConfirmed(b testing.TB, ch *amqp.Channel, queue string, n int) {
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	const window = 2000
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	ctx := context.Background()
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json",
			MessageId: fmt.Sprintf("m%d", i), Body: body(i),
		})
		if err != nil {
			b.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) == window || i == n-1 {
			for _, p := range pending {
				if ok, err := p.WaitContext(ctx); !ok || err != nil {
					b.Fatalf("publish not confirmed: %v", err)
				}
			}
			pending = pending[:0]
		}
	}
}

// BenchmarkBareJetStreamPublisher: the nats.go async publisher with Nats-Msg-Id into a
// file-backed stream on an embedded server: the most the log can take here.
func BenchmarkBareJetStreamPublisher(b *testing.B) {
	for range b.N {
		env := testenv.NATS(b)
		ctx := context.Background()
		if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{
			Name: "BARE", Subjects: []string{"bare.>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
		}); err != nil {
			b.Fatal(err)
		}
		js, err := jetstream.New(env.NC, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		for i := range messages {
			if _, err := js.PublishAsync(fmt.Sprintf("bare.s%d", i%100_000), body(i), jetstream.WithMsgID(fmt.Sprintf("m%d", i))); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(2 * time.Minute):
			b.Fatal("async publishes not acknowledged within 2 minutes")
		}
		el := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(messages)/el.Seconds(), "msgs/s")
	}
}
