package bridge

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	amqp "github.com/rabbitmq/amqp091-go"
)

// benchMessages is how many messages each benchmark run consumes; they are published
// beforehand, outside the timer, so both benchmarks measure consuming alone.
const benchMessages = 200_000

func benchPublishings() []amqp.Publishing {
	msgs := make([]amqp.Publishing, benchMessages)
	for i := range msgs {
		msgs[i] = reading(i, 10_000)
	}
	return msgs
}

// BenchmarkBridge: the bridge draining benchMessages pre-published readings into READINGS
// (embedded NATS in this process), until every one is appended and acked. The test server
// syncs by interval, where the bridge appends each reading alone (batches are declared
// only where the server syncs every write, natsx.StreamsConfig.AtomicPublish): atomic
// batches committed one after another there would cost it a quarter of its rate.
func BenchmarkBridge(b *testing.B) {
	msgs := benchPublishings()
	var total time.Duration
	var lat float64
	for range b.N {
		b.StopTimer()
		e := newEnvAppending(b, "", false)
		e.publish(b, msgs)
		b.StartTimer()
		start := time.Now()
		stop := e.start(b, Config{})
		for metricValue(e.bridge.m.accepted) < benchMessages {
			time.Sleep(2 * time.Millisecond)
		}
		total += time.Since(start)
		b.StopTimer()
		var h dto.Metric
		_ = e.bridge.m.latency.Write(&h)
		lat += h.Histogram.GetSampleSum() / float64(h.Histogram.GetSampleCount())
		stop()
		if n := e.streamMsgs(b); n != benchMessages {
			b.Fatalf("READINGS holds %d, want %d", n, benchMessages)
		}
	}
	b.ReportMetric(float64(benchMessages*b.N)/total.Seconds(), "msgs/s")
	b.ReportMetric(lat/float64(b.N)*1000, "ms/append")
}

// BenchmarkBareConsumer: an amqp091-go consumer that only acks, with the bridge's queue
// setup (durable queue, prefetch 1000, manual acks) and message count. ack=each acks every
// message by itself (the usual bare consumer); ack=multiple acks 250 at a time with
// multiple=true, as the bridge does.
func BenchmarkBareConsumer(b *testing.B) {
	msgs := benchPublishings()
	for _, every := range []int{1, 250} {
		name := "ack=each"
		if every > 1 {
			name = "ack=multiple"
		}
		b.Run(name, func(b *testing.B) {
			var total time.Duration
			for range b.N {
				b.StopTimer()
				e := newEnv(b, "")
				e.publish(b, msgs)
				conn, err := amqp.Dial(e.amqp)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				ch, err := conn.Channel()
				if err != nil {
					b.Fatal(err)
				}
				if err := ch.Qos(1000, 0, false); err != nil {
					b.Fatal(err)
				}
				if _, err := ch.QueueDeclare(e.queue, true, false, false, false, nil); err != nil {
					b.Fatal(err)
				}
				ds, err := ch.Consume(e.queue, "", false, false, false, false, nil)
				if err != nil {
					b.Fatal(err)
				}
				for i := 1; i <= benchMessages; i++ {
					d := <-ds
					if i%every == 0 || i == benchMessages {
						if err := ch.Ack(d.DeliveryTag, every > 1); err != nil {
							b.Fatal(err)
						}
					}
				}
				total += time.Since(start)
				b.StopTimer()
				_ = conn.Close()
				if n := e.queueReady(b, e.queue); n != 0 {
					b.Fatalf("%d messages left", n)
				}
			}
			b.ReportMetric(float64(benchMessages*b.N)/total.Seconds(), "msgs/s")
		})
	}
}
