package bridge

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestMessageID(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	orig := amqp.Delivery{Body: []byte(`{"sensor_id":"a","data":1}`), Timestamp: ts, Headers: amqp.Table{"fw": "1.2", "n": int32(7)}}
	with := func(f func(d *amqp.Delivery)) amqp.Delivery {
		d := orig
		d.Headers = amqp.Table{}
		for k, v := range orig.Headers {
			d.Headers[k] = v
		}
		f(&d)
		return d
	}
	tests := []struct {
		name string
		d    amqp.Delivery
		same bool
	}{
		{"redelivered", with(func(d *amqp.Delivery) { d.Redelivered, d.DeliveryTag = true, 99 }), true},
		{"quorum queue delivery count", with(func(d *amqp.Delivery) { d.Headers["x-delivery-count"] = int64(2) }), true},
		{"dead-lettered", with(func(d *amqp.Delivery) { d.Headers["x-death"] = []any{amqp.Table{"count": int64(1)}} }), true},
		{"other body", with(func(d *amqp.Delivery) { d.Body = []byte(`{"sensor_id":"a","data":0}`) }), false},
		{"other timestamp", with(func(d *amqp.Delivery) { d.Timestamp = ts.Add(time.Second) }), false},
		{"no timestamp", with(func(d *amqp.Delivery) { d.Timestamp = time.Time{} }), false},
		{"other header value", with(func(d *amqp.Delivery) { d.Headers["n"] = int32(8) }), false},
		{"header value type", with(func(d *amqp.Delivery) { d.Headers["n"] = int64(7) }), false},
		{"extra header", with(func(d *amqp.Delivery) { d.Headers["seq"] = "5" }), false},
		{"other correlation id", with(func(d *amqp.Delivery) { d.CorrelationId = "c" }), false},
	}
	base := MessageID(orig)
	if base != MessageID(orig) {
		t.Fatal("MessageID is not deterministic")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := MessageID(tt.d); (got == base) != tt.same {
				t.Fatalf("MessageID = %s, base %s, want same=%v", got, base, tt.same)
			}
		})
	}
	if got := MessageID(with(func(d *amqp.Delivery) { d.MessageId = "abc" })); got != "abc" {
		t.Fatalf("MessageID with message_id = %q", got)
	}
}
