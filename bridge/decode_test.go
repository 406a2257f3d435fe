package bridge

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

func TestDecode(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 10, 0, 5, 0, time.UTC)
	ts := time.Date(2026, 11, 22, 10, 0, 0, 123_000_000, time.UTC)
	big := `{"sensor_id":"a","data":1,"pad":"` + strings.Repeat("x", MaxBodySize) + `"}`
	exact := `{"sensor_id":"a","data":1,"pad":"`
	exact += strings.Repeat("x", MaxBodySize-len(exact)-2) + `"}`
	tests := []struct {
		name   string
		body   string
		want   Reading // compared when reason == ""
		reason string
		msg    string // the header value, when given
	}{
		{name: "contract example", body: `{"sensor_id": "xa7v9Dfadr7H", "data": 1, "ts": "2026-11-22T10:00:00.123Z"}`,
			want: Reading{SensorID: "xa7v9Dfadr7H", Data: 1, Time: ts, HasTS: true}},
		{name: "id 0xA", body: `{"sensor_id":"0xA","data":0}`, want: Reading{SensorID: "0xA", Data: 0, Time: now}},
		{name: "id TestSensor", body: `{"sensor_id":"TestSensor","data":1}`, want: Reading{SensorID: "TestSensor", Data: 1, Time: now}},
		{name: "id 16 chars", body: `{"sensor_id":"0123456789aBcDeF","data":1}`, want: Reading{SensorID: "0123456789aBcDeF", Data: 1, Time: now}},
		{name: "id 1 char", body: `{"sensor_id":"Z","data":0}`, want: Reading{SensorID: "Z", Time: now}},
		{name: "unknown fields ignored", body: `{"x":[1,{"y":null}],"sensor_id":"s1","data":1,"battery":0.5}`, want: Reading{SensorID: "s1", Data: 1, Time: now}},
		{name: "ts with offset is kept as UTC", body: `{"sensor_id":"s1","data":1,"ts":"2026-11-22T13:00:00.123+03:00"}`, want: Reading{SensorID: "s1", Data: 1, Time: ts, HasTS: true}},
		{name: "ts null means absent", body: `{"sensor_id":"s1","data":1,"ts":null}`, want: Reading{SensorID: "s1", Data: 1, Time: now}},
		{name: "data 1.0", body: `{"sensor_id":"s1","data":1.0}`, want: Reading{SensorID: "s1", Data: 1, Time: now}},
		{name: "data 1e0", body: `{"sensor_id":"s1","data":1e0}`, want: Reading{SensorID: "s1", Data: 1, Time: now}},
		{name: "data 10E-1", body: `{"sensor_id":"s1","data":10E-1}`, want: Reading{SensorID: "s1", Data: 1, Time: now}},
		{name: "data 0.0e5", body: `{"sensor_id":"s1","data":0.0e5}`, want: Reading{SensorID: "s1", Data: 0, Time: now}},
		{name: "data -0", body: `{"sensor_id":"s1","data":-0}`, want: Reading{SensorID: "s1", Data: 0, Time: now}},
		{name: "exactly 4 KiB", body: exact, want: Reading{SensorID: "a", Data: 1, Time: now}},
		{name: "escaped id", body: `{"sensor_id":"\u0041b","data":1}`, want: Reading{SensorID: "Ab", Data: 1, Time: now}},

		{name: "id 17 chars", body: `{"sensor_id":"0123456789aBcDeFx","data":1}`, reason: ReasonSensorID,
			msg: "sensor_id: must be 1-16 ASCII letters or digits"},
		{name: "id empty", body: `{"sensor_id":"","data":1}`, reason: ReasonSensorID},
		{name: "id non-ASCII", body: `{"sensor_id":"dvěř1","data":1}`, reason: ReasonSensorID},
		{name: "id non-ASCII digit", body: `{"sensor_id":"٣","data":1}`, reason: ReasonSensorID},
		{name: "id with dash", body: `{"sensor_id":"a-b","data":1}`, reason: ReasonSensorID},
		{name: "id with dot", body: `{"sensor_id":"a.b","data":1}`, reason: ReasonSensorID},
		{name: "id with space", body: `{"sensor_id":"a b","data":1}`, reason: ReasonSensorID},
		{name: "id number", body: `{"sensor_id":123,"data":1}`, reason: ReasonSensorID},
		{name: "id null", body: `{"sensor_id":null,"data":1}`, reason: ReasonSensorID},
		{name: "id missing", body: `{"data":1}`, reason: ReasonSensorID},
		{name: "data 2", body: `{"sensor_id":"s1","data":2}`, reason: ReasonData, msg: "data: must be the JSON number 0 or 1"},
		{name: "data string", body: `{"sensor_id":"s1","data":"1"}`, reason: ReasonData},
		{name: "data true", body: `{"sensor_id":"s1","data":true}`, reason: ReasonData},
		{name: "data null", body: `{"sensor_id":"s1","data":null}`, reason: ReasonData},
		{name: "data -1", body: `{"sensor_id":"s1","data":-1}`, reason: ReasonData},
		{name: "data 0.5", body: `{"sensor_id":"s1","data":0.5}`, reason: ReasonData},
		{name: "data almost 1", body: `{"sensor_id":"s1","data":0.99999999999999999999}`, reason: ReasonData},
		{name: "data 1e1000000000", body: `{"sensor_id":"s1","data":1e1000000000}`, reason: ReasonData},
		{name: "data 10", body: `{"sensor_id":"s1","data":10}`, reason: ReasonData},
		{name: "data missing", body: `{"sensor_id":"s1"}`, reason: ReasonData},
		{name: "data array", body: `{"sensor_id":"s1","data":[1]}`, reason: ReasonData},
		{name: "ts lower-case t and z", body: `{"sensor_id":"s1","data":1,"ts":"2026-11-22t10:00:00.123z"}`, want: Reading{SensorID: "s1", Data: 1, Time: ts, HasTS: true}},
		{name: "spaces around tokens", body: " \n{ \"sensor_id\" : \"s1\" , \"data\" : 1 , \"ts\" : \"2026-11-22T10:00:00.123Z\" }\n", want: Reading{SensorID: "s1", Data: 1, Time: ts, HasTS: true}},
		{name: "ts comma fraction", body: `{"sensor_id":"s1","data":1,"ts":"2026-11-22T10:00:00,5Z"}`, reason: ReasonTS},
		{name: "ts offset +24:00", body: `{"sensor_id":"s1","data":1,"ts":"2026-11-22T10:00:00+24:00"}`, reason: ReasonTS},
		{name: "ts space separator", body: `{"sensor_id":"s1","data":1,"ts":"2026-11-22 10:00:00Z"}`, reason: ReasonTS},
		{name: "ts empty fraction", body: `{"sensor_id":"s1","data":1,"ts":"2026-11-22T10:00:00.Z"}`, reason: ReasonTS},
		{name: "ts not a time", body: `{"sensor_id":"s1","data":1,"ts":"yesterday"}`, reason: ReasonTS, msg: "ts: must be an RFC 3339 time string"},
		{name: "ts without zone", body: `{"sensor_id":"s1","data":1,"ts":"2026-11-22T10:00:00"}`, reason: ReasonTS},
		{name: "ts number", body: `{"sensor_id":"s1","data":1,"ts":1795000000}`, reason: ReasonTS},
		{name: "ts month 13", body: `{"sensor_id":"s1","data":1,"ts":"2026-13-22T10:00:00Z"}`, reason: ReasonTS},
		{name: "ts beyond 9999 in UTC", body: `{"sensor_id":"s1","data":1,"ts":"9999-12-31T23:59:59-23:00"}`, reason: ReasonTS},
		{name: "4 KiB + 1", body: exact[:len(exact)-2] + `x"}`, reason: ReasonTooBig, msg: "body: larger than 4 KiB"},
		{name: "far too big", body: big, reason: ReasonTooBig},
		{name: "not JSON", body: `sensor_id=s1 data=1`, reason: ReasonNotJSON},
		{name: "empty", body: ``, reason: ReasonNotJSON},
		{name: "array", body: `[{"sensor_id":"s1","data":1}]`, reason: ReasonNotJSON},
		{name: "null", body: `null`, reason: ReasonNotJSON},
		{name: "trailing garbage", body: `{"sensor_id":"s1","data":1} x`, reason: ReasonNotJSON},
		{name: "truncated", body: `{"sensor_id":"s1","data":1`, reason: ReasonNotJSON},
		{name: "invalid UTF-8 in id", body: "{\"sensor_id\":\"a\xffb\",\"data\":1}", reason: ReasonSensorID},
	}
	if len(exact) != MaxBodySize {
		t.Fatalf("test body is %d bytes, want %d", len(exact), MaxBodySize)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Decode([]byte(tt.body), now)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				tt.want.ReceivedTime = now
				if got != tt.want {
					t.Fatalf("Decode = %+v, want %+v", got, tt.want)
				}
				return
			}
			var ie *InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Decode = %+v, %v; want an InvalidError", got, err)
			}
			if ie.Reason != tt.reason {
				t.Fatalf("reason %q (%v), want %q", ie.Reason, err, tt.reason)
			}
			if tt.msg != "" && err.Error() != tt.msg {
				t.Fatalf("message %q, want %q", err.Error(), tt.msg)
			}
			field := map[string]string{ReasonTooBig: "body", ReasonNotJSON: "body"}[tt.reason]
			if field == "" {
				field = tt.reason
			}
			if !strings.HasPrefix(err.Error(), field+": ") {
				t.Fatalf("message %q does not name the field", err.Error())
			}
		})
	}
}

// FuzzDecode: no input panics; an error is always an InvalidError; a valid reading encodes
// back into a body that decodes to the same reading.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"sensor_id": "xa7v9Dfadr7H", "data": 1, "ts": "2026-11-22T10:00:00.123Z"}`,
		`{"sensor_id":"0xA","data":0}`, `{"sensor_id":"TestSensor","data":1.0,"ts":null}`,
		`{"sensor_id":"0123456789aBcDeF","data":1e0,"x":{}}`, `{"sensor_id":"s","data":"1"}`,
		`{"sensor_id":"s","data":-0.0e-7}`, `[]`, `null`, `{`, `{"ts":"9999-12-31T23:59:59-23:00"}`,
	} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := Decode(body, now)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if !event.ValidSensorID(r.SensorID) || r.Data > 1 || !r.ReceivedTime.Equal(now) || (!r.HasTS && !r.Time.Equal(now)) {
			t.Fatalf("invalid output %+v", r)
		}
		again := map[string]any{"sensor_id": r.SensorID, "data": r.Data}
		if r.HasTS {
			again["ts"] = r.Time.Format(time.RFC3339Nano)
		}
		b, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := Decode(b, now)
		if err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", b, err)
		}
		if r2 != r {
			t.Fatalf("re-decoded %+v, want %+v", r2, r)
		}
	})
}
