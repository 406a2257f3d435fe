package event

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// jsonLog is what encoding/json makes of b: the reference decodeLogFast must agree with.
func jsonLog(b []byte) (Log, error) {
	var m Log
	err := json.Unmarshal(b, &m)
	return m, err
}

func logSeeds(t testing.TB) [][]byte {
	ts := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC)
	var seeds [][]byte
	for _, l := range []Log{
		{V: Version, Kind: KindReading, SensorID: "lock-1", Data: 1, Time: ts, ReceivedTime: ts.Add(time.Second), MessageID: "m-1", Origin: "s3ss10n/42"},
		{V: Version, Kind: KindReading, SensorID: "x", Data: 0, Time: ts, ReceivedTime: ts},
		{V: Version, Kind: KindReading, SensorID: "stranger", Data: 1, Time: ts, ReceivedTime: ts, Untracked: true},
		{V: Version, Kind: KindLivenessTimeout, SensorID: "lock_2", ReceivedTime: ts, LostAfter: time.Hour},
	} {
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	return seeds
}

func TestDecodeLogFast(t *testing.T) {
	for _, b := range logSeeds(t) {
		got, ok := decodeLogFast(b)
		want, err := jsonLog(b)
		if !ok || err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: fast %+v (ok %v), json %+v (%v)", b, got, ok, want, err)
		}
	}
	// Inputs the fast path must leave to encoding/json, because it would read them otherwise
	// or they are not JSON at all.
	for _, in := range []string{
		`{"V":1}`, // encoding/json matches keys without regard to case
		`{"sensor_id":"a\u0062"}`,
		`{"v":1.0}`, `{"v":1e0}`, `{"v":01}`, `{"v":-1}`, `{"data":256}`, `{"data":null}`,
		`{"time":"2026-11-22T10:00:00Z","extra":1}`,
		`{"sensor_id":"` + "\xff" + `"}`,
		`{"v":1}x`, `{"v":1,}`, `{"v" 1}`, `[1]`, ``, `{"v":99999999999999999999999}`,
		`{"time":"2026-11-22 10:00:00"}`,
		`{"untracked":1}`, `{"untracked":tru}`, `{"untracked":"true"}`,
	} {
		if got, ok := decodeLogFast([]byte(in)); ok {
			t.Errorf("%q: the fast path accepted it as %+v; it must fall back", in, got)
		}
	}
	for _, in := range []string{` { "v" : 1 , "data" : 0 } `, `{}`, `{"v":1,"v":2}`, `{"lost_after":9223372036854775807}`, `{"untracked":false}`} {
		got, ok := decodeLogFast([]byte(in))
		want, err := jsonLog([]byte(in))
		if !ok || err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%q: fast %+v (ok %v), json %+v (%v)", in, got, ok, want, err)
		}
	}
}

func TestDecodeLogFastTimes(t *testing.T) {
	for _, ts := range []string{
		"2026-11-22T10:00:00Z", "2026-11-22T10:00:00.1Z", "2026-11-22T10:00:00.123456789Z",
		"2026-11-22T10:00:00.1234567891Z", "2024-02-29T23:59:59Z", "2026-02-29T00:00:00Z",
		"2026-11-31T00:00:00Z", "2026-11-22T24:00:00Z", "2026-11-22T10:60:00Z", "2026-11-22T10:00:60Z",
		"2026-11-22T10:00:00.Z", "2026-11-22T10:00:00,5Z", "2026-11-22T10:00:00+01:00", "0000-01-01T00:00:00Z",
		"2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "2026-11-00T00:00:00Z", "2026-1a-01T00:00:00Z",
	} {
		in := []byte(`{"v":1,"time":"` + ts + `"}`)
		got, ok := decodeLogFast(in)
		want, err := jsonLog(in)
		switch {
		case ok && err != nil:
			t.Errorf("%s: fast path accepted %v, encoding/json refused: %v", ts, got.Time, err)
		case ok && !reflect.DeepEqual(got, want):
			t.Errorf("%s: fast %v, json %v", ts, got.Time, want.Time)
		case !ok && err == nil && len(ts) == 20:
			t.Errorf("%s: the plain form should take the fast path", ts)
		}
	}
}

// FuzzDecodeLogFast: whatever the fast path accepts, encoding/json reads the same way.
func FuzzDecodeLogFast(f *testing.F) {
	for _, b := range logSeeds(f) {
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"data":255,"lost_after":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeLogFast(b)
		if !ok {
			return
		}
		want, err := jsonLog(b)
		if err != nil {
			t.Fatalf("%q: fast path accepted %+v, encoding/json refused it: %v", b, got, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: fast %+v, json %+v", b, got, want)
		}
	})
}

// BenchmarkDecodeLog decodes a reading's envelope 100,000 times per iteration (the bench task
// runs one iteration), by DecodeLog and by encoding/json.
func BenchmarkDecodeLog(b *testing.B) {
	in := logSeeds(b)[0]
	const n = 100_000
	for _, c := range []struct {
		name   string
		decode func([]byte) (Log, error)
	}{{"fast", DecodeLog}, {"encoding-json", jsonLog}} {
		b.Run(c.name, func(b *testing.B) {
			start := time.Now()
			for range b.N {
				for range n {
					if _, err := c.decode(in); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(n*b.N), "ns/decode")
		})
	}
}
