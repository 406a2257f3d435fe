package bridge

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzScanReading: whatever scanReading takes, encoding/json takes too, with the same
// tokens for the three fields (a missing one nil in both).
func FuzzScanReading(f *testing.F) {
	for _, s := range []string{
		`{"sensor_id": "xa7v9Dfadr7H", "data": 1, "ts": "2026-11-22T10:00:00.123Z"}`,
		`{"sensor_id":"0xA","data":0}`, `{"sensor_id":"TestSensor","data":1.0,"ts":null}`,
		`{"sensor_id":"0123456789aBcDeF","data":1e0,"x":{}}`, `{"sensor_id":"s","data":"1"}`,
		`{"sensor_id":"s","data":-0.0e-7}`, `[]`, `null`, `{`, `{}`, ` {"data":01}`, `{"data":1,"data":0}`,
		`{"Sensor_ID":"a","data":1}`, `{"sensor_id":"a\"b","data":1}`, "{\"ts\":nul}", `{"data":1}x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := scanReading(body)
		if !ok {
			return
		}
		var want rawReading
		if err := json.Unmarshal(body, &want); err != nil {
			t.Fatalf("scanReading took %q, encoding/json refuses it: %v", body, err)
		}
		for _, f := range []struct {
			name      string
			got, want []byte
		}{{"sensor_id", got.SensorID, want.SensorID}, {"data", got.Data, want.Data}, {"ts", got.TS, want.TS}} {
			if !bytes.Equal(f.got, f.want) || (f.got == nil) != (f.want == nil) {
				t.Fatalf("%q: %s is %q, encoding/json has %q", body, f.name, f.got, f.want)
			}
		}
	})
}

// TestScanReadingTakesSensorBodies: the bodies sensors send take the fast path.
func TestScanReadingTakesSensorBodies(t *testing.T) {
	for _, s := range []string{
		`{"sensor_id":"xa7v9Dfadr7H","data":1,"ts":"2026-11-22T10:00:00.123Z"}`,
		`{ "data": 0, "sensor_id": "0xA" }`, `{"sensor_id":"s","data":1,"ts":null}`,
	} {
		if _, ok := scanReading([]byte(s)); !ok {
			t.Errorf("%s: not taken", s)
		}
	}
}
