package procs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/logfmt"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// LogBufferDefault is how many records wait for NATS before new ones are dropped.
const LogBufferDefault = 1000

// publishTimeout bounds one append to LOGS, so that a NATS outage fills the buffer (and
// drops, counted) instead of holding records forever.
const publishTimeout = 2 * time.Second

// maxRecord keeps a record within LOGS' message size; attrs beyond it are cut.
const maxRecord = 8 << 10

// LogTee sends the WARN+ records of a logger to LOGS. Logging never waits for it: a record
// goes into a bounded buffer, or is dropped and counted when the buffer is full.
type LogTee struct {
	process string
	ch      chan []byte
	dropped *prometheus.CounterVec
}

// NewLogTee is the tee of process id; buffer <= 0 is LogBufferDefault.
func NewLogTee(process string, buffer int) *LogTee {
	if buffer <= 0 {
		buffer = LogBufferDefault
	}
	return &LogTee{process: process, ch: make(chan []byte, buffer),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_logs_dropped_total",
			Help: "Warnings and errors not sent to the LOGS stream (buffer full while NATS was slow or away, or the append failed); they are still in the process's own log.",
		}, []string{"reason"})}
}

// Collectors are the tee's metrics, for the process's registry.
func (t *LogTee) Collectors() []prometheus.Collector { return []prometheus.Collector{t.dropped} }

// Handler wraps inner: every record goes to inner as before, and WARN+ also to the tee.
func (t *LogTee) Handler(inner slog.Handler) slog.Handler {
	j := slog.NewJSONHandler(teeWriter{t}, logfmt.Options(slog.LevelWarn)).
		WithAttrs([]slog.Attr{slog.String("process", t.process)})
	return &teeHandler{inner: inner, json: j, tee: t}
}

func (t *LogTee) offer(r []byte) {
	select {
	case t.ch <- r:
	default:
		t.dropped.WithLabelValues("buffer_full").Inc()
	}
}

// Run appends the buffered records to LOGS until ctx ends, then what is left within a second.
func (t *LogTee) Run(ctx context.Context, js jetstream.JetStream) error {
	subject := natsx.LogsSubject(t.process)
	send := func(ctx context.Context, b []byte) {
		c, cancel := context.WithTimeout(ctx, publishTimeout)
		defer cancel()
		if _, err := js.Publish(c, subject, b); err != nil {
			// Not logged: a log line about failing to ship log lines would feed itself.
			t.dropped.WithLabelValues("publish_failed").Inc()
		}
	}
	for {
		select {
		case r := <-t.ch:
			send(ctx, r)
		case <-ctx.Done():
			flush, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			for {
				select {
				case r := <-t.ch:
					if flush.Err() != nil {
						t.dropped.WithLabelValues("publish_failed").Inc()
						continue
					}
					send(flush, r)
				default:
					return nil
				}
			}
		}
	}
}

// teeHandler is the slog.Handler of LogTee.Handler: every record goes to inner, and WARN+
// also through a JSON handler of the same options as the process's JSON log (with the
// same attributes and groups from With) into the tee.
type teeHandler struct {
	inner slog.Handler
	json  slog.Handler
	tee   *LogTee
}

func (h *teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.inner.Enabled(ctx, l)
}

func (h *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var err error
	if h.inner.Enabled(ctx, r.Level) {
		err = h.inner.Handle(ctx, r)
	}
	if r.Level >= slog.LevelWarn {
		if h.json.Handle(ctx, r) != nil {
			h.tee.dropped.WithLabelValues("encode").Inc()
		}
	}
	return err
}

func (h *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &teeHandler{inner: h.inner.WithAttrs(as), json: h.json.WithAttrs(as), tee: h.tee}
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &teeHandler{inner: h.inner.WithGroup(name), json: h.json.WithGroup(name), tee: h.tee}
}

// teeWriter takes the JSON handler's lines: slog writes each record in one Write, from a
// buffer it reuses, so the line is copied.
type teeWriter struct{ tee *LogTee }

func (w teeWriter) Write(p []byte) (int, error) {
	line := bytes.TrimRight(p, "\n")
	if len(line) > maxRecord {
		line = truncated(line)
	} else {
		line = bytes.Clone(line)
	}
	w.tee.offer(line)
	return len(p), nil
}

// truncated keeps a record's standard keys, process and part, and says how much was cut.
func truncated(line []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(line, &m) != nil {
		m = map[string]json.RawMessage{}
	}
	out := map[string]any{"truncated": fmt.Sprintf("attributes of a %d-byte record cut", len(line))}
	for _, k := range []string{slog.TimeKey, slog.LevelKey, slog.MessageKey, "process", "part"} {
		if v, ok := m[k]; ok && len(v) < maxRecord/4 {
			out[k] = v
		}
	}
	b, _ := json.Marshal(out)
	return b
}
