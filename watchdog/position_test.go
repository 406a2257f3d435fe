package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func TestResumePoint(t *testing.T) {
	t.Parallel()
	now := natsx.Extent{ID: "s2", First: 1, Last: 100}
	for _, c := range []struct {
		name       string
		stored     position
		done       uint64
		doneStream string
		acked      uint64
		now        natsx.Extent
		want       uint64
		note       string // a part of the note; "": none
	}{
		{name: "nothing known: the stream's first", now: now, want: 1},
		{name: "after the position", stored: position{40, "s2"}, now: now, want: 41},
		{name: "at the stream's end", stored: position{100, "s2"}, now: now, want: 101},
		{name: "own progress ahead of the position", stored: position{40, "s2"}, done: 55, doneStream: "s2", now: now, want: 56},
		{name: "own progress behind the position", stored: position{40, "s2"}, done: 30, doneStream: "s2", now: now, want: 41},
		{name: "own progress on another stream", stored: position{40, "s2"}, done: 55, doneStream: "s1", now: now, want: 41},
		{name: "a consumer's ack floor ahead", stored: position{40, "s2"}, acked: 70, now: now, want: 71},
		{name: "position of another stream: start over", stored: position{40, "s1"}, now: now, want: 1, note: "another"},
		{name: "position of another stream, a consumer on this one", stored: position{40, "s1"}, acked: 12, now: now, want: 13, note: "another"},
		{name: "position ahead of the stream: start over", stored: position{150, "s2"}, now: now, want: 1, note: "ahead"},
		{name: "own progress ahead of a stream that lost writes", done: 150, doneStream: "s2", now: now, want: 1, note: "ahead"},
		{name: "own progress ahead of another stream", done: 150, doneStream: "s1", now: now, want: 1},
		{name: "position before the first message", stored: position{40, "s2"}, now: natsx.Extent{ID: "s2", First: 60, Last: 100}, want: 60, note: "retention"},
		{name: "nothing known, stream starting later", now: natsx.Extent{ID: "s2", First: 60, Last: 100}, want: 60},
		{name: "empty stream", now: natsx.Extent{ID: "s2"}, want: 1},
		{name: "position right before the first message", stored: position{59, "s2"}, now: natsx.Extent{ID: "s2", First: 60, Last: 100}, want: 60},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, note := resumePoint(c.stored, c.done, c.doneStream, c.acked, c.now)
			if got != c.want {
				t.Errorf("resumePoint = %d, want %d", got, c.want)
			}
			if (c.note == "") != (note == "") || !strings.Contains(note, c.note) {
				t.Errorf("note %q, want one with %q", note, c.note)
			}
		})
	}
}

// sensorsIn are n sensors with the prefix, in partition p.
func sensorsIn(prefix string, p, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if s := prefix + strconv.Itoa(i); partition.Of(s, testPartitions) == p {
			out = append(out, s)
		}
	}
	return out
}

// storedPosition is partition p's position key (the zero position when there is none).
func (e *env) storedPosition(p int) position {
	e.t.Helper()
	kvs, err := e.nats.JS.Stream(context.Background(), kvStream)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := kvs.GetLastMsgForSubject(context.Background(), positionSubject(p))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return position{}
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var pos position
	if err := json.Unmarshal(m.Data, &pos); err != nil {
		e.t.Fatalf("position %s: %v", m.Data, err)
	}
	return pos
}

// setPosition writes partition p's position key, as a watchdog would.
func (e *env) setPosition(p int, pos position) {
	e.t.Helper()
	if _, err := e.nats.JS.PublishMsg(context.Background(), positionMsg(p, pos)); err != nil {
		e.t.Fatal(err)
	}
}

// readingsID is the identity of READINGS.
func (e *env) readingsID() string {
	e.t.Helper()
	s, err := e.nats.JS.Stream(context.Background(), natsx.ReadingsStream)
	if err != nil {
		e.t.Fatal(err)
	}
	return natsx.StreamIdentity(s.CachedInfo())
}

// keyValueOf is sensor's key as it stands (ok false: none, or an expiry marker).
func (e *env) keyValueOf(sensor string) (keyValue, bool) {
	e.t.Helper()
	kvs, err := e.nats.JS.Stream(context.Background(), kvStream)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := kvs.GetLastMsgForSubject(context.Background(), natsx.LivenessKeySubject(keyOf(sensor, testPartitions)))
	if err != nil || len(m.Data) == 0 {
		return keyValue{}, false
	}
	var v keyValue
	if json.Unmarshal(m.Data, &v) != nil {
		return keyValue{}, false
	}
	return v, true
}

// waitKeysAt waits until each sensor's key stands for the READINGS sequence want[sensor].
func (e *env) waitKeysAt(want map[string]uint64, d time.Duration) {
	e.t.Helper()
	testenv.Eventually(e.t, d, "every key at its sensor's last reading", func() bool {
		for s, seq := range want {
			if v, ok := e.keyValueOf(s); !ok || v.Seq != seq {
				return false
			}
		}
		return true
	})
}

// consumerStart is the configuration of partition p's READINGS consumer, once it exists:
// its OptStartSeq is where it was created.
func (e *env) consumerStart(p int) jetstream.ConsumerConfig {
	e.t.Helper()
	var c jetstream.Consumer
	testenv.Eventually(e.t, 10*time.Second, fmt.Sprintf("partition %d's consumer", p), func() bool {
		var err error
		c, err = e.nats.JS.Consumer(context.Background(), natsx.ReadingsStream, DurableDefault+"-"+strconv.Itoa(p))
		return err == nil
	})
	return c.CachedInfo().Config
}

// appendAll appends one reading of each sensor, in order, and returns their sequences.
func (e *env) appendAll(sensors []string, into map[string]uint64) {
	e.t.Helper()
	for _, s := range sensors {
		_, seq, err := e.appendSeq(context.Background(), e.nats.JS, s, "")
		if err != nil {
			e.t.Fatal(err)
		}
		into[s] = seq
	}
}

// The watchdog's READINGS consumers are memory-backed (no state file on disk), and where a
// partition resumes after its consumer is gone (NATS restarted, with the watchdog running
// or stopped) is its position: every reading refreshes its key exactly once over both
// restarts, none is skipped and none is applied again.
func TestConsumersInMemoryResumeFromPosition(t *testing.T) {
	t.Parallel()
	const la = 30 * time.Second // every reading writes its key (no coalescing), none expires
	e := newEnv(t, la)
	var sensors []string
	for p := range testPartitions - 1 { // the last partition reads nothing
		sensors = append(sensors, sensorsIn("door", p, 3)...)
	}
	last := map[string]uint64{}
	readings := 0
	e.appendAll(sensors, last)
	readings += len(sensors)
	_, reg, stop := e.start(Config{LostAfter: la, PositionEvery: 100 * time.Millisecond})
	e.waitKeysAt(last, 10*time.Second)

	for p := range testPartitions {
		if cfg := e.consumerStart(p); !cfg.MemoryStorage {
			t.Errorf("partition %d: consumer %s is not memory-backed", p, cfg.Durable)
		}
	}
	var files []string
	err := filepath.WalkDir(e.nats.Server.StoreDir(), func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), DurableDefault+"-") {
			files = append(files, path)
		}
		return err
	})
	if err != nil || len(files) > 0 {
		t.Errorf("consumer state in the NATS store: %v (%v), want none", files, err)
	}

	// NATS restarts under the running watchdog: its consumers are gone with it.
	e.nats.Restart(200 * time.Millisecond)
	e.appendAll(sensors, last)
	readings += len(sensors)
	e.waitKeysAt(last, 15*time.Second)
	if n := counter(t, reg, "locks_watchdog_refreshes_total"); n != float64(readings) {
		t.Errorf("%v refreshes for %d readings across the NATS restart, want one each", n, readings)
	}

	// The watchdog stops (its positions written at the stop), NATS restarts with nobody
	// connected, readings come meanwhile; the next watchdog resumes right after the
	// positions.
	stop()
	id := e.readingsID()
	var positions [testPartitions]position
	for p := range testPartitions {
		positions[p] = e.storedPosition(p)
	}
	for _, s := range sensors {
		if pos := positions[partition.Of(s, testPartitions)]; pos.Stream != id || pos.Seq < last[s] {
			t.Fatalf("position of %s's partition %+v after the stop, want at least %d on %s", s, pos, last[s], id)
		}
	}
	if pos := positions[testPartitions-1]; pos.Seq != 0 {
		t.Errorf("the partition that read nothing has position %+v, want none", pos)
	}
	e.nats.Restart(0)
	e.appendAll(sensors, last)
	_, reg, _ = e.start(Config{LostAfter: la, PositionEvery: 100 * time.Millisecond})
	e.waitKeysAt(last, 15*time.Second)
	if n := counter(t, reg, "locks_watchdog_refreshes_total"); n != float64(len(sensors)) {
		t.Errorf("the restarted watchdog made %v refreshes for the %d readings after its positions, want one each", n, len(sensors))
	}
	for p := range testPartitions {
		if got, want := e.consumerStart(p).OptStartSeq, max(positions[p].Seq+1, 1); got != want {
			t.Errorf("partition %d resumed at %d, want %d (after its position %+v)", p, got, want, positions[p])
		}
	}
}

// A position that does not fit READINGS: of another stream (the stream was replaced while
// the bucket was kept) or ahead of it (a store that lost its last writes) the partition
// starts over at the first message; older than its first message (retention) it starts at
// the first. In none of them is a reading skipped.
func TestPositionNotOfThisStream(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// position is the stale position, given the stream's identity and last sequence.
		position func(id string, last uint64) position
		// purge drops READINGS' messages before the sequence, when > 0.
		purge uint64
		// start is where the consumer must start.
		start uint64
		// refreshed: the readings before the start are refreshed (read again).
		refreshed bool
	}{
		{name: "another stream", position: func(string, uint64) position { return position{Seq: 1000, Stream: "2001-01-01T00:00:00Z"} },
			start: 1, refreshed: true},
		{name: "ahead of the stream", position: func(id string, last uint64) position { return position{Seq: last + 1000, Stream: id} },
			start: 1, refreshed: true},
		{name: "before the first message", position: func(id string, _ uint64) position { return position{Seq: 1, Stream: id} },
			purge: 3, start: 3, refreshed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const la = 30 * time.Second
			e := newEnv(t, la)
			sensors := sensorsIn("gate", 1, 4)
			before := map[string]uint64{}
			e.appendAll(sensors, before)
			if c.purge > 0 {
				s, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Purge(t.Context(), jetstream.WithPurgeSequence(c.purge)); err != nil {
					t.Fatal(err)
				}
			}
			lastSeq := before[sensors[len(sensors)-1]]
			e.setPosition(1, c.position(e.readingsID(), lastSeq))
			_, _, _ = e.start(Config{LostAfter: la, PositionEvery: 100 * time.Millisecond})
			after := map[string]uint64{}
			e.appendAll(sensors[:2], after)
			want := after
			if c.refreshed {
				want = map[string]uint64{}
				for s, seq := range before {
					if seq >= c.purge {
						want[s] = seq
					}
				}
				for s, seq := range after {
					want[s] = seq
				}
			}
			e.waitKeysAt(want, 10*time.Second)
			if got, want := e.consumerStart(1).OptStartSeq, c.start; got != want {
				t.Errorf("consumer started at %d, want %d", got, want)
			}
			testenv.Eventually(t, 5*time.Second, "the position written on this stream", func() bool {
				pos := e.storedPosition(1)
				return pos.Stream == e.readingsID() && pos.Seq == after[sensors[1]]
			})
		})
	}
}

// A watchdog that resumes from an old position reads readings again that it had applied
// (a crash before the position was written): live sensors' older readings, after newer
// ones had written their keys, and a lost sensor's last reading, after its fact marked the
// key declared. None of them writes its key: every live key stands for its sensor's last
// reading throughout, the lost sensor's key stays declared, and no fact is appended.
func TestStalePositionReplayIsHarmless(t *testing.T) {
	t.Parallel()
	const la = 30 * time.Second // the live sensors' keys outlive the test; every reading writes
	e := newEnv(t, la)
	// gone's own lost_after, so that it is declared within the test.
	if _, err := e.pg.Exec(t.Context(), `INSERT INTO sensors (id, address, lost_after_ms) VALUES ('gone', 'x', 2000)`); err != nil {
		t.Fatal(err)
	}
	f := e.collectFacts()
	alive := []string{"live0", "live1", "live2", "live3"}
	last := map[string]uint64{}
	for range 3 {
		e.appendAll(alive, last)
	}
	id := e.readingsID()
	_, _, stop := e.start(Config{LostAfter: la, PositionEvery: 100 * time.Millisecond})
	e.waitKeysAt(last, 10*time.Second)
	_, goneSeq, err := e.appendSeq(t.Context(), e.nats.JS, "gone", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.waitFact("gone", time.Now().Add(10*time.Second)); !ok {
		t.Fatal("gone was not declared")
	}
	testenv.Eventually(t, 10*time.Second, "gone's key marked declared", func() bool {
		v, ok := e.keyValueOf("gone")
		return ok && v.Lost
	})
	stop()
	// Every position goes back to the stream's first reading; the consumers go with a NATS
	// restart, as with an embedded NATS that dies with the process.
	for p := range testPartitions {
		e.setPosition(p, position{Seq: 1, Stream: id})
	}
	e.nats.Restart(0)
	_, reg, stop := e.start(Config{LostAfter: la, PositionEvery: 100 * time.Millisecond})
	defer stop()
	if p := partition.Of("gone", testPartitions); e.consumerStart(p).OptStartSeq > goneSeq {
		t.Fatalf("partition %d resumed after gone's reading %d", p, goneSeq)
	}
	// Long enough for a replayed key of gone to expire and be settled.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if v, ok := e.keyValueOf("gone"); !ok || !v.Lost {
			t.Fatalf("gone's key during the replay: %+v (%v), want it still declared", v, ok)
		}
		for _, s := range alive {
			if v, ok := e.keyValueOf(s); !ok || v.Seq != last[s] {
				t.Fatalf("%s's key during the replay: %+v (%v), want its last reading %d", s, v, ok, last[s])
			}
		}
	}
	if n := len(f.of("gone")); n != 1 {
		t.Errorf("gone has %d facts, want the 1 from before", n)
	}
	for _, s := range alive {
		if n := len(f.of(s)); n != 0 {
			t.Errorf("%s got %d facts", s, n)
		}
	}
	if n := counter(t, reg, "locks_watchdog_replayed_refreshes_skipped_total"); n < float64(2*len(alive)+1) {
		t.Errorf("%v replayed readings found covered by their keys, want at least the %d read again", n, 2*len(alive)+1)
	}
	for _, m := range []string{"locks_watchdog_refreshes_total", "locks_watchdog_expiries_total", "locks_watchdog_expiries_already_declared_total"} {
		if n := counter(t, reg, m); n != 0 {
			t.Errorf("%s %v after the replay, want 0: a replayed reading wrote its key", m, n)
		}
	}
}

func TestReplayWindow(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	md := func(seq uint64, stored time.Time) *jetstream.MsgMetadata {
		return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, Timestamp: stored}
	}
	for _, c := range []struct {
		name    string
		w       replayWindow
		md      *jetstream.MsgMetadata
		replays bool
	}{
		{"own progress: none", newReplayWindow(11, 20, true, at, time.Second), md(12, at), false},
		{"nothing to read again", newReplayWindow(21, 20, false, at, time.Second), md(21, at), false},
		{"after a position, stored before its write", newReplayWindow(11, 20, false, at, time.Second), md(12, at.Add(-time.Hour)), true},
		{"after a position, stored within the margin", newReplayWindow(11, 20, false, at, time.Second), md(20, at.Add(time.Second+replayMargin)), true},
		{"after a position, stored later", newReplayWindow(11, 20, false, at, time.Second), md(15, at.Add(time.Second+replayMargin+time.Millisecond)), false},
		{"beyond the stream's end at the resume", newReplayWindow(11, 20, false, at, time.Second), md(21, at), false},
		{"no position: by sequence alone", newReplayWindow(1, 20, false, time.Time{}, time.Second), md(20, at.Add(24*time.Hour)), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.w.holds(c.md); got != c.replays {
				t.Errorf("holds = %v, want %v (%+v)", got, c.replays, c.w)
			}
		})
	}
}

// The first start after an upgrade finds the partition's file-backed consumer of the
// earlier releases and no position: it resumes after that consumer's ack floor, with a
// memory-backed consumer in its place.
func TestResumesAfterFileConsumerOfEarlierRelease(t *testing.T) {
	t.Parallel()
	const la = 30 * time.Second
	e := newEnv(t, la)
	sensors := sensorsIn("old", 2, 6)
	before := map[string]uint64{}
	e.appendAll(sensors, before)
	name := DurableDefault + "-2"
	c, err := e.nats.JS.CreateConsumer(t.Context(), natsx.ReadingsStream, jetstream.ConsumerConfig{
		Durable: name, FilterSubject: natsx.ReadingsPartitionFilter(2), AckPolicy: jetstream.AckAllPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Fetch(4)
	if err != nil {
		t.Fatal(err)
	}
	var acked jetstream.Msg
	for m := range b.Messages() {
		acked = m
	}
	if acked == nil {
		t.Fatal("nothing fetched")
	}
	if err := acked.DoubleAck(t.Context()); err != nil {
		t.Fatal(err)
	}
	md, _ := acked.Metadata()
	_, reg, _ := e.start(Config{LostAfter: la, PositionEvery: 100 * time.Millisecond})
	want := map[string]uint64{}
	for _, s := range sensors[4:] {
		want[s] = before[s]
	}
	e.waitKeysAt(want, 10*time.Second)
	cfg := e.consumerStart(2)
	if cfg.OptStartSeq != md.Sequence.Stream+1 || !cfg.MemoryStorage {
		t.Errorf("consumer %s from %d (memory %v), want from %d in memory", name, cfg.OptStartSeq, cfg.MemoryStorage, md.Sequence.Stream+1)
	}
	if n := counter(t, reg, "locks_watchdog_refreshes_total"); n != 2 {
		t.Errorf("%v refreshes, want the 2 readings after the ack floor", n)
	}
}
