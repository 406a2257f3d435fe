package e2e_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// locksBin is the locks binary the tests run (LOCKS_BENCH_LOCKS_BIN, or this build);
// toolBin is always this build's, for the load tools a benchmark drives another build with;
// binDir, a directory for other binaries the tests build.
var locksBin, toolBin, binDir string

func TestMain(m *testing.M) {
	// The tests mostly wait on their systems' timers (lost_after, retries, restarts), and
	// the kill test's wait for the webhook leases of its killed processes is the package's
	// longest path: every test has a slot at once, so that it never waits for one.
	testenv.Parallel(12) // parses the flags
	// Jaeger's first build takes minutes: when the run includes the test that needs it, it
	// starts now, beside the build of locks and the tests before it (JaegerBinary is once).
	if run := flag.Lookup("test.run").Value.String(); run == "" || regexp.MustCompile(run).MatchString("TestReadingTraceInJaeger") {
		go func() { _, _ = testenv.JaegerBinary() }()
	}
	bin, err := testenv.BuildBinary("./cmd/locks")
	if err != nil {
		fmt.Fprintln(os.Stderr, "build locks:", err)
		os.Exit(1)
	}
	locksBin, toolBin = bin, bin
	if binDir, err = os.MkdirTemp("", "locks-e2e"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Another build of locks (an older commit's), to run old and new back to back on the same load.
	if bin := os.Getenv("LOCKS_BENCH_LOCKS_BIN"); bin != "" {
		locksBin = bin
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// latencyTests is the number of tests that call quiet (one more caller: raise it).
const latencyTests = 4

// heavyLoad keeps the tests that check a latency (lost_after, last_seen's bound, a load run's
// verdict) apart from the kill test's load, which would starve them on a small machine; the
// other tests run beside it. The kill test takes it in its sequential part, before any
// parallel test has started, and gives it back once its load is recorded.
var heavyLoad sync.RWMutex

// loadGated says whether the kill test runs beside the others: only with a parallel slot
// more than the latency tests, which could otherwise hold every slot waiting for it.
func loadGated() bool {
	return flag.Lookup("test.parallel").Value.(flag.Getter).Get().(int) > latencyTests
}

// heavy is called first by the kill test: it keeps the latency tests waiting until done is
// called or t ends, and lets t run beside the others.
func heavy(t *testing.T) (done func()) {
	if !loadGated() {
		return func() {}
	}
	heavyLoad.Lock()
	done = sync.OnceFunc(heavyLoad.Unlock)
	t.Cleanup(done)
	t.Parallel()
	return done
}

// quiet is called by a latency test once its system has started: it waits until no heavy
// load runs and keeps one from starting until t ends.
func quiet(t testing.TB) {
	if !loadGated() {
		return
	}
	heavyLoad.RLock()
	t.Cleanup(heavyLoad.RUnlock)
}

// loadRuns lets one load run at a time beside the other latency tests: two would starve them.
var loadRuns = make(chan struct{}, 1)

// oneLoadRun is called by a latency test that runs a load, after quiet: it waits until no
// other such test runs, and keeps one from starting until t ends.
func oneLoadRun(t testing.TB) {
	if !loadGated() {
		return
	}
	loadRuns <- struct{}{}
	t.Cleanup(func() { <-loadRuns })
}

// system is one `locks run --targets=all` process on private databases and queues.
type system struct {
	t      testing.TB
	bin    string // the locks binary
	pgURL  string
	chDB   string
	http   string
	token  string
	rabbit *testenv.RabbitEnv
	log    *syncBuffer
	pid    int // of the `locks run` process
	env    []string
	proc   *os.Process
	exited chan struct{} // closed when proc has exited
	// readyWithin bounds launch's wait for /readyz (0: 60 s).
	readyWithin time.Duration
}

// syncBuffer collects a process's output.
type syncBuffer = testenv.LogBuffer

func start(t testing.TB, extraEnv ...string) *system {
	t.Helper()
	return startBin(t, locksBin, extraEnv...)
}

// startBin is start with another build of locks.
func startBin(t testing.TB, bin string, extraEnv ...string) *system {
	t.Helper()
	chDB := testenv.Name("locks_e2e")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	s := &system{t: t, bin: bin, pgURL: testenv.PostgresURL(t), chDB: chDB, http: testenv.FreeAddr(t), token: "e2e-token-0123456789",
		rabbit: testenv.RabbitMQ(t), log: &syncBuffer{}}
	s.env = append(os.Environ(),
		"LOCKS_POSTGRES_URL="+s.pgURL,
		"LOCKS_CLICKHOUSE_URL=clickhouse://"+testenv.ClickHouseAddr()+"/"+chDB,
		"LOCKS_AMQP_URL="+s.rabbit.URL,
		"LOCKS_AMQP_QUEUE="+s.rabbit.Queue,
		"LOCKS_HTTP_ADDR="+s.http,
		"LOCKS_GRPC_ADDR="+testenv.FreeAddr(t),
		"LOCKS_DATA_DIR="+t.TempDir(),
		"LOCKS_NATS_LISTEN=127.0.0.1:0",
		"LOCKS_API_TOKENS="+s.token,
		"LOCKS_PARTITIONS=4",
		"LOCKS_WEBHOOK_ALLOW_PRIVATE=true",
		"LOCKS_LOG_LEVEL=debug",
	)
	s.env = append(s.env, extraEnv...)
	t.Cleanup(func() {
		_ = s.proc.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			_ = s.proc.Kill()
			t.Errorf("locks did not stop within 20 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("locks log:\n%s", s.log.String())
		}
	})
	s.launch()
	return s
}

// launch starts `locks run --targets=all` on the system's databases, queue and data
// directory, and waits until it is ready.
func (s *system) launch() {
	s.t.Helper()
	cmd := exec.Command(s.bin, "run", "--targets=all")
	cmd.Env = s.env
	cmd.Stderr = s.log
	cmd.Stdout = s.log
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.proc, s.pid, s.exited = cmd.Process, cmd.Process.Pid, exited
	within := s.readyWithin
	if within == 0 {
		within = 60 * time.Second
	}
	waitReady(s.t, "locks", s.http, exited, s.log, within)
}

// kill stops the process with SIGKILL, at whatever it is doing, and waits until it is gone.
func (s *system) kill() {
	s.t.Helper()
	if err := s.proc.Kill(); err != nil {
		s.t.Fatal(err)
	}
	<-s.exited
}

// waitReady waits up to within for /readyz at addr to answer 200, failing at once if the
// process (exited closes when it does) stops first; log is its output, shown on failure.
func waitReady(tb testing.TB, name, addr string, exited <-chan struct{}, log *syncBuffer, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			tb.Fatalf("%s exited before it was ready:\n%s", name, log.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not ready within %s:\n%s", name, within, log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// call makes a REST call and decodes the JSON answer into out (if not nil); it returns the status.
func (s *system) call(method, path string, in, out any) int {
	s.t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+s.http+path, body)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			s.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	if resp.StatusCode >= 300 {
		s.t.Logf("%s %s → %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode
}

func (s *system) publish(msgs ...string) {
	s.t.Helper()
	ch, err := s.rabbit.Conn.Channel()
	if err != nil {
		s.t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(s.rabbit.Queue, true, false, false, false, nil); err != nil {
		s.t.Fatal(err)
	}
	for _, m := range msgs {
		if err := ch.PublishWithContext(context.Background(), "", s.rabbit.Queue, false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: []byte(m)}); err != nil {
			s.t.Fatal(err)
		}
	}
}

// reading is a sensor's message as sensors send it, with the time it measured.
func reading(id string, data int) string {
	return fmt.Sprintf(`{"sensor_id":%q,"data":%d,"ts":%q}`, id, data, time.Now().UTC().Format(time.RFC3339Nano))
}

// webhook is one request the receiver got.
type webhook struct {
	at        time.Time
	id, ts    string
	signature string
	body      []byte
	payload   struct {
		ID           string `json:"id"`
		Type         string `json:"type"`
		OccurredAt   string `json:"occurred_at"`
		Sensor       struct{ ID, Address string }
		Data         *int  `json:"data"`
		PreviousData *int  `json:"previous_data"`
		Revision     int64 `json:"revision"`
	}
}

type receiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []webhook
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		h := webhook{at: time.Now(), id: req.Header.Get("webhook-id"), ts: req.Header.Get("webhook-timestamp"),
			signature: req.Header.Get("webhook-signature"), body: b}
		if err := json.Unmarshal(b, &h.payload); err != nil {
			t.Errorf("webhook body is not the contract's JSON: %v: %s", err, b)
		}
		r.mu.Lock()
		r.got = append(r.got, h)
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) wait(t *testing.T, n int, within time.Duration) []webhook {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r.mu.Lock()
		got := append([]webhook(nil), r.got...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, h := range got {
				seen = append(seen, fmt.Sprintf("%s/%s/r%d", h.payload.Sensor.ID, h.payload.Type, h.payload.Revision))
			}
			t.Fatalf("%d webhooks within %s, want %d: %v", len(got), within, n, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// verify checks a signature the way a receiver following the Standard Webhooks spec would,
// computed here from the spec, not with the system's signer.
func verify(t *testing.T, secret string, h webhook) {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatalf("signing secret %q is not whsec_<base64>: %v", secret, err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(h.id + "." + h.ts + "." + string(h.body)))
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(h.signature) {
		if sig == want {
			return
		}
	}
	t.Fatalf("webhook %s: signature %q does not match %q", h.id, h.signature, want)
}

// The contract end to end: readings in through RabbitMQ, state over REST, signed webhooks for
// changes only, lost after lost_after of silence, restored (and changed) on the next reading,
// invalid input to the invalid queue.
func TestReadingsToWebhooks(t *testing.T) {
	t.Parallel()
	const lostAfter = 3 * time.Second
	s := start(t, "LOCKS_LOST_AFTER="+lostAfter.String(), "LOCKS_RETRY_SCHEDULE=200ms,400ms")
	quiet(t)
	rcv := newReceiver(t)

	var client struct {
		ID            string `json:"id"`
		SigningSecret string `json:"signing_secret"`
	}
	if code := s.call("POST", "/v1/clients", map[string]string{"name": "e2e", "webhook_url": rcv.URL + "/hook"}, &client); code != 200 {
		t.Fatalf("create client: %d", code)
	}
	for _, id := range []string{"doorA", "doorB"} {
		if code := s.call("POST", "/v1/sensors", map[string]string{"id": id, "address": "Svobody st. 23 " + id}, nil); code != 200 {
			t.Fatalf("register %s: %d", id, code)
		}
		if code := s.call("PUT", "/v1/sensors/"+id+"/clients/"+client.ID, nil, nil); code != 200 {
			t.Fatalf("subscribe to %s: %d", id, code)
		}
	}

	s.publish(
		reading("doorA", 1),
		reading("doorA", 1), // a repeated value: no event
		`not json`,
		`{"sensor_id":"doorA","data":0,"ts":"2026-11-22T10:00:00.123Z"}`,
		reading("doorB", 1),
	)
	got := rcv.wait(t, 3, 20*time.Second)
	// lost_after counts from the server's receive time of doorA's last reading: its
	// last_seen_time, written with the change it made. The webhooks come later, a second
	// or more on a busy machine, so their arrival is no reference.
	var seenA struct {
		LastSeenTime time.Time `json:"last_seen_time"`
		Data         int       `json:"data"`
	}
	if code := s.call("GET", "/v1/sensors/doorA/state", nil, &seenA); code != 200 || seenA.Data != 0 || seenA.LastSeenTime.IsZero() {
		t.Fatalf("state of doorA after its change to 0: %d %+v", code, seenA)
	}
	lastA := seenA.LastSeenTime
	byRev := map[string][]webhook{}
	for _, h := range got {
		verify(t, client.SigningSecret, h)
		if h.id != h.payload.ID || !strings.HasPrefix(h.id, "evt_") {
			t.Fatalf("webhook-id %q, body id %q", h.id, h.payload.ID)
		}
		byRev[h.payload.Sensor.ID] = append(byRev[h.payload.Sensor.ID], h)
	}
	a := byRev["doorA"]
	if len(a) != 2 || a[0].payload.Revision != 1 || a[0].payload.PreviousData != nil || *a[0].payload.Data != 1 ||
		a[1].payload.Revision != 2 || *a[1].payload.PreviousData != 1 || *a[1].payload.Data != 0 ||
		a[0].payload.Type != "sensor.state_changed" || a[0].payload.Sensor.Address != "Svobody st. 23 doorA" {
		t.Fatalf("doorA webhooks: %+v", a)
	}
	if len(byRev["doorB"]) != 1 {
		t.Fatalf("doorB webhooks: %+v", byRev["doorB"])
	}

	// doorB keeps reporting; doorA is silent and must be declared lost after lost_after.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				s.publish(reading("doorB", 1))
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	got = rcv.wait(t, 4, 20*time.Second)
	lost := got[3]
	if lost.payload.Type != "sensor.connection_lost" || lost.payload.Sensor.ID != "doorA" || lost.payload.Revision != 3 || *lost.payload.Data != 0 {
		t.Fatalf("4th webhook %+v, want doorA connection_lost revision 3 data 0", lost.payload)
	}
	if d := lost.at.Sub(lastA); d < lostAfter-500*time.Millisecond || d > 3*lostAfter {
		t.Fatalf("connection_lost %s after the last reading, want about %s", d, lostAfter)
	}
	var st struct {
		Connection string `json:"connection"`
		Revision   string `json:"revision"`
		Data       int    `json:"data"`
	}
	if code := s.call("GET", "/v1/sensors/doorA/state", nil, &st); code != 200 || st.Connection != "CONNECTION_LOST" {
		t.Fatalf("state of doorA: %d %+v", code, st)
	}

	s.publish(reading("doorA", 1))
	got = rcv.wait(t, 6, 20*time.Second)
	if got[4].payload.Type != "sensor.connection_restored" || got[4].payload.Revision != 4 ||
		got[5].payload.Type != "sensor.state_changed" || got[5].payload.Revision != 5 || *got[5].payload.PreviousData != 0 {
		t.Fatalf("after the restoring reading: %+v then %+v", got[4].payload, got[5].payload)
	}
	if code := s.call("GET", "/v1/sensors/doorA/state", nil, &st); code != 200 || st.Connection != "CONNECTION_ONLINE" || st.Data != 1 {
		t.Fatalf("state of doorA: %d %+v", code, st)
	}
	if code := s.call("GET", "/v1/sensors/nosuch/state", nil, nil); code != 404 {
		t.Fatalf("state of a sensor never seen: %d, want 404", code)
	}

	// Nothing more: doorB kept the same value, so no event for it; no webhook twice.
	time.Sleep(time.Second)
	rcv.mu.Lock()
	seen := map[string]bool{}
	for _, h := range rcv.got {
		if seen[h.id] {
			t.Errorf("webhook %s delivered twice", h.id)
		}
		seen[h.id] = true
	}
	if len(rcv.got) != 6 {
		t.Errorf("%d webhooks, want exactly 6", len(rcv.got))
	}
	rcv.mu.Unlock()

	// The invalid message is in the invalid queue with its reason.
	ch, err := s.rabbit.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	m, ok, err := ch.Get(s.rabbit.InvalidQueue, true)
	if err != nil || !ok || string(m.Body) != "not json" || m.Headers["x-lock-sensors-error"] == nil {
		t.Fatalf("invalid queue: %v %v %+v", ok, err, m)
	}
}

// Sensors in the field send only sensor_id and data. A door closed, opened and closed again
// within seconds sends the same body twice, and both are readings: every change is notified,
// the state ends where the door is, and history holds every reading (issue 13).
func TestSeedFormatEveryReadingCounts(t *testing.T) {
	t.Parallel()
	s := start(t, "LOCKS_RETRY_SCHEDULE=200ms,400ms")
	rcv := newReceiver(t)
	var client struct {
		ID string `json:"id"`
	}
	if code := s.call("POST", "/v1/clients", map[string]string{"name": "seed", "webhook_url": rcv.URL + "/hook"}, &client); code != 200 {
		t.Fatalf("create client: %d", code)
	}
	sequences := map[string][]int{"doorC": {1, 0, 1}, "doorD": {1, 1, 0, 0, 1}}
	for id := range sequences {
		if code := s.call("POST", "/v1/sensors", map[string]string{"id": id, "address": "seed " + id}, nil); code != 200 {
			t.Fatalf("register %s: %d", id, code)
		}
		if code := s.call("PUT", "/v1/sensors/"+id+"/clients/"+client.ID, nil, nil); code != 200 {
			t.Fatalf("subscribe to %s: %d", id, code)
		}
	}
	for i := range 5 {
		for _, id := range []string{"doorC", "doorD"} {
			if seq := sequences[id]; i < len(seq) {
				s.publish(fmt.Sprintf(`{"sensor_id":%q,"data":%d}`, id, seq[i]))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	// doorC: 1, 0, 1 are three changes; doorD: 1, 1, 0, 0, 1 are three (1, 0, 1).
	got := rcv.wait(t, 6, 30*time.Second)
	time.Sleep(time.Second) // nothing more may come
	rcv.mu.Lock()
	got = append([]webhook(nil), rcv.got...)
	rcv.mu.Unlock()
	changes := map[string][]int{}
	for _, h := range got {
		if h.payload.Type != "sensor.state_changed" {
			t.Fatalf("unexpected %s for %s", h.payload.Type, h.payload.Sensor.ID)
		}
		id := h.payload.Sensor.ID
		if want := int64(len(changes[id]) + 1); h.payload.Revision != want {
			t.Fatalf("%s: revision %d, want %d", id, h.payload.Revision, want)
		}
		changes[id] = append(changes[id], *h.payload.Data)
	}
	for id, want := range map[string][]int{"doorC": {1, 0, 1}, "doorD": {1, 0, 1}} {
		if fmt.Sprint(changes[id]) != fmt.Sprint(want) {
			t.Errorf("%s: changes %v, want %v", id, changes[id], want)
		}
		var st struct {
			Data     int    `json:"data"`
			Revision string `json:"revision"`
		}
		if code := s.call("GET", "/v1/sensors/"+id+"/state", nil, &st); code != 200 || st.Data != 1 || st.Revision != "3" {
			t.Errorf("state of %s: %d %+v, want data 1 revision 3", id, code, st)
		}
	}
	// Every reading is kept, the repeated bodies included.
	for id, seq := range sequences {
		testenv.Eventually(t, 20*time.Second, id+"'s readings in history", func() bool {
			var h struct {
				Readings []struct {
					Data int `json:"data"`
				} `json:"readings"`
			}
			if code := s.call("GET", "/v1/sensors/"+id+"/readings", nil, &h); code != 200 {
				return false
			}
			var data []int
			for _, r := range h.Readings {
				data = append(data, r.Data)
			}
			return fmt.Sprint(data) == fmt.Sprint(seq)
		})
	}
}
