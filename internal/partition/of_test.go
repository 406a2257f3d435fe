package partition_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// ofCases are FNV-1a 32 digests (computed apart from Go's hash/fnv; "a" and "foobar" are the
// published test vectors) and their remainders: what NATS's partition(n,1) gives.
var ofCases = []struct {
	id   string
	hash uint32
	n    int
	want int
}{
	{"a", 0xe40c292c, 16, 12},
	{"a", 0xe40c292c, 7, 5},
	{"foobar", 0xbf9cf968, 16, 8},
	{"foobar", 0xbf9cf968, 7, 0},
	{"door-1", 0x3e0845c7, 16, 7},
	{"door-1", 0x3e0845c7, 3, 2},
	{"sensor-42", 0xc98633f0, 16, 0},
	{"sensor-42", 0xc98633f0, 7, 3},
	{"lock_front", 0xa58e490e, 16, 14},
	{"lock_front", 0xa58e490e, 3, 1},
	{"Ω-sensor", 0xcaf4d901, 16, 1},
	{"7f3a9c2e-0d4b-4c61-9a55-2f1e8b6d0c17", 0x7b99193c, 16, 12},
	{"7f3a9c2e-0d4b-4c61-9a55-2f1e8b6d0c17", 0x7b99193c, 7, 1},
	{"door-1", 0x3e0845c7, 1, 0},
	{"door-1", 0x3e0845c7, 0, 0}, // no partitioning: everything is partition 0
}

func TestOf(t *testing.T) {
	t.Parallel()
	for _, c := range ofCases {
		t.Run(fmt.Sprintf("%s/%d", c.id, c.n), func(t *testing.T) {
			t.Parallel()
			if c.n > 1 && int(c.hash%uint32(c.n)) != c.want {
				t.Fatalf("bad case: %#x %% %d != %d", c.hash, c.n, c.want)
			}
			if got := partition.Of(c.id, c.n); got != c.want {
				t.Fatalf("Of(%q, %d) = %d, want %d", c.id, c.n, got, c.want)
			}
		})
	}
}

// TestOfMatchesServer appends to streams that partition with the server's own transform
// (natsx.Declare's READINGS for 16 partitions, and the same transform for 3 and 7) and checks
// that Of names the partition the server stored each message under.
func TestOfMatchesServer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	env := testenv.NATS(t)
	ids := []string{}
	for _, c := range ofCases {
		ids = append(ids, c.id)
	}
	for i := range 200 {
		ids = append(ids, "sensor-"+strconv.Itoa(i*7919))
	}

	if err := natsx.Declare(ctx, env.JS, natsx.StreamsConfig{Partitions: 16}); err != nil {
		t.Fatal(err)
	}
	checkServer(ctx, t, env.JS, natsx.ReadingsStream, natsx.ReadingsSubject, "readings.", 16, ids)

	for _, n := range []int{3, 7} {
		name := "P" + strconv.Itoa(n)
		prefix := "p" + strconv.Itoa(n)
		_, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{
			Name: name, Subjects: []string{prefix + ".in.*"},
			SubjectTransform: &jetstream.SubjectTransformConfig{
				Source:      prefix + ".in.*",
				Destination: fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", prefix, n),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		in := func(id string) string { return prefix + ".in." + id }
		checkServer(ctx, t, env.JS, name, in, prefix+".", n, ids)
	}
}

func checkServer(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string, in func(string) string, prefix string, n int, ids []string) {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		ack, err := js.Publish(ctx, in(id), []byte("{}"))
		if err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
		m, err := st.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		p, rest, ok := strings.Cut(strings.TrimPrefix(m.Subject, prefix), ".")
		if !ok || rest != id {
			t.Fatalf("stored subject %q for %q", m.Subject, id)
		}
		if got := partition.Of(id, n); strconv.Itoa(got) != p {
			t.Errorf("%s: Of(%q, %d) = %d, server stored it in partition %s", stream, id, n, got, p)
		}
	}
}
