package event

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

func TestCheckLog(t *testing.T) {
	t.Parallel()
	const n = 16
	subj := func(id string) string { return "readings." + itoa(partition.Of(id, n)) + "." + id }
	now := `"2026-11-22T10:00:00Z"`
	for _, tc := range []struct {
		name, subject, body, reason string
	}{
		{"reading", subj("doorA"), `{"v":1,"kind":"reading","sensor_id":"doorA","data":1,"received_time":` + now + `}`, ""},
		{"fact", subj("doorA"), `{"v":1,"kind":"liveness_timeout","sensor_id":"doorA","received_time":` + now + `,"lost_after":1000000000}`, ""},
		{"space", subj("ab"), `{"v":1,"kind":"reading","sensor_id":"a b","data":1,"received_time":` + now + `}`, ReasonSensorID},
		{"nul", subj("ab"), `{"v":1,"kind":"reading","sensor_id":"a\u0000b","data":1,"received_time":` + now + `}`, ReasonSensorID},
		{"long", subj("ab"), `{"v":1,"kind":"reading","sensor_id":"` + strings.Repeat("a", 5000) + `","data":1,"received_time":` + now + `}`, ReasonSensorID},
		{"garbage", subj("ab"), "\x00\xff{garbage", ReasonDecode},
		{"version", subj("doorA"), `{"v":2,"kind":"reading","sensor_id":"doorA","data":1,"received_time":` + now + `}`, ReasonVersion},
		{"kind", subj("doorA"), `{"v":1,"kind":"x","sensor_id":"doorA","data":1,"received_time":` + now + `}`, ReasonKind},
		{"data", subj("doorA"), `{"v":1,"kind":"reading","sensor_id":"doorA","data":2,"received_time":` + now + `}`, ReasonData},
		{"no received_time", subj("doorA"), `{"v":1,"kind":"reading","sensor_id":"doorA","data":1}`, ReasonReceivedTime},
		{"fact without lost_after", subj("doorA"), `{"v":1,"kind":"liveness_timeout","sensor_id":"doorA","received_time":` + now + `}`, ReasonLostAfter},
		{"other sensor's subject", subj("doorB"), `{"v":1,"kind":"reading","sensor_id":"doorA","data":1,"received_time":` + now + `}`, ReasonSubject},
		{"other partition", "readings.99.doorA", `{"v":1,"kind":"reading","sensor_id":"doorA","data":1,"received_time":` + now + `}`, ReasonSubject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CheckLog(tc.subject, []byte(tc.body), n)
			if got := ReasonOf(err); got != tc.reason || (tc.reason != "" && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("reason %q (%v), want %q", got, err, tc.reason)
			}
		})
	}
}

func TestCheckEvent(t *testing.T) {
	t.Parallel()
	const n = 16
	one := uint8(1)
	good := func() Event {
		return Event{V: 1, ID: ID("doorA", 3), Type: TypeStateChanged, OccurredAt: time.Now(), SensorID: "doorA",
			Data: 0, PreviousData: &one, Revision: 3, Partition: partition.Of("doorA", n)}
	}
	subj := "events." + itoa(partition.Of("doorA", n)) + ".doorA"
	for _, tc := range []struct {
		name    string
		change  func(*Event)
		subject string
		reason  string
	}{
		{"good", func(*Event) {}, subj, ""},
		{"revision 2^62 with its own id", func(e *Event) { e.Revision = 1 << 62; e.ID = ID("doorA", 1<<62) }, subj, ReasonRevision},
		{"revision 0", func(e *Event) { e.Revision = 0; e.ID = ID("doorA", 0) }, subj, ReasonRevision},
		{"id of another revision", func(e *Event) { e.Revision = 4 }, subj, ReasonEventID},
		{"version", func(e *Event) { e.V = 7 }, subj, ReasonVersion},
		{"type", func(e *Event) { e.Type = "opened" }, subj, ReasonKind},
		{"sensor", func(e *Event) { e.SensorID = "a b" }, "events.0.ab", ReasonSensorID},
		{"previous_data", func(e *Event) { two := uint8(2); e.PreviousData = &two }, subj, ReasonData},
		{"no time", func(e *Event) { e.OccurredAt = time.Time{} }, subj, ReasonTime},
		{"wrong partition subject", func(*Event) {}, "events.99.doorA", ReasonSubject},
		{"partition field", func(e *Event) { e.Partition = 99 }, subj, ReasonSubject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := good()
			tc.change(&e)
			b, _ := json.Marshal(e)
			_, err := CheckEvent(tc.subject, b, n)
			if got := ReasonOf(err); got != tc.reason {
				t.Fatalf("reason %q (%v), want %q", got, err, tc.reason)
			}
		})
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
