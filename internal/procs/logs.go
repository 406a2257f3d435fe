package procs

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// LogRecord is one warning or error in LOGS, as JSON.
type LogRecord struct {
	Time    time.Time      `json:"time"`
	Level   string         `json:"level"`
	Msg     string         `json:"msg"`
	Process string         `json:"process"`
	Part    string         `json:"part,omitempty"`
	Attrs   map[string]any `json:"attrs,omitempty"`
}

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
	ch      chan LogRecord
	dropped *prometheus.CounterVec
}

// NewLogTee is the tee of process id; buffer <= 0 is LogBufferDefault.
func NewLogTee(process string, buffer int) *LogTee {
	if buffer <= 0 {
		buffer = LogBufferDefault
	}
	return &LogTee{process: process, ch: make(chan LogRecord, buffer),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_logs_dropped_total",
			Help: "Warnings and errors not sent to the LOGS stream (buffer full while NATS was slow or away, or the append failed); they are still in the process's own log.",
		}, []string{"reason"})}
}

// Collectors are the tee's metrics, for the process's registry.
func (t *LogTee) Collectors() []prometheus.Collector { return []prometheus.Collector{t.dropped} }

// Handler wraps inner: every record goes to inner as before, and WARN+ also to the tee.
func (t *LogTee) Handler(inner slog.Handler) slog.Handler { return &teeHandler{inner: inner, tee: t} }

func (t *LogTee) offer(r LogRecord) {
	select {
	case t.ch <- r:
	default:
		t.dropped.WithLabelValues("buffer_full").Inc()
	}
}

// Run appends the buffered records to LOGS until ctx ends, then what is left within a second.
func (t *LogTee) Run(ctx context.Context, js jetstream.JetStream) error {
	subject := natsx.LogsSubject(t.process)
	send := func(ctx context.Context, r LogRecord) {
		b, err := json.Marshal(r)
		if err == nil && len(b) > maxRecord {
			r.Attrs = map[string]any{"truncated": fmt.Sprintf("attributes of %d bytes cut", len(b))}
			b, err = json.Marshal(r)
		}
		if err != nil {
			t.dropped.WithLabelValues("encode").Inc()
			return
		}
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

// teeHandler is the slog.Handler of LogTee.Handler; attrs and groups given to With are kept
// so that a record in LOGS carries its part ("part" attribute) and context.
type teeHandler struct {
	inner  slog.Handler
	tee    *LogTee
	attrs  []slog.Attr // with their group prefix applied
	prefix string
}

func (h *teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.inner.Enabled(ctx, l)
}

func (h *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var err error
	if h.inner.Enabled(ctx, r.Level) {
		err = h.inner.Handle(ctx, r)
	}
	if r.Level < slog.LevelWarn {
		return err
	}
	rec := LogRecord{Time: r.Time.UTC(), Level: r.Level.String(), Msg: r.Message, Process: h.tee.process,
		Attrs: map[string]any{}}
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		a.Value = a.Value.Resolve()
		if a.Value.Kind() == slog.KindGroup {
			p := prefix
			if a.Key != "" {
				p += a.Key + "."
			}
			for _, g := range a.Value.Group() {
				add(p, g)
			}
			return
		}
		if a.Key == "" {
			return
		}
		if prefix == "" && a.Key == "part" {
			rec.Part = a.Value.String()
			return
		}
		switch a.Value.Kind() {
		case slog.KindAny:
			if e, ok := a.Value.Any().(error); ok {
				rec.Attrs[prefix+a.Key] = e.Error()
				return
			}
			rec.Attrs[prefix+a.Key] = fmt.Sprint(a.Value.Any())
		case slog.KindDuration, slog.KindTime:
			rec.Attrs[prefix+a.Key] = a.Value.String()
		default:
			rec.Attrs[prefix+a.Key] = a.Value.Any()
		}
	}
	for _, a := range h.attrs {
		add("", a)
	}
	r.Attrs(func(a slog.Attr) bool { add(h.prefix, a); return true })
	if len(rec.Attrs) == 0 {
		rec.Attrs = nil
	}
	h.tee.offer(rec)
	return err
}

func (h *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	n.inner = h.inner.WithAttrs(as)
	n.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		if h.prefix != "" {
			a.Key = h.prefix + a.Key
		}
		n.attrs = append(n.attrs, a)
	}
	return &n
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.inner = h.inner.WithGroup(name)
	n.prefix = h.prefix + name + "."
	return &n
}
