package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// switchProxy forwards TCP connections to one backend at a time; switching cuts every
// connection open, as a load balancer moving a client to another instance would.
type switchProxy struct {
	addr    string
	mu      sync.Mutex
	backend string
	conns   map[net.Conn]bool
}

func newSwitchProxy(t *testing.T, backend string) *switchProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{addr: ln.Addr().String(), backend: backend, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.switchTo("") })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *switchProxy) serve(c net.Conn) {
	p.mu.Lock()
	backend := p.backend
	p.mu.Unlock()
	b, err := net.DialTimeout("tcp", backend, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[b] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done
	c.Close()
	b.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, b)
	p.mu.Unlock()
}

// switchTo sends new connections to backend and cuts the open ones.
func (p *switchProxy) switchTo(backend string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backend = backend
	for c := range p.conns {
		c.Close()
	}
}

// adminCall is a REST call with the system's administrator token; it fails t unless 2xx.
func (s *cliSystem) adminCall(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(t.Context(), method, "http://"+s.httpAddr+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+s.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s %s", method, path, res.Status, out)
	}
	m := map[string]any{}
	_ = json.Unmarshal(out, &m)
	return m
}

// follower is a running `locks events CLIENT --follow --json`, collecting its lines.
type follower struct {
	cmd    *exec.Cmd
	stderr *testenv.LogBuffer
	mu     sync.Mutex
	lines  []feedLine
	done   chan struct{}
}

func startFollower(t *testing.T, env []string, args ...string) *follower {
	f := &follower{stderr: &testenv.LogBuffer{}, done: make(chan struct{})}
	f.cmd = exec.Command(os.Args[0], args...)
	f.cmd.Env = cliEnv(env)
	f.cmd.Stderr = f.stderr
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var l feedLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("locks events --json printed %q: %v", sc.Text(), err)
				continue
			}
			f.mu.Lock()
			f.lines = append(f.lines, l)
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = f.cmd.Process.Kill(); <-f.done })
	return f
}

func (f *follower) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lines)
}

// Issue 27, item 5: `locks events CLIENT --follow` with the client's token watches its feed
// through a real API, and a resumed watch misses and doubles nothing across a switch to
// another API process and an API process killed and started again, on thousands of events;
// each event byte for byte the body the receiver got, in the feed's order. Without --follow
// it reads the feed to its end; another client's feed is refused with exit 1.
func TestCLIEventsFollow(t *testing.T) {
	t.Parallel()
	ne := testenv.NATS(t)
	sys := startCLISystem(t, "LOCKS_NATS_URL="+ne.URL, "LOCKS_WEBHOOK_ALLOW_PRIVATE=true")
	api2Addr := testenv.FreeAddr(t)
	api2Env := append(append([]string(nil), sys.servers...), "LOCKS_NATS_URL="+ne.URL, "LOCKS_WEBHOOK_ALLOW_PRIVATE=true")
	startAPI2 := func() *locksProcess {
		return startLocks(t, api2Addr, append(api2Env, "LOCKS_GRPC_ADDR="+testenv.FreeAddr(t)), "run", "--targets=api")
	}
	api2 := startAPI2()

	var mu sync.Mutex
	got := map[string][]byte{} // webhook-id → body
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[r.Header.Get("webhook-id")] = b
		mu.Unlock()
	}))
	t.Cleanup(rcv.Close)
	client := sys.adminCall(t, "POST", "/v1/clients", map[string]any{"name": "follower", "webhook_url": rcv.URL})["id"].(string)
	other := sys.adminCall(t, "POST", "/v1/clients", map[string]any{"name": "other", "webhook_url": rcv.URL})["id"].(string)
	tok := sys.adminCall(t, "POST", "/v1/clients/"+client+"/tokens", map[string]any{"name": "cli"})["token"].(string)
	const sensors, perSensor = 10, 200
	for i := range sensors {
		id := fmt.Sprintf("Follow%d", i)
		sys.adminCall(t, "POST", "/v1/sensors", map[string]any{"id": id, "address": "Door " + id})
		sys.adminCall(t, "PUT", "/v1/sensors/"+id+"/clients/"+client, map[string]any{})
	}

	proxy := newSwitchProxy(t, sys.httpAddr)
	env := []string{"LOCKS_API_URL=http://" + proxy.addr, "LOCKS_API_TOKEN=" + tok}
	f := startFollower(t, env, "events", client, "--follow", "--json")

	ch, err := sys.rabbit.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	round := 0
	// publish sends each sensor's next reading, the other state than its last: a change each.
	publish := func(rounds int) {
		t.Helper()
		for range rounds {
			for i := range sensors {
				body := fmt.Sprintf(`{"sensor_id":"Follow%d","data":%d}`, i, round%2)
				if err := ch.PublishWithContext(t.Context(), "", sys.rabbit.Queue, false, false,
					amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)}); err != nil {
					t.Fatal(err)
				}
			}
			round++
		}
	}
	waitFor := func(n int, what string) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, fmt.Sprintf("%d events followed (%s)", n, what), func() bool { return f.count() >= n })
	}
	const quarter = perSensor / 4
	publish(quarter)
	waitFor(quarter*sensors/2, "on the all-in-one process")
	proxy.switchTo(api2Addr) // to another API process, mid-stream
	publish(quarter)
	waitFor(quarter*sensors*3/2, "after the switch to a second API process")
	api2.stop(t, syscall.SIGKILL) // the API process the watch is on dies
	publish(quarter)
	time.Sleep(500 * time.Millisecond) // the follower retries against a dead address meanwhile
	api2 = startAPI2()
	waitFor(quarter*sensors*3, "after that process was killed and started again")
	proxy.switchTo(sys.httpAddr)
	publish(quarter)
	waitFor(perSensor*sensors, "back on the first process")

	// The books: the feed read afresh, the follower's lines and the receiver's bodies. A
	// write transaction of the database still open holds the feed's tail back (docs/contract.md,
	// The event feed) while the watch has already sent it: read again until it is all there.
	var feed []feedLine
	testenv.Eventually(t, 30*time.Second, "the feed read afresh to hold every event", func() bool {
		r := expect(t, withEnv(env, "LOCKS_API_URL=http://"+sys.httpAddr), 0, nil, "events", client, "--json")
		feed = feed[:0]
		for l := range strings.Lines(r.stdout) {
			var fl feedLine
			if err := json.Unmarshal([]byte(l), &fl); err != nil {
				t.Fatalf("locks events --json line %q: %v", l, err)
			}
			feed = append(feed, fl)
		}
		return len(feed) >= perSensor*sensors
	})
	// What the receiver got so far is compared byte for byte; whether the notifier has
	// delivered everything yet on a loaded machine is its own tests' business.
	time.Sleep(time.Second) // a line printed twice would come now: the counts below catch it
	f.mu.Lock()
	lines := append([]feedLine(nil), f.lines...)
	f.mu.Unlock()
	if len(feed) != perSensor*sensors || len(lines) != len(feed) {
		t.Fatalf("the feed has %d events, the follower printed %d; want %d each", len(feed), len(lines), perSensor*sensors)
	}
	revs := map[string]int64{}
	mu.Lock()
	defer mu.Unlock()
	inFeed := map[string]bool{}
	for i, l := range lines {
		if l.Cursor != feed[i].Cursor || !bytes.Equal(l.Event, feed[i].Event) {
			t.Fatalf("followed item %d is %s %s; the feed's is %s %s", i, l.Cursor, l.Event, feed[i].Cursor, feed[i].Event)
		}
		var ev struct {
			ID       string `json:"id"`
			Revision int64  `json:"revision"`
			Sensor   struct {
				ID string `json:"id"`
			} `json:"sensor"`
		}
		if err := json.Unmarshal(l.Event, &ev); err != nil {
			t.Fatal(err)
		}
		if b, ok := got[ev.ID]; ok && !bytes.Equal(b, l.Event) {
			t.Fatalf("event %s: the receiver got\n%s\nthe follower printed\n%s", ev.ID, b, l.Event)
		}
		inFeed[ev.ID] = true
		if ev.Revision != revs[ev.Sensor.ID]+1 {
			t.Fatalf("event %s of %s has revision %d after %d", ev.ID, ev.Sensor.ID, ev.Revision, revs[ev.Sensor.ID])
		}
		revs[ev.Sensor.ID] = ev.Revision
	}
	for id := range got {
		if !inFeed[id] {
			t.Errorf("the receiver got %s, which the feed does not list", id)
		}
	}
	if len(got) == 0 {
		t.Error("the receiver got no webhook: nothing was compared with the feed")
	}
	t.Logf("%d events followed; the %d webhooks received so far are byte for byte the feed's", len(lines), len(got))
	if !strings.Contains(f.stderr.String(), "resuming from cursor") {
		t.Errorf("the follower never resumed; its stderr:\n%s", f.stderr)
	}

	// Ctrl-C ends it with exit 0 and the cursor to read on from.
	_ = f.cmd.Process.Signal(syscall.SIGINT)
	<-f.done
	if err := f.cmd.Wait(); err != nil || !strings.Contains(f.stderr.String(), "--after "+lines[len(lines)-1].Cursor) {
		t.Errorf("after SIGINT: %v; stderr:\n%s", err, f.stderr)
	}
	// Another client's feed: refused, also with --follow, without retrying.
	expect(t, env, 1, []string{"permission denied", "403"}, "events", other)
	expect(t, env, 1, []string{"403"}, "events", other, "--follow")
	// A table without --json, read from a cursor: the last two events.
	r := expect(t, env, 0, []string{"TIME", "sensor.state_changed"}, "events", client, "--after", feed[len(feed)-3].Cursor)
	if n := strings.Count(strings.TrimSpace(r.stdout), "\n"); n != 2 {
		t.Errorf("from the third last cursor: %d rows, want 2:\n%s", n, r.stdout)
	}
	expect(t, env, 2, []string{"--follow and --after are for a client's feed"}, "events", "Follow1", "--follow")
}
