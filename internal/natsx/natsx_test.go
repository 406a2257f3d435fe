package natsx_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The tests mostly wait on embedded servers and their clusters, each its own.
func TestMain(m *testing.M) { testenv.Main(m, 8) }

// The stream decides the partition with its subject transform; partition.Of must agree
// with it for every sensor, or EVENTS subjects and the watchdog would disagree with READINGS.
func TestPartitionMatchesServer(t *testing.T) {
	t.Parallel()
	env := testenv.NATS(t)
	ctx := t.Context()
	const n = 16
	if err := natsx.Declare(ctx, env.JS, natsx.StreamsConfig{Partitions: n, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	ids := []string{"0xA", "TestSensor", "0123456789aBcDeF", "xa7v9Dfadr7H"}
	for i := range 500 {
		ids = append(ids, fmt.Sprintf("s%d", i))
	}
	for _, id := range ids {
		if _, err := env.JS.Publish(ctx, natsx.ReadingsSubject(id), []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := env.JS.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= uint64(len(ids)); seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		id := string(m.Data)
		want := natsx.ReadingsStoredSubject(partition.Of(id, n), id)
		if m.Subject != want {
			t.Fatalf("server stored %q as %s, partition.Of says %s", id, m.Subject, want)
		}
	}
}

func TestDeclareIdempotentAndRefusesRepartition(t *testing.T) {
	t.Parallel()
	env := testenv.NATS(t)
	ctx := t.Context()
	c := natsx.StreamsConfig{Partitions: 4, LostAfter: time.Hour}
	for range 2 {
		if err := natsx.Declare(ctx, env.JS, c); err != nil {
			t.Fatal(err)
		}
	}
	c.Partitions = 8
	err := natsx.Declare(ctx, env.JS, c)
	if !errors.Is(err, natsx.ErrIncompatible) || !strings.Contains(err.Error(), "LOCKS_PARTITIONS") {
		t.Fatalf("re-declaring with 8 partitions: %v, want ErrIncompatible naming LOCKS_PARTITIONS", err)
	}
	kv, err := env.JS.KeyValue(ctx, natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.SubjectDeleteMarkerTTL <= 0 {
		t.Fatal("liveness bucket has no limit markers")
	}
}

// LivenessKeySubject must name the subject under which the bucket's stream stores a key, or
// the watchdog would watch, read and write subjects that are no key of the bucket.
func TestLivenessKeySubject(t *testing.T) {
	t.Parallel()
	env := testenv.NATS(t)
	ctx := t.Context()
	if err := natsx.Declare(ctx, env.JS, natsx.StreamsConfig{Partitions: 4, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	kv, err := env.JS.KeyValue(ctx, natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "3.door0", []byte("v")); err != nil {
		t.Fatal(err)
	}
	s, err := env.JS.Stream(ctx, "KV_"+natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, natsx.LivenessKeySubject("3.door0"))
	if err != nil || string(m.Data) != "v" {
		t.Fatalf("key 3.door0 at %s: %v, %v; want the value put", natsx.LivenessKeySubject("3.door0"), m, err)
	}
}

// ReadingsStoredPartition reads back the partition ReadingsStoredSubject wrote, and nothing
// from another subject.
func TestReadingsStoredPartition(t *testing.T) {
	t.Parallel()
	for _, p := range []int{0, 7, 15} {
		if got, ok := natsx.ReadingsStoredPartition(natsx.ReadingsStoredSubject(p, "door.1")); !ok || got != p {
			t.Errorf("partition of %s: %d, %v; want %d", natsx.ReadingsStoredSubject(p, "door.1"), got, ok, p)
		}
	}
	for _, s := range []string{natsx.ReadingsSubject("door1"), natsx.EventsSubject(3, "door1"), "readings.x.door1", "readings.3", "readings.-1.door1"} {
		if p, ok := natsx.ReadingsStoredPartition(s); ok {
			t.Errorf("partition of %s: %d, want none", s, p)
		}
	}
}

// A stream's atomic batches follow AtomicPublish exactly when AtomicPublishExact (the
// embedded server, switched from LOCKS_NATS_SYNC=always to an interval and back), and are
// only ever added otherwise (an external server, where an operator may have allowed them).
func TestDeclareAtomicPublishExactOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	env := testenv.NATS(t)
	ctx := t.Context()
	check := func(step string, want bool) {
		t.Helper()
		for _, name := range []string{natsx.ReadingsStream, natsx.EventsStream, natsx.DeliveriesStream} {
			got, err := natsx.AllowsAtomic(ctx, env.JS, name)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: %s allows atomic batches: %v, want %v", step, name, got, want)
			}
		}
	}
	c := natsx.StreamsConfig{Partitions: 4, LostAfter: time.Hour, AtomicPublish: true}
	steps := []struct {
		name          string
		atomic, exact bool
		want          bool
	}{
		{"created with them", true, false, true},
		{"declared without them, not exact", false, false, true},
		{"declared without them, exact", false, true, false},
		{"declared with them, exact", true, true, true},
	}
	for _, st := range steps {
		c.AtomicPublish, c.AtomicPublishExact = st.atomic, st.exact
		if err := natsx.Declare(ctx, env.JS, c); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		check(st.name, st.want)
	}
}

// A LOGS stream declared before the per-part subjects gets them added in place, its
// messages kept; a stream's subjects are otherwise still never changed behind its back.
func TestDeclareAddsLogsPerPartSubjects(t *testing.T) {
	t.Parallel()
	e := testenv.NATS(t)
	if _, err := e.JS.CreateStream(t.Context(), jetstream.StreamConfig{Name: natsx.LogsStream, Subjects: []string{"locks.logs.*"},
		Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, MaxMsgs: natsx.LogsMaxMsgs}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.JS.Publish(t.Context(), "locks.logs.old-process", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := natsx.Declare(t.Context(), e.JS, natsx.StreamsConfig{Partitions: 2, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s, err := e.JS.Stream(t.Context(), natsx.LogsStream)
	if err != nil {
		t.Fatal(err)
	}
	if info := s.CachedInfo(); !slices.Contains(info.Config.Subjects, "locks.logs.*.*") || info.State.Msgs != 1 {
		t.Fatalf("LOGS after Declare: subjects %v, %d messages", info.Config.Subjects, info.State.Msgs)
	}
	if _, err := e.JS.Publish(t.Context(), natsx.LogsSubject(natsx.ProcessKey("state", "p1")), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
}
