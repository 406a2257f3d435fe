package watchdog

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// offline is a Watchdog with no servers, for the pure parts: keys, subjects, TTLs, coalescing.
func offline(t testing.TB, cfg Config, overrides map[string]time.Duration) *Watchdog {
	t.Helper()
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	w := &Watchdog{cfg: cfg, parts: map[int]*partState{}}
	for _, p := range cfg.Partitions {
		w.parts[p] = &partState{}
	}
	if overrides == nil {
		overrides = map[string]time.Duration{}
	}
	w.overrides.Store(&overrides)
	return w
}

func TestKeyOf(t *testing.T) {
	t.Parallel()
	for _, sensor := range []string{"0xA", "TestSensor", "0123456789aBcDeF", "xa7v9Dfadr7H", "door0"} {
		t.Run(sensor, func(t *testing.T) {
			for _, n := range []int{1, 4, 16} {
				want := strconv.Itoa(partition.Of(sensor, n)) + "." + sensor
				if got := keyOf(sensor, n); got != want {
					t.Errorf("keyOf(%q, %d) = %q, want %q", sensor, n, got, want)
				}
			}
		})
	}
}

func TestEncodeValue(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 22, 10, 0, 0, 123_456_789, time.UTC)
	cases := []struct {
		name     string
		received time.Time
		seq      uint64
		lost     bool
		want     string
	}{
		{"refresh", at, 42, false, `{"received_ns":1795341600123456789,"seq":42}`},
		{"declared", at, 42, true, `{"received_ns":1795341600123456789,"seq":42,"lost":true}`},
		{"largest sequence", at, math.MaxUint64, false, `{"received_ns":1795341600123456789,"seq":18446744073709551615}`},
		{"before 1970", time.Unix(0, -5), 1, false, `{"received_ns":-5,"seq":1}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := encodeValue(c.received, c.seq, c.lost)
			if string(b) != c.want {
				t.Errorf("encodeValue = %s, want %s", b, c.want)
			}
			var v keyValue
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("%s is no JSON: %v", b, err)
			}
			if v != (keyValue{ReceivedNS: c.received.UnixNano(), Seq: c.seq, Lost: c.lost}) {
				t.Errorf("decoded %+v", v)
			}
		})
	}
}

func TestSensorOfSubject(t *testing.T) {
	t.Parallel()
	w := offline(t, Config{PartitionCount: 4, Partitions: partition.Set{1, 2}, LostAfter: time.Hour}, nil)
	cases := []struct {
		subj   string
		sensor string // "": not an owned sensor's key
	}{
		{"$KV.liveness.1.door0", "door0"},
		{"$KV.liveness.2.TestSensor", "TestSensor"},
		{"$KV.liveness.0.door0", ""},                // a partition another process owns
		{"$KV.liveness.4.door0", ""},                // beyond the partition count
		{"$KV.liveness.-1.door0", ""},               // no partition
		{"$KV.liveness.x.door0", ""},                // not a number
		{positionSubject(1), ""},                    // a partition's position (position.go)
		{"$KV.liveness.1", ""},                      // no sensor
		{"$KV.liveness.", ""},                       // no key
		{"$KV.bridge_sessions.1.a", ""},             // another bucket
		{"readings.1.door0", ""},                    // not a bucket
		{"$KV.liveness.1.door0.more", "door0.more"}, // the sensor is everything after the partition
	}
	for _, c := range cases {
		t.Run(c.subj, func(t *testing.T) {
			got, ok := w.sensorOfSubject(c.subj)
			if ok != (c.sensor != "") || got != c.sensor {
				t.Errorf("sensorOfSubject(%q) = %q, %v; want %q", c.subj, got, ok, c.sensor)
			}
		})
	}
	// Every key the watchdog writes for an owned sensor reads back as that sensor.
	for _, s := range []string{"door0", "0xA", "xa7v9Dfadr7H", "0123456789aBcDeF"} {
		got, ok := w.sensorOfSubject(w.kvSubject(s))
		if owned := w.part(partition.Of(s, 4)) != nil; ok != owned || (ok && got != s) {
			t.Errorf("sensorOfSubject(kvSubject(%q)) = %q, %v; owned %v", s, got, ok, owned)
		}
	}
}

func TestKVFilters(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		owned partition.Set
		want  []string
	}{
		{"all partitions: one filter", partition.All(4), []string{"$KV.liveness.>"}},
		{"some partitions: one each", partition.Set{0, 3}, []string{"$KV.liveness.0.*", "$KV.liveness.3.*"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := kvFilters(c.owned, 4); !slices.Equal(got, c.want) {
				t.Errorf("kvFilters = %q, want %q", got, c.want)
			}
		})
	}
}

func TestKeyOfSensor(t *testing.T) {
	t.Parallel()
	cases := []struct {
		id string
		ok bool
	}{
		{"", false},
		{"a", true},
		{"0123456789aBcDeF", true},
		{"zzzzzzzzzzzzzzzz", true},
		{"0123456789aBcDeFx", false}, // 17 bytes
		{"a\x00", false},             // not a letter or digit
		{"a-b", false},
		{"é", false},
	}
	for _, c := range cases {
		t.Run(strconv.Quote(c.id), func(t *testing.T) {
			if _, ok := keyOfSensor(c.id); ok != c.ok {
				t.Fatalf("keyOfSensor(%q) ok = %v, want %v", c.id, ok, c.ok)
			}
		})
	}
	// No two ids share a key: every character in every position, ids of every length, and
	// the ones a padding or case mix-up would merge.
	const chars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	seen := map[sensorKey]string{}
	add := func(id string) {
		k, ok := keyOfSensor(id)
		if !ok {
			t.Fatalf("keyOfSensor(%q) refused a contract id", id)
		}
		if other, dup := seen[k]; dup && other != id {
			t.Fatalf("%q and %q share a key", id, other)
		}
		seen[k] = id
	}
	for pos := range 16 {
		for _, c := range []byte(chars) {
			id := []byte("0000000000000000")[:pos+1]
			id[pos] = c
			add(string(id))
			add(strings.Repeat("z", pos) + string(c))
		}
	}
	for _, id := range []string{"door0", "door00", "A", "a", "0", "00", "Door0", "0123456789aBcDeF", "0123456789aBcDeE", "1123456789aBcDeF"} {
		add(id)
	}
}

func TestCeilSeconds(t *testing.T) {
	t.Parallel()
	sec := int64(time.Second)
	cases := []struct {
		ns   int64
		want uint32
	}{
		{0, 0},
		{1, 1},
		{sec, 1},
		{sec + 1, 2},
		{1795341600 * sec, 1795341600},
		{-sec, 0},                          // before 1970: clamped
		{7258118400 * sec, math.MaxUint32}, // 2200, after 2106: clamped
	}
	for _, c := range cases {
		t.Run(strconv.FormatInt(c.ns, 10), func(t *testing.T) {
			if got := ceilSeconds(c.ns); got != c.want {
				t.Errorf("ceilSeconds(%d) = %d, want %d", c.ns, got, c.want)
			}
		})
	}
}
