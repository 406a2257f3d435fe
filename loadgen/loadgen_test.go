package loadgen_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// The books match what is in the queue: every message counted once, the invalid ones
// invalid, and the last data of each sensor is what it last published.
func TestBooksMatchTheQueue(t *testing.T) {
	t.Parallel()
	r := testenv.RabbitMQ(t)
	books, err := loadgen.Run(t.Context(), loadgen.Config{
		AMQPURL: r.URL, Queue: r.Queue, Sensors: 50, Rate: 5000, ChangeRatio: 0.3,
		SilentRatio: 0.1, InvalidRatio: 0.1, Count: 2000, Seed: 7,
	}, nil, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if books.Published != 2000 || len(books.Silent) != 5 {
		t.Fatalf("published %d, silent %d; want 2000 and 5", books.Published, len(books.Silent))
	}
	ch, err := r.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]uint8{}
	var invalid, n int64
	silentSeen := map[string]int{}
	deadline := time.Now().Add(30 * time.Second)
	for n < books.Published && time.Now().Before(deadline) {
		m, ok, err := ch.Get(r.Queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		n++
		var v struct {
			SensorID string `json:"sensor_id"`
			Data     uint8  `json:"data"`
			TS       string `json:"ts"`
		}
		if err := json.Unmarshal(m.Body, &v); err != nil {
			t.Fatal(err)
		}
		if v.TS == "" {
			invalid++
			continue
		}
		last[v.SensorID] = v.Data
		silentSeen[v.SensorID]++
	}
	if n != books.Published || invalid != books.Invalid {
		t.Fatalf("queue held %d messages (%d invalid); books say %d (%d invalid)", n, invalid, books.Published, books.Invalid)
	}
	for id, d := range books.Last {
		if last[id] != d {
			t.Fatalf("sensor %s: last data %d in the queue, %d in the books", id, last[id], d)
		}
	}
	for _, id := range books.Silent {
		if silentSeen[id] != 1 {
			t.Fatalf("silent sensor %s sent %d readings, want 1", id, silentSeen[id])
		}
	}
}

// A run continuing an earlier one's books (Config.Last) counts as changes only the readings
// that differ from each sensor's last data: with no change ratio, none.
func TestBooksContinueAnEarlierRun(t *testing.T) {
	t.Parallel()
	r := testenv.RabbitMQ(t)
	for _, tc := range []struct {
		name        string
		changeRatio float64
		continued   bool
		want        func(changes int64) bool
	}{
		{"continued, no changes", 0, true, func(n int64) bool { return n == 0 }},
		{"fresh books, every sensor's first reading", 0, false, func(n int64) bool { return n == 20 }},
		{"continued, every reading a change", 1, true, func(n int64) bool { return n == 100 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := loadgen.Run(t.Context(), loadgen.Config{AMQPURL: r.URL, Queue: r.Queue, Sensors: 20, Rate: 5000, Count: 20, Seed: 1}, nil, testenv.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			c := loadgen.Config{AMQPURL: r.URL, Queue: r.Queue, Sensors: 20, Rate: 5000, Count: 100, ChangeRatio: tc.changeRatio, Seed: 2}
			if tc.continued {
				c.Last = first.Last
			}
			second, err := loadgen.Run(t.Context(), c, nil, testenv.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(second.Changes) {
				t.Fatalf("%d changes", second.Changes)
			}
		})
	}
}
