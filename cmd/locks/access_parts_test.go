package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Each part runs as its own process with its own user of deploy/nats/accounts.conf, against a
// server enforcing them, and the system works end to end: a reading goes from RabbitMQ
// (bridge) through READINGS (state) to EVENTS and a webhook (notifier), its silence becomes a
// connection_lost webhook (watchdog), history reaches ClickHouse (history) and the admin API
// lists it, the projections and the set-aside records (api). No process is refused anything.
func TestEachPartRunsWithItsOwnNATSUser(t *testing.T) {
	t.Parallel()
	a := startAccessServer(t)
	admin, _ := a.connect(t, "admin")
	if err := natsx.Declare(t.Context(), admin, natsx.StreamsConfig{Partitions: 2, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	pgURL := testenv.PostgresURL(t)
	chDB := testenv.Name("locks_access")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	rabbit := testenv.RabbitMQ(t)
	const token = "access-token-0123456789"

	var mu sync.Mutex
	var hooks []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hooks = append(hooks, string(b))
		mu.Unlock()
	}))
	t.Cleanup(rcv.Close)

	logs := map[string]*syncBuffer{}
	var apiAddr string
	parts := []string{"api", "state", "history", "notifier", "watchdog", "bridge", "alerter"}
	for _, part := range parts {
		httpAddr := testenv.FreeAddr(t)
		if part == "api" {
			apiAddr = httpAddr
		}
		cmd := locksCmd(t, []string{
			"LOCKS_NATS_URL=" + a.url(part), "LOCKS_NATS_DECLARE=false",
			"LOCKS_POSTGRES_URL=" + pgURL,
			"LOCKS_CLICKHOUSE_URL=clickhouse://" + testenv.ClickHouseAddr() + "/" + chDB,
			"LOCKS_AMQP_URL=" + rabbit.URL, "LOCKS_AMQP_QUEUE=" + rabbit.Queue,
			"LOCKS_HTTP_ADDR=" + httpAddr, "LOCKS_GRPC_ADDR=" + testenv.FreeAddr(t),
			"LOCKS_API_TOKENS=" + token, "LOCKS_PARTITIONS=2", "LOCKS_LOST_AFTER=3s",
			"LOCKS_WEBHOOK_ALLOW_PRIVATE=true", "LOCKS_HISTORY_FLUSH_INTERVAL=100ms", "LOCKS_ALERT_INTERVAL=1s",
		}, "run", "--targets="+part)
		log := &syncBuffer{}
		cmd.Stderr, logs[part] = log, log
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
				t.Logf("%s log:\n%s", part, log)
			}
		})
		// One at a time: each migrates the databases at start.
		testenv.Eventually(t, 60*time.Second, part+" ready", func() bool {
			select {
			case <-done:
				t.Fatalf("%s exited:\n%s", part, log)
			default:
			}
			resp, err := http.Get("http://" + httpAddr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}

	call := func(method, path string, in any) (int, string) {
		t.Helper()
		var body io.Reader
		if in != nil {
			b, _ := json.Marshal(in)
			body = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, "http://"+apiAddr+path, body)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var client struct {
		ID string `json:"id"`
	}
	code, body := call("POST", "/v1/clients", map[string]string{"name": "c", "webhook_url": rcv.URL + "/hook"})
	if code != 200 || json.Unmarshal([]byte(body), &client) != nil {
		t.Fatalf("create client: %d %s", code, body)
	}
	for _, c := range []struct{ method, path string }{{"POST", "/v1/sensors"}, {"PUT", "/v1/sensors/door1/clients/" + client.ID}} {
		var in any
		if c.method == "POST" {
			in = map[string]string{"id": "door1", "address": "a"}
		}
		if code, body := call(c.method, c.path, in); code != 200 {
			t.Fatalf("%s %s: %d %s", c.method, c.path, code, body)
		}
	}
	ch, err := rabbit.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.PublishWithContext(t.Context(), "", rabbit.Queue, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent,
		Body: []byte(`{"sensor_id":"door1","data":1}`)}); err != nil {
		t.Fatal(err)
	}
	seen := func(typ string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, h := range hooks {
				if strings.Contains(h, typ) {
					return true
				}
			}
			return false
		}
	}
	testenv.Eventually(t, 30*time.Second, "the state_changed webhook", seen("sensor.state_changed"))
	testenv.Eventually(t, 60*time.Second, "the connection_lost webhook", seen("sensor.connection_lost"))
	testenv.Eventually(t, 30*time.Second, "the reading in the history", func() bool {
		code, body := call("GET", "/v1/sensors/door1/readings", nil)
		return code == 200 && strings.Contains(body, `"data"`)
	})
	// The webhook controls: the API queues a test event, and a re-enable's breaker reset
	// goes over core NATS from the api user to the notifier user.
	if code, body := call("POST", "/v1/clients/"+client.ID+":sendTestEvent", nil); code != 200 {
		t.Fatalf("sendTestEvent: %d %s", code, body)
	}
	testenv.Eventually(t, 30*time.Second, "the sensor.test webhook", seen("sensor.test"))
	if code, body := call("POST", "/v1/clients/"+client.ID+":enable", nil); code != 200 {
		t.Fatalf("enable: %d %s", code, body)
	}
	testenv.Eventually(t, 10*time.Second, "the notifier got the breaker reset", func() bool {
		return strings.Contains(logs["notifier"].String(), "endpoint reset by an operator")
	})
	for _, path := range []string{"/v1/projections", "/v1/set-aside", "/v1/clients/" + client.ID + "/deliveries"} {
		if code, body := call("GET", path, nil); code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
	}
	// The dashboard (api user) reads the registry, where every part's process (its own user)
	// keeps its key, and LOGS.
	dash := dashboardClient(t, "http://"+apiAddr, token)
	testenv.Eventually(t, 20*time.Second, "every part's process in the dashboard's registry panel", func() bool {
		return strings.Count(dash("/ui/panel/processes"), "data-process=") == len(parts)
	})
	if b := dash("/ui/panel/logs"); strings.Contains(b, `class="error"`) {
		t.Errorf("the dashboard cannot read LOGS:\n%s", b)
	}
	// The alerter took its lock and evaluates every kind under its own user.
	testenv.Eventually(t, 30*time.Second, "the alerter active", func() bool {
		return strings.Contains(logs["alerter"].String(), "alerter active")
	})
	if code, body := call("GET", "/v1/alerts", nil); code != 200 {
		t.Fatalf("GET /v1/alerts: %d %s", code, body)
	}
	if s := logs["alerter"].String(); strings.Contains(s, "alert evaluation failed") {
		t.Errorf("an alert evaluation failed:\n%s", s)
	}
	for part, log := range logs {
		if s := strings.ToLower(log.String()); strings.Contains(s, "permissions violation") || strings.Contains(s, "authorization violation") {
			t.Errorf("%s was refused something by NATS:\n%s", part, log)
		}
	}
	// Every durable consumer the parts made is one the permission matrix knows (and denies
	// to the other parts): a renamed consumer would otherwise lose its protection silently.
	for _, stream := range []string{natsx.ReadingsStream, natsx.EventsStream, natsx.DeliveriesStream} {
		st, err := admin.Stream(t.Context(), stream)
		if err != nil {
			t.Fatal(err)
		}
		l := st.ListConsumers(t.Context())
		for ci := range l.Info() {
			if ci.Config.Durable != "" && natsx.ConsumerOwner(stream, ci.Name, 2) == "" {
				t.Errorf("durable consumer %s on %s is not in natsx's permission matrix", ci.Name, stream)
			}
		}
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
	}
}
