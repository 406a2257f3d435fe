package e2e_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Invariant 9 end to end: forged and malformed messages published straight to READINGS and
// EVENTS (as anyone with access to NATS can) are set aside by every consumer, listed by
// GET /v1/set-aside with their reason and counted in locks_set_aside_total; they stop
// nothing: the other sensor's readings, events and webhooks go on, and a forged event with
// revision 2^62 (or a sane revision ahead of the state) supersedes no later real event.
func TestForgedLogMessagesAreSetAside(t *testing.T) {
	t.Parallel()
	const partitions = 4 // what start configures
	natsAddr := testenv.FreeAddr(t)
	dataDir := t.TempDir()
	s := start(t, "LOCKS_NATS_LISTEN="+natsAddr, "LOCKS_DATA_DIR="+dataDir, "LOCKS_RETRY_SCHEDULE=200ms,400ms")
	rcv := newReceiver(t)
	var client struct {
		ID string `json:"id"`
	}
	if code := s.call("POST", "/v1/clients", map[string]string{"name": "poison", "webhook_url": rcv.URL + "/hook"}, &client); code != 200 {
		t.Fatalf("create client: %d", code)
	}
	for _, id := range []string{"doorA", "doorB"} {
		if code := s.call("POST", "/v1/sensors", map[string]string{"id": id, "address": id}, nil); code != 200 {
			t.Fatalf("register %s: %d", id, code)
		}
		if code := s.call("PUT", "/v1/sensors/"+id+"/clients/"+client.ID, nil, nil); code != 200 {
			t.Fatalf("subscribe to %s: %d", id, code)
		}
	}
	s.publish(reading("doorA", 1), reading("doorB", 1))
	rcv.wait(t, 2, 30*time.Second)

	// With the credential of the embedded server: anyone holding it can write the log.
	auth, err := natsx.EmbeddedAuth(dataDir).Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+natsAddr, auth...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	logMsg := func(id string, v int) string {
		b, _ := json.Marshal(map[string]any{"v": v, "kind": "reading", "sensor_id": id, "data": 0, "time": now, "received_time": now})
		return string(b)
	}
	pa := partition.Of("doorA", partitions)
	forged := func(rev int64) string {
		one := uint8(1)
		b, _ := json.Marshal(event.Event{V: event.Version, ID: event.ID("doorA", rev), Type: event.TypeStateChanged,
			OccurredAt: time.Now().UTC(), SensorID: "doorA", Data: 0, PreviousData: &one, Revision: rev, Partition: pa})
		return string(b)
	}
	for _, m := range []struct{ subject, body string }{
		{natsx.ReadingsSubject("doorA"), logMsg("a b", 1)},
		{natsx.ReadingsSubject("doorA"), logMsg("a\x00b", 1)},
		{natsx.ReadingsSubject("doorA"), logMsg(strings.Repeat("x", 5000), 1)},
		{natsx.ReadingsSubject("doorA"), "\x00\xff\xfe garbage {"},
		{natsx.ReadingsSubject("doorA"), logMsg("doorA", 9)},
		{natsx.ReadingsSubject("doorB"), logMsg("doorA", 1)}, // another sensor's subject
		{natsx.EventsSubject(pa, "doorA"), forged(1 << 62)},
		{natsx.EventsSubject(pa, "doorA"), forged(5)}, // sane, but ahead of the state (revision 1)
		{natsx.EventsSubject(pa, "doorA"), "\x01garbage"},
	} {
		if _, err := js.Publish(t.Context(), m.subject, []byte(m.body)); err != nil {
			t.Fatalf("publish to %s: %v", m.subject, err)
		}
	}

	// The same partitions go on: the next real readings of both sensors are changes, and
	// doorA's revision 2 is delivered, not superseded by the forged 2^62 or 5.
	s.publish(reading("doorA", 0), reading("doorB", 0))
	got := rcv.wait(t, 4, 30*time.Second)
	time.Sleep(time.Second) // let anything forged that would be sent arrive
	rcv.mu.Lock()
	got = append([]webhook(nil), rcv.got...)
	rcv.mu.Unlock()
	revs := map[string][]int64{}
	for _, h := range got {
		revs[h.payload.Sensor.ID] = append(revs[h.payload.Sensor.ID], h.payload.Revision)
	}
	if fmt.Sprint(revs["doorA"]) != "[1 2]" || fmt.Sprint(revs["doorB"]) != "[1 2]" {
		t.Fatalf("webhook revisions %v, want [1 2] for each sensor", revs)
	}
	var state struct {
		Data     int    `json:"data"`
		Revision string `json:"revision"`
	}
	for _, id := range []string{"doorA", "doorB"} {
		if code := s.call("GET", "/v1/sensors/"+id+"/state", nil, &state); code != 200 || state.Data != 0 || state.Revision != "2" {
			t.Fatalf("%s state: %d %+v", id, code, state)
		}
	}

	// Every consumer that reads a bad message sets it aside once, with its reason.
	want := []string{}
	for _, c := range []string{"history", "state", "watchdog"} {
		want = append(want, c+"/READINGS/sensor_id", c+"/READINGS/sensor_id", c+"/READINGS/sensor_id",
			c+"/READINGS/decode", c+"/READINGS/version", c+"/READINGS/subject")
	}
	want = append(want, "history/EVENTS/revision", "history/EVENTS/decode",
		"notifier/EVENTS/revision", "notifier/EVENTS/revision_ahead", "notifier/EVENTS/decode")
	sort.Strings(want)
	var listed []string
	testenv.Eventually(t, 30*time.Second, "every bad message listed", func() bool {
		listed = s.listSetAside(t)
		return len(listed) >= len(want)
	})
	if fmt.Sprint(listed) != fmt.Sprint(want) {
		t.Fatalf("set aside:\n%v\nwant\n%v", listed, want)
	}
	if n := s.metric("locks_set_aside_total"); n != float64(len(want)) {
		t.Fatalf("locks_set_aside_total = %v, want %d", n, len(want))
	}
}

// listSetAside pages through GET /v1/set-aside (3 a page) and returns consumer/stream/reason
// of each record, sorted.
func (s *system) listSetAside(t *testing.T) []string {
	t.Helper()
	var out []string
	token := ""
	for range 100 {
		var page struct {
			SetAside []struct {
				Consumer, Stream, Reason, Detail string
				Payload                          []byte
				Size                             string
			} `json:"set_aside"`
			NextPageToken string `json:"next_page_token"`
		}
		if code := s.call("GET", "/v1/set-aside?page_size=3&page_token="+token, nil, &page); code != 200 {
			t.Fatalf("GET /v1/set-aside: %d", code)
		}
		for _, r := range page.SetAside {
			if r.Detail == "" || len(r.Payload) == 0 || len(r.Payload) > 1024 {
				t.Fatalf("record without detail, or payload not a bounded prefix: %+v", r)
			}
			out = append(out, r.Consumer+"/"+r.Stream+"/"+r.Reason)
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	sort.Strings(out)
	return out
}
