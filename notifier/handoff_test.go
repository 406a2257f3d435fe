package notifier

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A delivery that may go at once is leased by the intake transaction that creates it and
// attempted without a claim; a newer revision of a key whose older row is in flight is not
// (claimed once the older one's outcome is in), and every revision arrives once, in order.
func TestIntakeLeasesWhatMayGoAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hold := make(chan struct{})
	rc := newReceiver(t, func(_ int, _ http.ResponseWriter, r *http.Request) int {
		if r.Header.Get("webhook-id") == event.ID("s0", 1) {
			<-hold
		}
		return http.StatusNoContent
	})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release) // before the receiver's Close, which waits for its handlers
	e.client("c1", rc.URL)
	const sensors = 5
	var evs []event.Event
	for i := range sensors {
		id := fmt.Sprintf("s%d", i)
		e.sensor(id, "here")
		e.subscribe("c1", id)
		evs = append(evs, testEvent(id, 1, 1))
	}
	e.cfg.PerEndpoint = 2 * sensors
	n := e.start()
	leased := func() int { return int(testutil.ToFloat64(n.m.intakeLeased)) }

	e.publish(evs...)
	testenv.Eventually(t, 10*time.Second, "every first revision at the receiver", func() bool { return rc.count() >= sensors })
	if got := leased(); got != sensors {
		t.Fatalf("%d deliveries leased at intake, want all %d (a receiver with room, no older rows)", got, sensors)
	}

	// s0's revision 1 is still in flight: revision 2 must wait for it.
	evs = append(evs, testEvent("s0", 2, 0))
	e.publish(evs[sensors:]...)
	testenv.Eventually(t, 10*time.Second, "revision 2's row", func() bool {
		return e.count(`SELECT count(*) FROM notifier_deliveries WHERE sensor_id = 's0' AND revision = 2`) == 1
	})
	if l := e.count(`SELECT count(*) FROM notifier_deliveries WHERE sensor_id = 's0' AND revision = 2 AND lease_until IS NOT NULL`); l != 0 {
		t.Fatal("revision 2 leased while revision 1 of its key was in flight")
	}
	if got := leased(); got != sensors {
		t.Fatalf("%d deliveries leased at intake after revision 2, want still %d", got, sensors)
	}
	release()
	testenv.Eventually(t, 10*time.Second, "revision 2 at the receiver", func() bool { return rc.count() >= sensors+1 })
	var order []string
	for _, h := range rc.got() {
		if id := h.header.Get("webhook-id"); id == event.ID("s0", 1) || id == event.ID("s0", 2) {
			order = append(order, id)
		}
	}
	if len(order) != 2 || order[0] != event.ID("s0", 1) {
		t.Fatalf("s0's webhooks %v, want revision 1 then 2, once each", order)
	}
	testenv.Eventually(t, 10*time.Second, "every row delivered", func() bool {
		return e.count(`SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`) == sensors+1
	})
	if a, got := e.count(`SELECT sum(attempts) FROM notifier_deliveries`), rc.count(); a != sensors+1 || got != sensors+1 {
		t.Fatalf("%d attempts recorded, %d webhooks received, want %d each", a, got, sensors+1)
	}
}

// finish says a claim may find something only when it does: a row left pending (a retry),
// or another pending row of a finished row's key (a newer revision it held back); a
// delivery with nothing behind it wakes no claim.
func TestFinishSaysWhenAClaimMayFindRows(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Postgres(t)
	inFlight := rowFacts{inFlight: true}
	row := func(sensor string, newer bool) claimed {
		f := inFlight
		f.newer = newer
		return claimed{id: sweepRow(t, pool, sensor, f), token: 7, clientID: "c1", sensorID: sensor, eventID: sensor + "-1"}
	}
	for _, tc := range []struct {
		name   string
		newer  bool
		state  string
		wantOK bool
	}{
		{"delivered, nothing behind it", false, StateDelivered, false},
		{"delivered, a newer revision waiting", true, StateDelivered, true},
		{"failed, a retry due later", false, StatePending, true},
		{"dead, nothing behind it", false, StateDead, false},
	} {
		c := row(fmt.Sprintf("f-%s", tc.name), tc.newer)
		fd, err := finish(t.Context(), pool, []result{{c: c, state: tc.state, delay: time.Minute, status: 200, at: time.Now()}}, 0, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(fd.recs) != 1 {
			t.Fatalf("%s: %d records, want 1", tc.name, len(fd.recs))
		}
		if fd.claimable != tc.wantOK {
			t.Errorf("%s: claimable %v, want %v", tc.name, fd.claimable, tc.wantOK)
		}
	}
}
