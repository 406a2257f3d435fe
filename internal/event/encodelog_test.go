package event

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func FuzzMarshalLog(f *testing.F) {
	ts := time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC).UnixNano()
	f.Add(Version, KindReading, "lock-1", uint8(1), ts, ts+1e9, "m-1", "s3ss10n/42", int64(0), true)
	f.Add(Version, KindReading, "x", uint8(0), ts, ts, "", "", int64(0), true)
	f.Add(Version, KindLivenessTimeout, "lock_2", uint8(0), int64(0), ts, "", "", int64(time.Hour), true)
	f.Add(2, "<&>", "é\u2028\"\\\x01", uint8(255), int64(-1), ts, "\xff", "a b", int64(-5), false)
	f.Add(1, "reading", "s", uint8(1), ts+7999, ts-1999, "", "", int64(0), true) // years 9999+ and below 0 by the shift
	f.Fuzz(func(t *testing.T, v int, kind, sensor string, data uint8, t1, t2 int64, msgID, origin string, lostAfter int64, utc bool) {
		loc := time.UTC
		if !utc {
			loc = time.FixedZone("x", 3600+30)
		}
		// Years beyond RFC 3339 (and beyond what UnixNano spans) by a shift in years.
		tm := time.Unix(0, t1).In(loc).AddDate(int(t1%20000), 0, 0)
		m := Log{V: v, Kind: kind, SensorID: sensor, Data: data, Time: tm, ReceivedTime: time.Unix(0, t2).In(loc),
			MessageID: msgID, Origin: origin, LostAfter: time.Duration(lostAfter), Untracked: data == 1 && !utc}
		got, gerr := MarshalLog(m)
		want, werr := json.Marshal(m)
		if (gerr == nil) != (werr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("MarshalLog(%+v) = %s, %v; json.Marshal = %s, %v", m, got, gerr, want, werr)
		}
	})
}
