package natsx_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Every stream and bucket Declare looks after, by stream name.
var declared = []string{
	natsx.ReadingsStream, natsx.EventsStream, natsx.DeliveriesStream, natsx.SetAsideStream,
	"KV_" + natsx.LivenessBucket, "KV_" + natsx.BridgeSessionsBucket,
}

func streamConfigs(t *testing.T, js jetstream.JetStream) map[string]jetstream.StreamConfig {
	t.Helper()
	out := map[string]jetstream.StreamConfig{}
	for _, name := range declared {
		s, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		out[name] = s.CachedInfo().Config
	}
	return out
}

// LOCKS_NATS_REPLICAS=3 on a 3-node cluster: everything Declare creates is kept by 3 servers.
func TestDeclareReplicatesOnCluster(t *testing.T) {
	t.Parallel()
	js := jsCluster(t, 3)
	ctx := t.Context()
	if err := natsx.Declare(ctx, js, natsx.StreamsConfig{Partitions: 4, Replicas: 3, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, name := range declared {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream %s: %d replicas configured, cluster %+v; want 3 (a leader and 2 replicas)",
				name, info.Config.Replicas, info.Cluster)
		}
	}
}

// The must-show of issue 15: a process started against streams an operator set to R3 with
// limits leaves them as they are; one that asks for more replicas than a stream has raises
// them and keeps the limits; a different partition count is refused in one line.
func TestDeclareKeepsOperatorSettings(t *testing.T) {
	t.Parallel()
	js := jsCluster(t, 3)
	ctx := t.Context()
	c := natsx.StreamsConfig{Partitions: 4, Replicas: 1, LostAfter: time.Hour}
	if err := natsx.Declare(ctx, js, c); err != nil {
		t.Fatal(err)
	}

	// The operator: R3 and limits on READINGS, EVENTS and the liveness bucket, other limits on
	// SET_ASIDE; DELIVERIES and bridge_sessions stay as Declare made them. (JetStream scales
	// and moves a stream in separate updates, hence READINGS' placement apart.)
	for _, e := range []struct {
		name string
		edit func(*jetstream.StreamConfig)
	}{
		{natsx.ReadingsStream, func(s *jetstream.StreamConfig) {
			s.Replicas = 3
			s.MaxAge = 90 * 24 * time.Hour
			s.MaxBytes = 10 << 30
			s.MaxMsgsPerSubject = 100_000
			s.Duplicates = 10 * time.Minute
		}},
		{natsx.ReadingsStream, func(s *jetstream.StreamConfig) { s.Placement = &jetstream.Placement{Cluster: "locks"} }},
		{natsx.EventsStream, func(s *jetstream.StreamConfig) {
			s.Replicas = 3
			s.MaxMsgs = 50_000_000
			s.Discard = jetstream.DiscardNew
		}},
		{natsx.SetAsideStream, func(s *jetstream.StreamConfig) {
			s.MaxAge = 24 * time.Hour
			s.MaxBytes = 4 << 30
		}},
		{"KV_" + natsx.LivenessBucket, func(s *jetstream.StreamConfig) {
			s.Replicas = 3
			s.MaxBytes = 1 << 30
		}},
	} {
		// A stream being scaled refuses the next edit until the new replicas have caught up.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			s, err := js.Stream(ctx, e.name)
			if err != nil {
				t.Fatal(err)
			}
			cfg := s.CachedInfo().Config
			e.edit(&cfg)
			_, err = js.UpdateStream(ctx, cfg)
			var api *jetstream.APIError
			if err == nil {
				break
			}
			if !errors.As(err, &api) || api.ErrorCode != 10226 || time.Now().After(deadline) {
				t.Fatalf("operator's edit of %s: %v", e.name, err)
			}
		}
	}
	operator := streamConfigs(t, js)

	// A start with LOCKS_NATS_REPLICAS=1 changes nothing.
	if err := natsx.Declare(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	for name, got := range streamConfigs(t, js) {
		if !reflect.DeepEqual(got, operator[name]) {
			t.Fatalf("a start with replicas 1 changed stream %s:\n got  %+v\n want %+v", name, got, operator[name])
		}
	}

	// A start with LOCKS_NATS_REPLICAS=3 raises the rest to 3 and changes nothing else.
	c.Replicas = 3
	if err := natsx.Declare(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	for name, got := range streamConfigs(t, js) {
		want := operator[name]
		want.Replicas = 3
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("a start with replicas 3 made stream %s:\n got  %+v\n want %+v", name, got, want)
		}
	}

	// A different partition count is refused in one line that says what to do, and changes nothing.
	before := streamConfigs(t, js)
	c.Partitions = 8
	err := natsx.Declare(ctx, js, c)
	if !errors.Is(err, natsx.ErrIncompatible) || strings.Contains(err.Error(), "\n") ||
		!strings.Contains(err.Error(), natsx.ReadingsStream) || !strings.Contains(err.Error(), "LOCKS_PARTITIONS") {
		t.Fatalf("re-declaring with 8 partitions: %v; want one line with ErrIncompatible naming READINGS and LOCKS_PARTITIONS", err)
	}
	if after := streamConfigs(t, js); !reflect.DeepEqual(after, before) {
		t.Fatal("a refused start changed a stream")
	}
}

// Settings that cannot be reconciled without moving or losing messages are refused with one
// line naming the stream, the setting and what to do; the stream is left as it is.
func TestDeclareRefusesConflicts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		stream jetstream.StreamConfig
		want   []string
	}{
		{
			name:   "storage",
			stream: jetstream.StreamConfig{Name: natsx.EventsStream, Subjects: []string{"events.*.*"}, Storage: jetstream.MemoryStorage},
			want:   []string{"stream EVENTS has storage Memory", "File"},
		},
		{
			name:   "retention",
			stream: jetstream.StreamConfig{Name: natsx.DeliveriesStream, Subjects: []string{"deliveries.*"}, Retention: jetstream.InterestPolicy},
			want:   []string{"stream DELIVERIES has retention Interest", "--retention Limits"},
		},
		{
			name:   "subjects",
			stream: jetstream.StreamConfig{Name: natsx.SetAsideStream, Subjects: []string{"setaside.>"}},
			want:   []string{"stream SET_ASIDE has subjects", `"setaside.*"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.NATS(t)
			ctx := t.Context()
			s, err := env.JS.CreateStream(ctx, tc.stream)
			if err != nil {
				t.Fatal(err)
			}
			have := s.CachedInfo().Config
			err = natsx.Declare(ctx, env.JS, natsx.StreamsConfig{Partitions: 4, LostAfter: time.Hour})
			if !errors.Is(err, natsx.ErrIncompatible) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Declare over a conflicting %s: %v; want one line with ErrIncompatible", tc.name, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("Declare over a conflicting %s: %q does not say %q", tc.name, err, w)
				}
			}
			s, err = env.JS.Stream(ctx, tc.stream.Name)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.CachedInfo().Config; !reflect.DeepEqual(got, have) {
				t.Fatalf("a refused Declare changed %s:\n got  %+v\n want %+v", tc.stream.Name, got, have)
			}
		})
	}
}
