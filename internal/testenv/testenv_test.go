package testenv_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Each server is real: a round trip through each.

func TestNATSRoundTrip(t *testing.T) {
	t.Parallel()
	e := testenv.NATS(t)
	sub, err := e.NC.SubscribeSync("ping")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.NC.Publish("ping", []byte("pong")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(m.Data) != "pong" {
		t.Fatalf("got %v, %v", m, err)
	}
	if !e.Server.JetStreamEnabled() {
		t.Fatal("JetStream is off")
	}
}

func TestPostgresIsMigratedAndPrivate(t *testing.T) {
	t.Parallel()
	_, a := testenv.Postgres(t)
	_, b := testenv.Postgres(t)
	ctx := t.Context()
	if _, err := a.Exec(ctx, "INSERT INTO sensors (id, address) VALUES ('s1', 'here')"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := a.QueryRow(ctx, "SELECT count(*) FROM sensors").Scan(&n); err != nil || n != 1 {
		t.Fatalf("a: %d sensors, %v", n, err)
	}
	if err := b.QueryRow(ctx, "SELECT count(*) FROM sensors").Scan(&n); err != nil || n != 0 {
		t.Fatalf("b sees %d sensors of a, %v", n, err)
	}
}

func TestRabbitMQRoundTrip(t *testing.T) {
	t.Parallel()
	e := testenv.RabbitMQ(t)
	ch, err := e.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(e.Queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := ch.PublishWithContext(ctx, "", e.Queue, false, false, amqp.Publishing{Body: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, ok, err := ch.Get(e.Queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if string(m.Body) != "hi" {
				t.Fatalf("got %q", m.Body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("message did not arrive")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClickHouseRoundTrip(t *testing.T) {
	t.Parallel()
	_, conn := testenv.ClickHouse(t)
	ctx := t.Context()
	b, err := conn.PrepareBatch(ctx, "INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for seq := range uint64(3) {
		// seq 2 twice: the table collapses duplicates by stream sequence.
		if err := b.Append("s1", seq%2+1, uint8(1), now, uint16(5), now, uint16(6), "m"); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM readings FINAL WHERE sensor_id = 's1'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d distinct readings, want 2", n)
	}
}
