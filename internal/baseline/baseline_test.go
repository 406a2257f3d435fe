package baseline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/synadia-io/orbit.go/jetstreamext"

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

// PublishConfirmed publishes n readings keeping at most a window of them unconfirmed: a
// sliding window, so RabbitMQ always has work (waiting for a whole window to be confirmed
// before publishing more leaves it idle at every window's end).
func PublishConfirmed(b testing.TB, ch *amqp.Channel, queue string, n int) {
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	const window = 2000
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	ctx := context.Background()
	wait := func(p *amqp.DeferredConfirmation) {
		if ok, err := p.WaitContext(ctx); !ok || err != nil {
			b.Fatalf("publish not confirmed: %v", err)
		}
	}
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json",
			MessageId: fmt.Sprintf("m%d", i), Body: body(i),
		})
		if err != nil {
			b.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) == window {
			wait(pending[0])
			pending = pending[1:]
		}
	}
	for _, p := range pending {
		wait(p)
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

// BenchmarkBareJetStreamSyncAlways: 30,000 appends with Nats-Msg-Id into a file-backed
// stream on an embedded server that syncs every write (LOCKS_NATS_SYNC=always, the
// default): each alone (the nats.go async publisher, 4,096 in flight), and in atomic batches
// of 256 committed one after another (jetstreamext.PublishMsgBatch, as the bridge does,
// bridge/batch.go). The server syncs once per append, or once per batch.
func BenchmarkBareJetStreamSyncAlways(b *testing.B) {
	const n = 30_000
	for _, mode := range []string{"single", "atomic256"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
					StoreDir: b.TempDir(), NoSigs: true, NoLog: true, SyncAlways: true})
				if err != nil {
					b.Fatal(err)
				}
				go ns.Start()
				if !ns.ReadyForConnections(10 * time.Second) {
					b.Fatal("embedded NATS not ready within 10s")
				}
				b.Cleanup(ns.Shutdown)
				nc, err := nats.Connect(ns.ClientURL())
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(nc.Close)
				js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
				if err != nil {
					b.Fatal(err)
				}
				ctx := b.Context()
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BARE", Subjects: []string{"bare.>"},
					Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, AllowAtomicPublish: true}); err != nil {
					b.Fatal(err)
				}
				msg := func(i int) *nats.Msg {
					m := &nats.Msg{Subject: fmt.Sprintf("bare.s%d", i%100_000), Data: body(i), Header: nats.Header{}}
					m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("m%d", i))
					return m
				}
				b.ResetTimer()
				start := time.Now()
				if mode == "single" {
					for i := range n {
						if _, err := js.PublishMsgAsync(msg(i), jetstream.WithStallWait(time.Minute)); err != nil {
							b.Fatal(err)
						}
					}
					select {
					case <-js.PublishAsyncComplete():
					case <-time.After(5 * time.Minute):
						b.Fatal("async publishes not acknowledged within 5 minutes")
					}
				} else {
					batch := make([]*nats.Msg, 0, 256)
					for i := range n {
						batch = append(batch, msg(i))
						if len(batch) == cap(batch) || i == n-1 {
							if _, err := jetstreamext.PublishMsgBatch(ctx, js, batch); err != nil {
								b.Fatal(err)
							}
							batch = batch[:0]
						}
					}
				}
				el := time.Since(start)
				b.StopTimer()
				if s, err := js.Stream(ctx, "BARE"); err != nil || s.CachedInfo().State.Msgs != n {
					b.Fatalf("stream holds the wrong count after %d appends (err %v)", n, err)
				}
				b.ReportMetric(float64(n)/el.Seconds(), "msgs/s")
			}
		})
	}
}

// BenchmarkBareRabbitPassThrough: the bare publisher above and, at the same time, a bare
// amqp091-go consumer that acks each message (prefetch 1000) on the same queue: the most
// readings RabbitMQ can take in and hand out again on this machine with nothing else
// running. The end-to-end ingest can never beat this: RabbitMQ itself must both accept and
// deliver every reading, and the two share the machine's cores.
func BenchmarkBareRabbitPassThrough(b *testing.B) {
	for range b.N {
		rabbit := testenv.RabbitMQ(b)
		pub, err := rabbit.Conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pub.QueueDeclare(rabbit.Queue, true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		consumed := testenv.BareConsumer(b, rabbit.Conn, rabbit.Queue, messages)
		b.ResetTimer()
		machine := testenv.StartCPU(testenv.Servers())
		start := time.Now()
		PublishConfirmed(b, pub, rabbit.Queue, messages)
		published := time.Since(start)
		select {
		case err := <-consumed:
			if err != nil {
				b.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			b.Fatal("the consumer did not get every message within 2 minutes")
		}
		el := time.Since(start)
		use := machine.Stop()
		b.StopTimer()
		b.ReportMetric(float64(messages)/el.Seconds(), "msgs/s")
		b.ReportMetric(float64(messages)/published.Seconds(), "published/s")
		// What one message costs the machine: RabbitMQ, and this process publishing and consuming.
		testenv.ReportCPUPer(b, use, float64(messages), "reading")
	}
}
