// Package logfmt is the shape of a process's log records: text for people, or JSON with
// slog's standard keys (time, level, msg, then the attributes) for log pipelines. The LOGS
// stream the dashboard reads carries the same JSON (internal/procs), so a record looks the
// same wherever it is read.
package logfmt

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// The values of LOCKS_LOG_FORMAT.
const (
	Text = "text"
	JSON = "json"
)

// ErrFormat is a format other than Text or JSON.
var ErrFormat = errors.New("log format must be text or json")

// Options are the handler options of every record the process writes, on stderr or to LOGS.
func Options(level slog.Leveler) *slog.HandlerOptions {
	return &slog.HandlerOptions{Level: level, ReplaceAttr: replace}
}

// replace writes durations as Go durations ("1.5s"), in JSON too: slog's JSON handler
// would write nanoseconds, which a person reading the dashboard or a log search cannot read
// at a glance; text already writes them so.
func replace(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// NewHandler is the handler for format (Text or JSON, case-insensitive) writing to w.
func NewHandler(w io.Writer, format string, level slog.Leveler) (slog.Handler, error) {
	switch strings.ToLower(format) {
	case Text, "":
		return slog.NewTextHandler(w, Options(level)), nil
	case JSON:
		return slog.NewJSONHandler(w, Options(level)), nil
	}
	return nil, ErrFormat
}

// WithTrace adds trace_id and span_id to every record made with a context inside a span
// (slog's *Context calls), so a log search finds the trace and the trace the log lines.
// Wrap the outermost handler (after the LOGS tee), so that LOGS gets the ids too.
func WithTrace(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
