package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// syncBuffer is a process's stderr, read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The NATS store of `locks run` is deleted while Postgres is kept: the new READINGS stream
// starts again at sequence 1, below the state projector's checkpoint. The partition with a
// checkpoint refuses loudly (one log line with the way out, /readyz 503 naming it, the
// metric at 1) and applies nothing, skips nothing; the other partition goes on. A plain
// replay refuses too, naming the way out; `locks replay --projection=state --rebase` is that
// way out, after which the new readings are applied on top of the kept state and their
// events published with the next revisions.
func TestStoreLostStateRefusesThenRebases(t *testing.T) {
	t.Parallel()
	pgURL, pg := testenv.Postgres(t)
	dataDir, listen, httpAddr := t.TempDir(), testenv.FreeAddr(t), testenv.FreeAddr(t)
	env := []string{"LOCKS_POSTGRES_URL=" + pgURL, "LOCKS_PARTITIONS=2", "LOCKS_DATA_DIR=" + dataDir,
		"LOCKS_NATS_LISTEN=" + listen, "LOCKS_HTTP_ADDR=" + httpAddr, "LOCKS_LOG_LEVEL=info"}
	getenv := func(k string) string {
		for _, e := range env {
			if name, v, _ := strings.Cut(e, "="); name == k {
				return v
			}
		}
		return ""
	}
	sensorIn := func(p int) string {
		for i := 0; ; i++ {
			if id := fmt.Sprintf("door%d", i); partition.Of(id, 2) == p {
				return id
			}
		}
	}
	a, c := sensorIn(0), sensorIn(1) // a reports before and after the loss, c only after
	start := func() (*syncBuffer, func()) {
		t.Helper()
		cmd := locksCmd(t, env, "run", "--targets=state")
		stderr := &syncBuffer{}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("locks run: %v; log:\n%s", err, stderr)
				}
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				t.Errorf("locks run did not stop within 20 s; log:\n%s", stderr)
			}
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		testenv.Eventually(t, 60*time.Second, "/readyz answering", func() bool {
			resp, err := http.Get("http://" + httpAddr + "/readyz")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil
		})
		return stderr, stop
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	publish := func(js jetstream.JetStream, id string, data ...uint8) {
		t.Helper()
		for _, d := range data {
			at = at.Add(time.Millisecond)
			b, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: d, Time: at, ReceivedTime: at})
			if _, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: natsx.ReadingsSubject(id), Data: b}); err != nil {
				t.Fatal(err)
			}
		}
	}
	row := func(id string) (data int, rev int64) {
		if err := pg.QueryRow(t.Context(), `SELECT data, revision FROM sensor_state WHERE sensor_id = $1`, id).Scan(&data, &rev); err != nil {
			return -1, -1
		}
		return data, rev
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	metric := func(body, series string) string {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return m[1]
	}
	mismatch := func(p string) string {
		_, body := get("/metrics")
		return metric(body, `locks_checkpoint_mismatch{partition="`+p+`",projection="state"}`)
	}

	// The first store: a's ten readings 1,0,1,… are applied (revision 10, checkpoint 10).
	_, stop := start()
	js := embeddedJS(t, dataDir, listen, "test-1")
	publish(js, a, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0)
	// One statement (one snapshot): read apart, an empty outbox could be seen before the
	// batch that fills it commits, and its events then reach the second store.
	testenv.Eventually(t, 30*time.Second, "a applied and its events relayed", func() bool {
		var rev int64
		var outbox int
		err := pg.QueryRow(t.Context(), `SELECT coalesce((SELECT revision FROM sensor_state WHERE sensor_id = $1), -1), (SELECT count(*) FROM outbox)`, a).
			Scan(&rev, &outbox)
		return err == nil && rev == 10 && outbox == 0
	})
	stop()

	// The store is lost; Postgres is kept.
	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	log, stop := start()
	defer stop()
	js = embeddedJS(t, dataDir, listen, "test-2")
	publish(js, a, 1, 1, 0, 1) // sequences 1-4 of the new stream, all below a's checkpoint
	publish(js, c, 1, 0)

	testenv.Eventually(t, 30*time.Second, "/readyz 503 naming partition 0 and the way out", func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "state projection refuses partition(s) 0:") &&
			strings.Contains(body, "--rebase")
	})
	testenv.Eventually(t, 30*time.Second, "c applied: the other partition goes on", func() bool { _, rev := row(c); return rev == 2 })
	if got := mismatch("0"); got != "1" {
		t.Errorf("locks_checkpoint_mismatch of partition 0 = %q, want 1", got)
	}
	if got := mismatch("1"); got != "0" {
		t.Errorf("locks_checkpoint_mismatch of partition 1 = %q, want 0", got)
	}
	if data, rev := row(a); data != 0 || rev != 10 {
		t.Errorf("a while refused: data %d revision %d, want the kept 0 and 10", data, rev)
	}
	_, metrics := get("/metrics")
	if got := metric(metrics, `locks_state_skipped_total{reason="already_applied"}`); got != "" && got != "0" {
		t.Errorf("%s readings skipped as already applied", got)
	}
	stopped := regexp.MustCompile(`(?m)^.*partition stopped: its checkpoint does not belong to the READINGS stream.*$`).FindAllString(log.String(), -1)
	if len(stopped) != 1 || !strings.Contains(stopped[0], "projection=state partition=0") ||
		!strings.Contains(stopped[0], "locks replay --projection=state --rebase") || !strings.Contains(stopped[0], "restore the NATS store") {
		t.Errorf("want one log line naming the projection, partition 0 and the way out; got %q", stopped)
	}

	// A rebuild cannot follow checkpoints of another stream: it says so instead of waiting.
	var out, errOut bytes.Buffer
	if code := run([]string{"replay", "--projection=state"}, getenv, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "--rebase") {
		t.Fatalf("locks replay --projection=state: exit %d, want 1 naming --rebase:\n%s", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"replay", "--projection=state", "--rebase"}, getenv, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "partitions=[0]") {
		t.Fatalf("locks replay --rebase: exit %d, want 0 rebasing partition 0:\n%s", code, errOut.String())
	}

	// a's readings 1,1,0,1 on top of 0 at revision 10: changes to 1, 0, 1 (revisions 11-13).
	testenv.Eventually(t, 30*time.Second, "a's new readings applied", func() bool { data, rev := row(a); return data == 1 && rev == 13 })
	testenv.Eventually(t, 30*time.Second, "/readyz 200", func() bool { code, _ := get("/readyz"); return code == http.StatusOK })
	if got := mismatch("0"); got != "0" {
		t.Errorf("locks_checkpoint_mismatch of partition 0 after the rebase = %q, want 0", got)
	}
	var revs []int64
	defer func() {
		if t.Failed() {
			t.Logf("a's events in EVENTS: revisions %v; log:\n%s", revs, log)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "a's events 11-13 in EVENTS", func() bool {
		st, err := js.Stream(t.Context(), natsx.EventsStream)
		if err != nil {
			return false
		}
		revs = revs[:0]
		for seq := uint64(1); ; seq++ {
			m, err := st.GetMsg(t.Context(), seq)
			if err != nil {
				break
			}
			if ev, err := event.DecodeEvent(m.Data); err == nil && ev.SensorID == a {
				revs = append(revs, ev.Revision)
			}
		}
		return fmt.Sprint(revs) == "[11 12 13]"
	})
}
