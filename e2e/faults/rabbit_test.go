package faults_test

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// Restart RabbitMQ mid-run: a private node (the machine's shared one serves other tests),
// SIGKILLed while the bridge consumes and started again on its data. The publisher pauses
// across the restart, since a message whose confirm was lost with the node may or may not be
// in the queue and would unbalance the books by itself; the books of the two halves add up.
func TestFaultRabbitMQRestarted(t *testing.T) {
	requireFaults(t)
	rn := testenv.PrivateRabbitMQ(t)
	srv := servers{pgURL: testenv.PostgresURL(t), chAddr: testenv.ClickHouseAddr(), amqpURL: rn.URL, queue: "sensor.readings"}
	r := startRun(t, srv, 30*time.Second)
	r.checkStalls = false // the publisher is idle across the restart: nothing to commit then
	r.warm()
	first := <-r.books
	if first.err != nil {
		t.Fatal(first.err)
	}
	at := time.Now()
	rn.Restart()
	t.Logf("RabbitMQ SIGKILLed and up again in %s", time.Since(at).Round(100*time.Millisecond))
	second, err := loadgen.Run(t.Context(), loadgen.Config{AMQPURL: srv.amqpURL, Queue: srv.queue, Sensors: sensors, Rate: rate,
		ChangeRatio: 0.2, Duration: 30 * time.Second, Prefix: "fa", Seed: 16, Last: first.b.Last}, nil, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	b := second
	b.Start = first.b.Start
	b.Published += first.b.Published
	b.Invalid += first.b.Invalid
	b.Changes += first.b.Changes
	r.books <- booksResult{b: b}
	r.finish()
}
