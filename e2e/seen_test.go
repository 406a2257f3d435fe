package e2e_test

import (
	"sync"
	"testing"
	"time"
)

// A sensor that only repeats its value costs no state row per reading
// (LOCKS_STATE_SEEN_INTERVAL), yet its last_seen_time over REST stays within the bound the
// API states, it is never declared lost, and after the process is killed its last_seen_time
// comes back exactly (the deferred liveness is replayed from the log). A sensor that falls
// silent beside it is declared lost, so the run could have declared the other one too.
func TestRepeatingSensorStaysSeen(t *testing.T) {
	t.Parallel()
	const (
		lostAfter = 3 * time.Second
		bound     = 2 * time.Second
		// slack is the way from RabbitMQ through the bridge to the state projector.
		slack = 1500 * time.Millisecond
	)
	s := start(t, "LOCKS_LOST_AFTER="+lostAfter.String(), "LOCKS_STATE_SEEN_INTERVAL="+bound.String())
	quiet(t)
	rcv := newReceiver(t)
	var client struct {
		ID string `json:"id"`
	}
	if code := s.call("POST", "/v1/clients", map[string]string{"name": "seen", "webhook_url": rcv.URL + "/hook"}, &client); code != 200 {
		t.Fatalf("create client: %d", code)
	}
	for _, id := range []string{"repeat", "quiet"} {
		if code := s.call("POST", "/v1/sensors", map[string]string{"id": id, "address": "Seen st. " + id}, nil); code != 200 {
			t.Fatalf("register %s: %d", id, code)
		}
		if code := s.call("PUT", "/v1/sensors/"+id+"/clients/"+client.ID, nil, nil); code != 200 {
			t.Fatalf("subscribe to %s: %d", id, code)
		}
	}
	s.publish(reading("repeat", 1), reading("quiet", 0))

	var mu sync.Mutex
	var lastSent time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(300 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				mu.Lock()
				// Before the publish: the bridge receives it after this.
				lastSent = time.Now()
				s.publish(reading("repeat", 1))
				mu.Unlock()
			}
		}
	}()
	stopSending := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopSending()

	type state struct {
		Connection    string    `json:"connection"`
		LastSeenTime  time.Time `json:"last_seen_time"`
		LastSeenBound string    `json:"last_seen_bound"`
		Revision      string    `json:"revision"`
	}
	rcv.wait(t, 2, 20*time.Second) // both first states are in
	// Four lost_afters of repeats, the state read every 200 ms.
	var worst time.Duration
	started := time.Now()
	for time.Since(started) < 4*lostAfter {
		var st state
		if code := s.call("GET", "/v1/sensors/repeat/state", nil, &st); code != 200 {
			t.Fatalf("state of repeat: %d", code)
		}
		if st.LastSeenBound != "2s" {
			t.Fatalf("last_seen_bound %q, want 2s", st.LastSeenBound)
		}
		if st.Connection != "CONNECTION_ONLINE" {
			t.Fatalf("repeat is %s after %s of readings every 300 ms", st.Connection, time.Since(started))
		}
		if time.Since(started) > bound+slack {
			age := time.Since(st.LastSeenTime)
			worst = max(worst, age)
			if age > bound+slack+300*time.Millisecond {
				t.Errorf("last_seen_time %s old, want at most the bound %s (+%s on the way, +300 ms between readings)", age, bound, slack)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("last_seen_time of a sensor repeating every 300 ms was at most %s old (bound %s)", worst, bound)

	// The lists state the bound too.
	var list struct {
		Sensors []struct {
			ID    string `json:"id"`
			State state  `json:"state"`
		} `json:"sensors"`
	}
	if code := s.call("GET", "/v1/sensors", nil, &list); code != 200 || len(list.Sensors) != 2 {
		t.Fatalf("list sensors: %d %+v", code, list)
	}
	for _, x := range list.Sensors {
		if x.State.LastSeenBound != "2s" {
			t.Errorf("sensor %s in the list: last_seen_bound %q, want 2s", x.ID, x.State.LastSeenBound)
		}
	}

	// Webhooks: each sensor's first state, quiet's loss, and nothing for repeat's repeats.
	got := rcv.wait(t, 3, 20*time.Second)
	for _, h := range got {
		if h.payload.Sensor.ID == "repeat" && h.payload.Type != "sensor.state_changed" {
			t.Errorf("repeat, which never fell silent, got %s", h.payload.Type)
		}
	}
	types := map[string][]string{}
	for _, h := range got {
		types[h.payload.Sensor.ID] = append(types[h.payload.Sensor.ID], h.payload.Type)
	}
	if len(types["repeat"]) != 1 || len(types["quiet"]) != 2 || types["quiet"][1] != "sensor.connection_lost" {
		t.Fatalf("webhooks %v: want repeat's first state only, quiet's first state and its loss", types)
	}

	// Killed while its last readings wait in memory: after the restart, last_seen_time is
	// the receive time of its very last reading, not one up to the bound older.
	stopSending()
	time.Sleep(500 * time.Millisecond) // applied, not yet due
	s.kill()
	mu.Lock()
	last := lastSent
	mu.Unlock()
	s.launch()
	var st state
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code := s.call("GET", "/v1/sensors/repeat/state", nil, &st); code != 200 {
			t.Fatalf("state of repeat after the restart: %d", code)
		}
		if !st.LastSeenTime.Before(last) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart last_seen_time is %s, before the last reading was published at %s",
				st.LastSeenTime.Format(time.StampMicro), last.Format(time.StampMicro))
		}
	}
	if st.LastSeenTime.After(last.Add(slack)) {
		t.Errorf("after the restart last_seen_time %s, the last reading was published at %s", st.LastSeenTime, last)
	}
}
