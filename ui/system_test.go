package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The tests mostly wait on their servers (whole systems: lost_after, auto-disable, webhooks): they
// run side by side, the browser tests in one shared Chromium. Six at once: the four systems'
// tests, and the controls test's two parallel checks beside the three others (its own slot
// is free while they run).
func TestMain(m *testing.M) {
	testenv.Parallel(6)
	code := m.Run()
	closeChromium()
	os.Exit(code)
}

const token = "ui-test-token-0123456789"

// lostAfter is short so that the lost-list test is quick; a sensor is lost this long after
// its last reading.
const lostAfter = 3 * time.Second

// uiRefresh is the panels' reload period (LOCKS_UI_REFRESH): not the default, so that the
// pages show the setting reached them.
const uiRefresh = 2 * time.Second

// disableAfter is short so that the auto-disable test is quick: an endpoint whose attempts
// all failed this long is disabled.
const disableAfter = 3 * time.Second

// system is one whole `locks run` process (every part, embedded NATS) on the local
// PostgreSQL, RabbitMQ and ClickHouse: the dashboard's tests run against the real thing.
type system struct {
	base   string // http://host:port
	rabbit *testenv.RabbitEnv
	log    *testenv.LogBuffer
}

func startSystem(t *testing.T) *system {
	t.Helper()
	bin := testenv.Build(t, "./cmd/locks")
	pgURL := testenv.PostgresURL(t)
	chDB := testenv.Name("locks_ui")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	rabbit := testenv.RabbitMQ(t)
	httpAddr := testenv.FreeAddr(t)
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(),
		"LOCKS_DATA_DIR="+t.TempDir(), "LOCKS_NATS_LISTEN=127.0.0.1:0",
		"LOCKS_POSTGRES_URL="+pgURL,
		"LOCKS_CLICKHOUSE_URL=clickhouse://"+testenv.ClickHouseAddr()+"/"+chDB,
		"LOCKS_AMQP_URL="+rabbit.URL, "LOCKS_AMQP_QUEUE="+rabbit.Queue,
		"LOCKS_HTTP_ADDR="+httpAddr, "LOCKS_GRPC_ADDR="+testenv.FreeAddr(t),
		"LOCKS_API_TOKENS="+token, "LOCKS_PARTITIONS=2", "LOCKS_LOST_AFTER="+lostAfter.String(),
		"LOCKS_WEBHOOK_ALLOW_PRIVATE=true", "LOCKS_HISTORY_FLUSH_INTERVAL=100ms",
		// Two quick attempts, then dead: the dead-letter test needs one soon.
		"LOCKS_RETRY_SCHEDULE=100ms", "LOCKS_WEBHOOK_TIMEOUT=2s", "LOCKS_ALERT_INTERVAL=1s",
		"LOCKS_ENDPOINT_DISABLE_AFTER="+disableAfter.String(), "LOCKS_UI_REFRESH="+uiRefresh.String())
	s := &system{base: "http://" + httpAddr, rabbit: rabbit, log: &testenv.LogBuffer{}}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("locks run log:\n%s", s.log)
		}
	})
	testenv.Eventually(t, 90*time.Second, "locks run to be ready", func() bool {
		select {
		case <-done:
			t.Fatalf("locks run exited:\n%s", s.log)
		default:
		}
		res, err := http.Get(s.base + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return s
}

// call is a REST call with the token; it fails t unless the status is 2xx.
func (s *system) call(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(t.Context(), method, s.base+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s %s", method, path, res.Status, b)
	}
	out := map[string]any{}
	_ = json.Unmarshal(b, &out)
	return out
}

// reading publishes a sensor's reading to RabbitMQ as a sensor does.
func (s *system) reading(t *testing.T, sensor string, data int) {
	t.Helper()
	ch, err := s.rabbit.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	body := fmt.Sprintf(`{"sensor_id":%q,"data":%d}`, sensor, data)
	if err := ch.PublishWithContext(t.Context(), "", s.rabbit.Queue, false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
}

// receiver is a webhook endpoint that answers 500 while failing is set, and records the
// webhook-id of every request it answered 2xx.
type receiver struct {
	mu        sync.Mutex
	failing   bool
	failed    []string
	delivered []string
	url       string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{failing: true}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		id := req.Header.Get("webhook-id")
		if r.failing {
			r.failed = append(r.failed, id)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		r.delivered = append(r.delivered, id)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL + "/hook"
	return r
}

func (r *receiver) setFailing(f bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing = f
}

func (r *receiver) got(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Contains(strings.Join(r.delivered, " "), id)
}

// failedIDs are the webhook-ids answered 500, in order, once each.
func (r *receiver) failedIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, id := range r.failed {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// deliveredIDs are the webhook-ids answered 2xx.
func (r *receiver) deliveredIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.delivered)
}

// waitFailed waits for the receiver's first failed attempt and returns its webhook-id.
func (r *receiver) waitFailed(t *testing.T) string {
	t.Helper()
	var id string
	testenv.Eventually(t, 30*time.Second, "a failed attempt at the receiver", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.failed) > 0 {
			id = r.failed[0]
		}
		return id != ""
	})
	return id
}

// failingClient is a client whose receiver answers 500 for now, subscribed to new sensors.
func (s *system) failingClient(t *testing.T, name string, sensors ...string) (*receiver, string) {
	t.Helper()
	rcv := newReceiver(t)
	id := s.call(t, "POST", "/v1/clients", map[string]any{"name": name, "webhook_url": rcv.url})["id"].(string)
	for _, sensor := range sensors {
		s.call(t, "POST", "/v1/sensors", map[string]any{"id": sensor, "address": name + " door " + sensor})
		s.call(t, "PUT", "/v1/sensors/"+sensor+"/clients/"+id, nil)
	}
	return rcv, id
}

// callMaybe is call for a GET that may answer 404 yet; nil then.
func (s *system) callMaybe(t *testing.T, method, path string) map[string]any {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, s.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil
	}
	out := map[string]any{}
	if json.NewDecoder(res.Body).Decode(&out) != nil {
		return nil
	}
	return out
}

// keepAlive sends the sensor's reading every half second until the test ends.
func keepAlive(t *testing.T, s *system, sensor string, data int) {
	ch, err := s.rabbit.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		body := fmt.Sprintf(`{"sensor_id":%q,"data":%d}`, sensor, data)
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = ch.PublishWithContext(context.Background(), "", s.rabbit.Queue, false, false,
					amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)})
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done; _ = ch.Close() })
}
