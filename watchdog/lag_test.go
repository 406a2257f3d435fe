package watchdog

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestRabbitLag asks a real RabbitMQ queue in each state the bridge can leave it in.
func TestRabbitLag(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		declare    bool
		consumer   bool // a consumer with prefetch 1 that never acks
		publish    int
		maxReady   int
		wantBehind bool
		wantErr    bool
	}{
		{name: "no queue yet", wantBehind: true, wantErr: true},
		{name: "bridge down, empty queue", declare: true, wantBehind: true},
		{name: "bridge up, empty queue", declare: true, consumer: true},
		{name: "bridge up, backlog within bound", declare: true, consumer: true, publish: 3, maxReady: 2},
		{name: "bridge up, backlog beyond bound", declare: true, consumer: true, publish: 5, maxReady: 2, wantBehind: true},
		{name: "bridge down with a backlog", declare: true, publish: 2, maxReady: 10, wantBehind: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := testenv.RabbitMQ(t)
			ch, err := r.Conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			if c.declare {
				if _, err := ch.QueueDeclare(r.Queue, true, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < c.publish; i++ {
				if err := ch.PublishWithContext(t.Context(), "", r.Queue, false, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
					t.Fatal(err)
				}
			}
			if c.consumer {
				cch, err := r.Conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				defer cch.Close()
				_ = cch.Qos(1, 0, false)
				if _, err := cch.Consume(r.Queue, "", false, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
				// Ask only once the broker counts the consumer and its one unacked message.
				want := max(c.publish-1, 0)
				for deadline := time.Now().Add(5 * time.Second); ; {
					q, err := ch.QueueDeclarePassive(r.Queue, true, false, false, false, nil)
					if err != nil {
						t.Fatal(err)
					}
					if q.Consumers == 1 && q.Messages == want {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("queue never showed 1 consumer and %d ready: %+v", want, q)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			lag := RabbitLag(r.URL, r.Queue, c.maxReady, 0)
			// The broker's counts settle within moments of a publish or consume.
			deadline := time.Now().Add(5 * time.Second)
			for {
				behind, err := lag(context.Background())
				if behind == c.wantBehind && (err != nil) == c.wantErr {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("behind %v, err %v; want behind %v, error %v", behind, err, c.wantBehind, c.wantErr)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}
