package notifier

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The intake hands its new deliveries to the dispatcher, which leases and attempts them
// without a claim's search. First each sensor's first revision alone, each once the one
// before it is finished: nothing else is due then, and the poll is an hour away, so the
// hand-off takes them (a claim woken by the previous finish may rarely find one first,
// which it may). Then every later revision at once: a sensor's later revisions wait for its
// earlier ones (the claims the finisher wakes take them), and the receiver gets every
// revision once and in order.
func TestNewDeliveriesAreHandedToTheDispatcher(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	seen := map[string][]int64{}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b gotBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		seen[b.Sensor.ID] = append(seen[b.Sensor.ID], b.Revision)
		mu.Unlock()
	}))
	t.Cleanup(rc.Close)
	const sensors, revisions = 8, 4
	e.client("c1", rc.URL)
	e.exec(`INSERT INTO sensors (id, address) SELECT 's' || i, 'a' FROM generate_series(1, $1::int) i`, sensors)
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT 'c1', id FROM sensors`)
	e.cfg.PollInterval = time.Hour
	n := e.start()
	for s := 1; s <= sensors; s++ {
		e.publish(testEvent(fmt.Sprintf("s%d", s), 1, 1))
		testenv.Eventually(t, 10*time.Second, "the first revision finished", func() bool {
			return e.count(`SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`) == s
		})
	}
	if got := testutil.ToFloat64(n.m.handedOff); got < sensors*3/4 {
		t.Fatalf("%v of %d first revisions leased through the hand-off, want nearly all", got, sensors)
	}
	for r := int64(2); r <= revisions; r++ {
		var evs []event.Event
		for s := 1; s <= sensors; s++ {
			evs = append(evs, testEvent(fmt.Sprintf("s%d", s), r, uint8(r%2)))
		}
		e.publish(evs...)
	}
	testenv.Eventually(t, 20*time.Second, "every revision delivered", func() bool {
		return e.count(`SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`) == sensors*revisions
	})
	mu.Lock()
	defer mu.Unlock()
	for s, revs := range seen {
		if len(revs) != revisions {
			t.Fatalf("%s got revisions %v, want 1..%d once each", s, revs, revisions)
		}
		for i, r := range revs {
			if r != int64(i+1) {
				t.Fatalf("%s got revisions %v, want 1..%d in order", s, revs, revisions)
			}
		}
	}
}
