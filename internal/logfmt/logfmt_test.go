package logfmt_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/logfmt"
)

// Every JSON line parses and carries slog's standard keys; durations read as Go durations;
// the level filters; text stays key=value.
func TestHandlers(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	h, err := logfmt.NewHandler(&b, "JSON", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(h).With("part", "bridge")
	log.Debug("hidden")
	log.Info("appended", "sensor", "x1", "took", 250*time.Millisecond)
	log.WithGroup("g").Error("failed", "err", errors.New("boom"), "n", 3)
	sc := bufio.NewScanner(&b)
	var lines []map[string]any
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		for _, k := range []string{slog.TimeKey, slog.LevelKey, slog.MessageKey} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %q lacks %q", sc.Text(), k)
			}
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 (debug filtered)", len(lines))
	}
	if l := lines[0]; l["msg"] != "appended" || l["level"] != "INFO" || l["part"] != "bridge" || l["took"] != "250ms" {
		t.Errorf("first line = %v", l)
	}
	if g, _ := lines[1]["g"].(map[string]any); g["err"] != "boom" || g["n"] != float64(3) {
		t.Errorf("second line = %v", lines[1])
	}

	b.Reset()
	h, _ = logfmt.NewHandler(&b, logfmt.Text, slog.LevelInfo)
	slog.New(h).Info("appended", "took", time.Second)
	if s := b.String(); !strings.Contains(s, `msg=appended took=1s`) {
		t.Errorf("text line = %q", s)
	}
	if _, err := logfmt.NewHandler(&b, "xml", slog.LevelInfo); !errors.Is(err, logfmt.ErrFormat) {
		t.Errorf("xml: %v", err)
	}
}

// Inside a span a record carries its trace_id and span_id; outside, none.
func TestWithTrace(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	h, _ := logfmt.NewHandler(&b, logfmt.JSON, slog.LevelInfo)
	log := slog.New(logfmt.WithTrace(h)).With("part", "notifier")
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x0a, 0xf7, 1}, SpanID: trace.SpanID{0xb7, 2}, TraceFlags: trace.FlagsSampled})
	log.InfoContext(trace.ContextWithSpanContext(t.Context(), sc), "in a span")
	log.InfoContext(t.Context(), "outside")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	var in, out map[string]any
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &in) != nil || json.Unmarshal([]byte(lines[1]), &out) != nil {
		t.Fatalf("lines %q", lines)
	}
	if in["trace_id"] != sc.TraceID().String() || in["span_id"] != sc.SpanID().String() || in["part"] != "notifier" {
		t.Errorf("in a span: %v", in)
	}
	if _, ok := out["trace_id"]; ok {
		t.Errorf("outside a span: %v", out)
	}
}
