package event

import (
	"encoding/json"
	"strconv"
	"time"
)

// MarshalLog encodes a READINGS message exactly as json.Marshal does, without reflection:
// the bridge encodes every reading, and encoding/json's reflection was most of that cost.
// What the plain path does not cover (a string to escape, a time not in UTC or out of
// RFC 3339's years) goes to encoding/json (FuzzMarshalLog checks the two agree).
func MarshalLog(m Log) ([]byte, error) {
	if !plainString(m.Kind) || !plainString(m.SensorID) || !plainString(m.MessageID) || !plainString(m.Origin) ||
		!plainTime(m.Time) || !plainTime(m.ReceivedTime) {
		return json.Marshal(m)
	}
	b := make([]byte, 0, 160+len(m.SensorID)+len(m.MessageID)+len(m.Origin))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(m.V), 10)
	b = append(b, `,"kind":"`...)
	b = append(b, m.Kind...)
	b = append(b, `","sensor_id":"`...)
	b = append(b, m.SensorID...)
	b = append(b, `","data":`...)
	b = strconv.AppendUint(b, uint64(m.Data), 10)
	b = append(b, `,"time":"`...)
	b = m.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","received_time":"`...)
	b = m.ReceivedTime.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if m.MessageID != "" {
		b = append(b, `,"message_id":"`...)
		b = append(b, m.MessageID...)
		b = append(b, '"')
	}
	if m.Origin != "" {
		b = append(b, `,"origin":"`...)
		b = append(b, m.Origin...)
		b = append(b, '"')
	}
	if m.LostAfter != 0 {
		b = append(b, `,"lost_after":`...)
		b = strconv.AppendInt(b, int64(m.LostAfter), 10)
	}
	if m.Untracked {
		b = append(b, `,"untracked":true`...)
	}
	return append(b, '}'), nil
}

// plainString: printable ASCII that encoding/json writes as it is (no quote, backslash, or
// the <, > and & it escapes for HTML).
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// plainTime: a UTC time that time.Time.MarshalJSON writes as AppendFormat(RFC3339Nano).
func plainTime(t time.Time) bool {
	return t.Location() == time.UTC && t.Year() >= 0 && t.Year() <= 9999
}
