package procs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/logfmt"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/procs"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func declare(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if err := natsx.Declare(t.Context(), js, natsx.StreamsConfig{Partitions: 2, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
}

func TestNewIDIsAKey(t *testing.T) {
	t.Parallel()
	id := procs.NewID("web.example.com:1", 42)
	if !regexpOK(id) || id[:len("web_example_com_1-42-")] != "web_example_com_1-42-" || len(id) != len("web_example_com_1-42-")+8 {
		t.Fatalf("NewID = %q", id)
	}
	if procs.NewID("h", 1) == procs.NewID("h", 1) {
		t.Fatal("two ids of the same host and pid are equal")
	}
}

func regexpOK(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// A process's key appears with its parts, is refreshed every interval, and is deleted (a
// delete marker, not a stale key) when Run stops.
func TestRegistryAppearsRefreshesAndDisappears(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	declare(t, n.JS)
	id := procs.NewID("test-host", os.Getpid())
	r, err := procs.New(procs.Config{ID: id, Parts: []string{"api", "state"}, Version: "v-test",
		HTTPAddr: "127.0.0.1:1", Interval: 100 * time.Millisecond}, procs.Deps{Logger: testenv.Logger(t), JS: n.JS})
	if err != nil {
		t.Fatal(err)
	}
	stop := testenv.RunPart(t, "registry", r.Run, 5*time.Second)

	var first procs.Info
	testenv.Eventually(t, 5*time.Second, "the process in the registry", func() bool {
		l, err := procs.List(t.Context(), n.JS)
		if err != nil || len(l) != 1 {
			return false
		}
		first = l[0]
		return true
	})
	if first.ID != id || first.PID != os.Getpid() || !slices.Equal(first.Parts, []string{"api", "state"}) ||
		first.Version != "v-test" || first.HTTPAddr != "127.0.0.1:1" || first.StartedAt.IsZero() || first.Stale(time.Now()) {
		t.Fatalf("entry = %+v", first)
	}
	// The value is the shared JSON format other parts read.
	kv, err := n.JS.KeyValue(t.Context(), natsx.ProcessesBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(e.Value(), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "host", "pid", "parts", "version", "started_at", "updated_at", "http_addr"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("value lacks %q: %s", k, e.Value())
		}
	}
	testenv.Eventually(t, 5*time.Second, "a refresh", func() bool {
		l, err := procs.List(t.Context(), n.JS)
		return err == nil && len(l) == 1 && l[0].UpdatedAt.After(first.UpdatedAt) && l[0].StartedAt.Equal(first.StartedAt)
	})

	stop()
	l, err := procs.List(t.Context(), n.JS)
	if err != nil || len(l) != 0 {
		t.Fatalf("after a clean stop: %v, %v", l, err)
	}
	if _, err := kv.Get(t.Context(), id); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("key after stop: %v", err)
	}
}

// WARN+ records reach LOGS with their process, part and attributes; INFO does not; the
// inner handler still gets everything it is enabled for.
func TestLogTeeSendsWarningsToLOGS(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	declare(t, n.JS)
	tee := procs.NewLogTee("proc-1", 0)
	inner, buf := testenv.CaptureLogger()
	log := slog.New(tee.Handler(inner.Handler())).With("part", "state")
	testenv.RunPart(t, "tee", func(ctx context.Context) error { return tee.Run(ctx, n.JS) }, 5*time.Second)

	log.Info("just info")
	log.WithGroup("g").Warn("careful", "partition", 3, "err", errors.New("boom"))
	log.Error("broken", "took", 2*time.Second)

	var got []procs.LogRecord
	testenv.Eventually(t, 5*time.Second, "two records in LOGS", func() bool {
		got, _ = procs.LastLogs(t.Context(), n.JS, 500)
		return len(got) == 2
	})
	w, e := got[0], got[1]
	if w.Msg != "careful" || w.Level != "WARN" || w.Process != "proc-1" || w.Part != "state" ||
		w.Attrs["g.partition"] != float64(3) || w.Attrs["g.err"] != "boom" {
		t.Errorf("warning = %+v", w)
	}
	if e.Msg != "broken" || e.Level != "ERROR" || e.Attrs["took"] != "2s" {
		t.Errorf("error = %+v", e)
	}
	if s := buf.String(); !strings.Contains(s, "just info") || !strings.Contains(s, "careful") || !strings.Contains(s, "broken") {
		t.Errorf("inner handler lost records: %s", s)
	}
}

// LastLogs returns the newest n, oldest first.
func TestLastLogsNewestN(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	declare(t, n.JS)
	for i := range 30 {
		b, _ := json.Marshal(procs.LogRecord{Msg: fmt.Sprint(i), Level: "WARN", Process: "p"})
		if _, err := n.JS.Publish(t.Context(), natsx.LogsSubject("p"), b); err != nil {
			t.Fatal(err)
		}
	}
	got, err := procs.LastLogs(t.Context(), n.JS, 10)
	if err != nil || len(got) != 10 || got[0].Msg != "20" || got[9].Msg != "29" {
		t.Fatalf("LastLogs = %v, %v", got, err)
	}
}

// With NATS down, a burst of warnings far beyond the buffer neither blocks the logger nor
// crashes: the overflow is counted, and once NATS is back new warnings arrive again.
func TestLogTeeBurstWhileNATSDown(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	declare(t, n.JS)
	js := testenv.JetStream(t, n.URL, "tee")
	tee := procs.NewLogTee("proc-2", 50)
	inner, _ := testenv.CaptureLogger()
	log := slog.New(tee.Handler(inner.Handler()))
	testenv.RunPart(t, "tee", func(ctx context.Context) error { return tee.Run(ctx, js) }, 5*time.Second)

	n.Server.Shutdown()
	n.Server.WaitForShutdown()
	done := make(chan struct{})
	go func() {
		for i := range 20000 {
			log.Warn("NATS is away", "i", i)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("20,000 warnings did not return within 30 s: the logger blocks on NATS")
	}
	if d := dropped(t, tee, "buffer_full"); d < 20000-50-10 {
		t.Errorf("dropped (buffer_full) = %v of 20,000 warnings with a buffer of 50", d)
	}
	n.Restart(0)
	testenv.Eventually(t, 20*time.Second, "a warning after NATS is back", func() bool {
		log.Warn("back")
		got, _ := procs.LastLogs(t.Context(), n.JS, 5)
		return len(got) > 0 && got[len(got)-1].Msg == "back"
	})
}

func dropped(t *testing.T, tee *procs.LogTee, reason string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(tee.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// Issue 25, item 6: a process's key carries its part (natsx.ProcessKey), and List shows an
// entry only when its key may say what its value says: a part's key speaks for a process of
// that part alone, with the key's id; "all" keys and bare ids come from a user allowed
// everything. So a part whose user writes its own keys cannot list a process of another part.
func TestListSkipsEntriesTheirKeyDoesNotVouchFor(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	declare(t, n.JS)
	r, err := procs.New(procs.Config{ID: "h-1-aaaa", Part: "state", Parts: []string{"state"}, Version: "v",
		Interval: time.Hour}, procs.Deps{Logger: testenv.Logger(t), JS: n.JS})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "registry", r.Run, 5*time.Second)
	kv, err := n.JS.KeyValue(t.Context(), natsx.ProcessesBucket)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the state process's key", func() bool {
		_, err := kv.Get(t.Context(), natsx.ProcessKey("state", "h-1-aaaa"))
		return err == nil
	})
	put := func(key string, i procs.Info) {
		b, _ := json.Marshal(i)
		if _, err := kv.Put(t.Context(), key, b); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	put(natsx.ProcessKey("state", "h-2-bbbb"), procs.Info{ID: "h-2-bbbb", Parts: []string{"notifier"}, UpdatedAt: now})     // another part
	put(natsx.ProcessKey("state", "h-3-cccc"), procs.Info{ID: "h-9-9999", Parts: []string{"state"}, UpdatedAt: now})        // another id
	put(natsx.ProcessKey("state", "h-4-dddd"), procs.Info{ID: "h-4-dddd", Parts: []string{"state", "api"}, UpdatedAt: now}) // more parts
	put(natsx.ProcessKey(natsx.ProcessAll, "h-5-eeee"), procs.Info{ID: "h-5-eeee", Parts: []string{"api", "state"}, UpdatedAt: now})
	l, err := procs.List(t.Context(), n.JS)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range l {
		ids = append(ids, i.ID)
	}
	if !slices.Equal(ids, []string{"h-1-aaaa", "h-5-eeee"}) {
		t.Fatalf("listed %v, want the state process and the all process only", ids)
	}
}

// A warning in LOGS is the very JSON line LOCKS_LOG_FORMAT=json writes on stderr (slog's
// standard keys, attributes at the top level, the trace and span ids inside a span), plus
// "process"; and LastLogs reads it back into its fields. (Groups: TestLogTeeSendsWarningsToLOGS.)
func TestLogTeeRecordIsTheJSONLogLine(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	declare(t, n.JS)
	tee := procs.NewLogTee("proc-3", 0)
	var stderr testenv.LogBuffer
	h, err := logfmt.NewHandler(&stderr, logfmt.JSON, slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(logfmt.WithTrace(tee.Handler(h))).With("part", "notifier")
	testenv.RunPart(t, "tee", func(ctx context.Context) error { return tee.Run(ctx, n.JS) }, 5*time.Second)

	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled})
	log.WarnContext(trace.ContextWithSpanContext(t.Context(), sc), "webhook failed", "status", 503, "took", 1500*time.Millisecond, "err", errors.New("bad gateway"))

	s, err := n.JS.Stream(t.Context(), natsx.LogsStream)
	if err != nil {
		t.Fatal(err)
	}
	var raw *jetstream.RawStreamMsg
	testenv.Eventually(t, 5*time.Second, "the warning in LOGS", func() bool {
		raw, err = s.GetLastMsgForSubject(t.Context(), natsx.LogsSubject("proc-3"))
		return err == nil
	})
	var inLOGS, onStderr map[string]any
	if err := json.Unmarshal(raw.Data, &inLOGS); err != nil {
		t.Fatalf("LOGS record %s: %v", raw.Data, err)
	}
	if err := json.Unmarshal([]byte(stderr.String()), &onStderr); err != nil {
		t.Fatalf("stderr line %q: %v", stderr.String(), err)
	}
	if inLOGS["process"] != "proc-3" {
		t.Errorf("LOGS record without its process: %s", raw.Data)
	}
	delete(inLOGS, "process")
	want := map[string]any{"level": "WARN", "msg": "webhook failed", "part": "notifier",
		"status": float64(503), "took": "1.5s", "err": "bad gateway",
		"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()}
	for k, v := range want {
		if fmt.Sprint(onStderr[k]) != fmt.Sprint(v) {
			t.Errorf("stderr %s = %v, want %v (line %s)", k, onStderr[k], v, stderr.String())
		}
	}
	if fmt.Sprint(inLOGS) != fmt.Sprint(onStderr) {
		t.Errorf("LOGS record and JSON log line differ:\n LOGS   %s\n stderr %s", raw.Data, stderr.String())
	}
	got, err := procs.LastLogs(t.Context(), n.JS, 1)
	if err != nil || len(got) != 1 {
		t.Fatalf("LastLogs = %v, %v", got, err)
	}
	r := got[0]
	if r.Msg != "webhook failed" || r.Level != "WARN" || r.Process != "proc-3" || r.Part != "notifier" || r.Time.IsZero() ||
		r.Attrs["status"] != float64(503) || r.Attrs["took"] != "1.5s" || r.Attrs["trace_id"] != sc.TraceID().String() || len(r.Attrs) != 5 {
		t.Errorf("LastLogs read %+v", r)
	}
}

// A record far over LOGS' size keeps its standard keys and says it was cut.
func TestLogTeeCutsAHugeRecord(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	declare(t, n.JS)
	tee := procs.NewLogTee("proc-4", 0)
	log := slog.New(tee.Handler(slog.DiscardHandler))
	testenv.RunPart(t, "tee", func(ctx context.Context) error { return tee.Run(ctx, n.JS) }, 5*time.Second)
	log.Error("huge", "body", strings.Repeat("x", 64<<10))
	var got []procs.LogRecord
	testenv.Eventually(t, 5*time.Second, "the record in LOGS", func() bool {
		got, _ = procs.LastLogs(t.Context(), n.JS, 1)
		return len(got) == 1
	})
	if r := got[0]; r.Msg != "huge" || r.Level != "ERROR" || r.Process != "proc-4" || r.Attrs["body"] != nil || r.Attrs["truncated"] == nil {
		t.Errorf("cut record = %+v", r)
	}
}
