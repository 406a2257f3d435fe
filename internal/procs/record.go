package procs

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"time"
)

// LogRecord is one warning or error in LOGS. In LOGS it is the JSON line of
// LOCKS_LOG_FORMAT=json (internal/logfmt: slog's standard keys time, level, msg, then the
// attributes at the top level) plus "process"; Attrs holds the attributes other than
// "process" and "part", a group's named "group.key".
type LogRecord struct {
	Time    time.Time
	Level   string
	Msg     string
	Process string
	Part    string
	Attrs   map[string]any
}

// MarshalJSON writes r in the shape of LOGS: the standard keys, process and part, then the
// attributes at the top level.
func (r LogRecord) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	put := func(k string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
		return nil
	}
	_ = put(slog.TimeKey, r.Time)
	_ = put(slog.LevelKey, r.Level)
	_ = put(slog.MessageKey, r.Msg)
	_ = put("process", r.Process)
	if r.Part != "" {
		_ = put("part", r.Part)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Attrs)) {
		if err := put(k, r.Attrs[k]); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads a LOGS record: the standard keys, process and part into their fields,
// every other key into Attrs, an object's keys as "key.inner" (a slog group). A record of
// the earlier shape, its attributes under "attrs", reads the same.
func (r *LogRecord) UnmarshalJSON(b []byte) error {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*r = LogRecord{}
	str := func(k string) string {
		s, _ := m[k].(string)
		delete(m, k)
		return s
	}
	if t, err := time.Parse(time.RFC3339Nano, str(slog.TimeKey)); err == nil {
		r.Time = t
	}
	r.Level, r.Msg, r.Process, r.Part = str(slog.LevelKey), str(slog.MessageKey), str("process"), str("part")
	attrs := map[string]any{}
	var add func(prefix string, m map[string]any)
	add = func(prefix string, m map[string]any) {
		for k, v := range m {
			if g, ok := v.(map[string]any); ok {
				add(prefix+k+".", g)
				continue
			}
			attrs[prefix+k] = v
		}
	}
	if old, ok := m["attrs"].(map[string]any); ok {
		delete(m, "attrs")
		add("", old)
	}
	add("", m)
	if len(attrs) > 0 {
		r.Attrs = attrs
	}
	return nil
}
