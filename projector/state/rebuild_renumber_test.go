package state

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// A rebuild from a READINGS whose oldest readings were dropped by its limits (a max age)
// keeps every sensor's revisions rising: the swapped-in state continues the live revisions,
// sensors with no reading kept stay, and the next change of each sensor is a new event with
// the next revision, not one whose id receivers have already seen.
func TestStateRebuildAfterTruncationKeepsRevisionsRising(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 2)
	var pub statePublished
	t0 := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	var early []event.Log // sensors whose readings will all be dropped
	for i := range 40 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		early = append(early, event.Log{V: event.Version, Kind: event.KindReading, SensorID: fmt.Sprintf("gone%d", i%4), Data: uint8(i / 4 % 2),
			Time: at, ReceivedTime: at, MessageID: fmt.Sprint("early", i)})
	}
	e.publish(t, e.nats.JS, early, &pub)
	var logs []event.Log
	for i := range 2000 {
		at := t0.Add(time.Second + time.Duration(i)*time.Millisecond)
		logs = append(logs, event.Log{V: event.Version, Kind: event.KindReading, SensorID: fmt.Sprintf("k%d", i%50), Data: uint8(i / 50 % 2),
			Time: at, ReceivedTime: at, MessageID: fmt.Sprint("kept", i)})
	}
	e.publish(t, e.nats.JS, logs, &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 60*time.Second)
	before := loadStateTable(t, e, "sensor_state")

	// As LOCKS_READINGS_MAX_AGE would: the early sensors and most of the others' readings go.
	st, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	cut := pub.seqs[len(early)+1500]
	if err := st.Purge(t.Context(), jetstream.WithPurgeSequence(cut)); err != nil {
		t.Fatal(err)
	}
	res, err := e.newRebuild(t, RebuildConfig{FromSeq: cut}).Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	afterRebuild(t, e, res)
	if res.EventsUnverified == 0 {
		t.Errorf("rebuild %+v: the renumbered events should count as unverified", res)
	}
	after := loadStateTable(t, e, "sensor_state")
	for id, b := range before {
		a, ok := after[id]
		switch {
		case !ok:
			t.Errorf("sensor %s is gone from the state after the rebuild", id)
		case a.Revision != b.Revision || a.Data != b.Data:
			t.Errorf("sensor %s after the rebuild: revision %d data %d, before %d and %d", id, a.Revision, a.Data, b.Revision, b.Data)
		}
	}
	// Every sensor changes once more: each change is the next revision, a new event.
	var flips []event.Log
	at := t0.Add(time.Minute)
	for id, b := range before {
		flips = append(flips, event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: 1 - b.Data,
			Time: at, ReceivedTime: at, MessageID: "flip/" + id})
	}
	e.publish(t, e.nats.JS, flips, &pub)
	e.waitCaughtUp(t, &pub, 60*time.Second)
	got := map[string]event.Event{}
	for _, ev := range readStateEvents(t, e.nats.JS) {
		got[ev.ID] = ev
	}
	final := loadStateTable(t, e, "sensor_state")
	for id, b := range before {
		id2 := event.ID(id, b.Revision+1)
		ev, ok := got[id2]
		if final[id].Revision != b.Revision+1 || !ok || ev.Data != 1-b.Data {
			t.Errorf("sensor %s changed after the rebuild: state revision %d, event %s in EVENTS %v (%+v); want revision %d",
				id, final[id].Revision, id2, ok, ev, b.Revision+1)
		}
	}
}

// With READINGS truncated and sensor_state lost (events already published), nothing knows
// the sensors' revisions: the rebuild refuses, saying what to do, and writes nothing.
func TestStateRebuildRefusesRenumberingWithoutState(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 2)
	var pub statePublished
	t0 := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	var logs []event.Log
	for i := range 200 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		logs = append(logs, event.Log{V: event.Version, Kind: event.KindReading, SensorID: fmt.Sprintf("r%d", i%10), Data: uint8(i / 10 % 2),
			Time: at, ReceivedTime: at, MessageID: fmt.Sprint("r", i)})
	}
	e.publish(t, e.nats.JS, logs, &pub)
	stop := e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 60*time.Second)
	stop()
	if _, err := e.pg.Exec(t.Context(), `DELETE FROM sensor_state`); err != nil {
		t.Fatal(err)
	}
	st, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(t.Context(), jetstream.WithPurgeSequence(pub.seqs[100])); err != nil {
		t.Fatal(err)
	}
	_, err = e.newRebuild(t, RebuildConfig{FromSeq: pub.seqs[100]}).Run(t.Context())
	if !errors.Is(err, rebuild.ErrLogTruncated) || !strings.Contains(err.Error(), "restore sensor_state") {
		t.Fatalf("rebuild without the revisions: %v, want ErrLogTruncated saying to restore sensor_state", err)
	}
	var shadow bool
	if err := e.pg.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, ShadowTable).Scan(&shadow); err != nil || shadow {
		t.Fatalf("a refused rebuild made its shadow table (%v)", err)
	}
}
