package state

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func TestCheckCheckpoint(t *testing.T) {
	t.Parallel()
	pos := streamPosition{id: "s2", firstSeq: 1, lastSeq: 10, msgs: 10}
	for _, c := range []struct {
		name   string
		seq    uint64
		stream string
		other  bool // want a mismatch of another stream
		ahead  bool // want a mismatch of the same stream
	}{
		{"nothing applied, no stream", 0, "", false, false},
		{"nothing applied, another stream", 0, "s1", false, false},
		{"inside this stream", 7, "s2", false, false},
		{"at its end", 10, "s2", false, false},
		{"unknown stream, inside", 10, "", false, false},
		{"another stream, inside", 3, "s1", true, false},
		{"another stream, ahead", 30, "s1", true, false},
		{"ahead of this stream", 11, "s2", false, true},
		{"unknown stream, ahead", 11, "", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkCheckpoint(Name, 3, c.seq, c.stream, pos)
			var mm *CheckpointMismatchError
			if got := errors.As(err, &mm); got != (c.other || c.ahead) {
				t.Fatalf("mismatch %v (%v), want %v", got, err, c.other || c.ahead)
			}
			if mm == nil {
				return
			}
			if !errors.Is(err, ErrCheckpointMismatch) || mm.OtherStream() != c.other || mm.Partition != 3 {
				t.Fatalf("%#v: want other stream %v, partition 3", mm, c.other)
			}
			if !strings.Contains(mm.WayOut(), RebaseCommand) || (c.ahead && !strings.Contains(mm.WayOut(), "--from-time")) {
				t.Fatalf("way out %q", mm.WayOut())
			}
		})
	}
}

// A checkpoint ahead of its own stream (a store that lost its last writes, or was restored
// from an older copy) stops its partition too: Ready says so and nothing is applied. The
// rebase needs to be told where the new readings start (the stream's start holds readings
// applied before); given it, the state projector applies them from there.
func TestStateRefusesCheckpointAheadOfStream(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 2)
	var a string
	for i := 0; a == ""; i++ {
		if id := fmt.Sprintf("door%d", i); partition.Of(id, 2) == 0 {
			a = id
		}
	}
	var logs []event.Log
	for i, d := range []uint8{1, 0, 1} {
		at := stateT0.Add(time.Duration(i) * time.Second)
		logs = append(logs, event.Log{V: event.Version, Kind: event.KindReading, SensorID: a, Data: d, Time: at, ReceivedTime: at})
	}
	var pub statePublished
	e.publish(t, e.nats.JS, logs, &pub)
	pos, err := readingsPosition(t.Context(), e.nats.JS)
	if err != nil {
		t.Fatal(err)
	}
	// The projection had applied up to 50 of this very stream, and a rebuild had a shadow.
	for _, q := range []string{
		`INSERT INTO checkpoints (projection, partition, seq, stream) VALUES ('state', 0, 50, '` + pos.id + `'), ('state_rebuild', 0, 40, '` + pos.id + `')`,
		`CREATE TABLE sensor_state_rebuild (LIKE sensor_state INCLUDING ALL)`,
	} {
		if _, err := e.pg.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	s, err := New(Config{Partitions: partition.All(2), PartitionCount: 2, IdleWait: 200 * time.Millisecond, RelayPoll: 100 * time.Millisecond},
		Deps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "State", s.Run, 20*time.Second)
	testenv.Eventually(t, 20*time.Second, "Ready to refuse partition 0", func() bool {
		err := s.Ready(t.Context())
		return err != nil && strings.Contains(err.Error(), "partition(s) 0:") && strings.Contains(err.Error(), "ahead of READINGS")
	})
	rows := loadStateRows(t, e.pg)
	if len(rows) != 0 {
		t.Fatalf("rows applied while refused: %v", rows)
	}

	if _, err := Rebase(t.Context(), RebaseConfig{}, RebuildDeps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t)}); err == nil || !strings.Contains(err.Error(), "--from-seq or --from-time") {
		t.Fatalf("rebase without a start: %v, want a refusal asking for --from-seq or --from-time", err)
	}
	res, err := Rebase(t.Context(), RebaseConfig{FromSeq: 2}, RebuildDeps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Partitions) != "[0]" || res.From != 2 || !res.ShadowDropped {
		t.Fatalf("rebase: %+v, want partition 0 from 2 and the shadow dropped", res)
	}
	testenv.Eventually(t, 20*time.Second, "readings 2-3 applied", func() bool {
		r, ok := loadStateRows(t, e.pg)[a]
		return ok && r.Revision == 2 && r.Data == 1 && r.LastSeq == 3 // 0 then 1
	})
	testenv.Eventually(t, 10*time.Second, "Ready", func() bool { return s.Ready(t.Context()) == nil })
	var shadow bool
	if err := e.pg.QueryRow(t.Context(), `SELECT to_regclass('sensor_state_rebuild') IS NOT NULL OR EXISTS (SELECT FROM checkpoints WHERE projection = 'state_rebuild')`).Scan(&shadow); err != nil || shadow {
		t.Fatalf("the shadow of the old checkpoints is still there (%v)", err)
	}
	if res, err := Rebase(t.Context(), RebaseConfig{}, RebuildDeps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t)}); err != nil || len(res.Partitions) != 0 {
		t.Fatalf("second rebase: %+v %v, want nothing to do", res, err)
	}
}
