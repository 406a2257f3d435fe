package main

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// startReceiver runs `locks receive` on addr with secret until t ends; what it prints
// collects in the returned buffer.
func startReceiver(t *testing.T, addr, secret string, extra ...string) *testenv.LogBuffer {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"receive", "--listen", addr, "--secret", secret}, extra...)...)
	cmd.Env = cliEnv(nil)
	out := &testenv.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	testenv.Eventually(t, 15*time.Second, "locks receive listening on "+addr, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return out
}

// clientEnv reads the CLIENT_ID='…' and CLIENT_SECRET='…' lines of `client create --env`.
func clientEnv(t *testing.T, out string) (id, secret string) {
	t.Helper()
	vals := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || len(v) < 2 || v[0] != '\'' || v[len(v)-1] != '\'' {
			t.Fatalf("client create --env printed %q, want NAME='value' lines", sc.Text())
		}
		vals[k] = v[1 : len(v)-1]
	}
	if !strings.HasPrefix(vals["CLIENT_ID"], "cl_") || !strings.HasPrefix(vals["CLIENT_SECRET"], "whsec_") {
		t.Fatalf("client create --env printed %q, want CLIENT_ID and CLIENT_SECRET", out)
	}
	return vals["CLIENT_ID"], vals["CLIENT_SECRET"]
}

// withEnv is env with extra after it (a later value of a variable wins).
func withEnv(env []string, extra ...string) []string {
	return append(append([]string(nil), env...), extra...)
}

// eventually runs locks with args until it exits 0 with stdout matching re.
func eventually(t *testing.T, env []string, re string, args ...string) cliResult {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := locksCLI(t, env, args...)
		if r.code == 0 && regexp.MustCompile(re).MatchString(r.stdout) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("locks %s: no match for %s within 30 s; last: %s", strings.Join(args, " "), re, r)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Issue 24's must-show for the command line: each command against a running system, its
// table and --json, and its failures: exit 1 with the API's message, 2 for bad usage.
func TestCLI(t *testing.T) {
	t.Parallel()
	s := startCLISystem(t, "LOCKS_WEBHOOK_ALLOW_PRIVATE=true", "LOCKS_RETRY_SCHEDULE=100ms,100ms")
	env := s.env()
	rcvAddr := testenv.FreeAddr(t)
	var clientID, secret string
	var rcv *testenv.LogBuffer
	top := t // the receiver lives as long as the system, beyond its subtest

	t.Run("sensor create", func(t *testing.T) {
		expect(t, env, 0, []string{"door1", "Svobody st. 23", "no reading yet"}, "sensor", "create", "door1", "--address", "Svobody st. 23")
		expect(t, env, 1, []string{`sensor "door1" already exists`, "HTTP 409"}, "sensor", "create", "door1", "--address", "again")
		expect(t, env, 1, []string{"id", "HTTP 400"}, "sensor", "create", "not-an-id", "--address", "x")
		expect(t, env, 2, []string{"--address is required"}, "sensor", "create", "door9")
		expect(t, env, 2, []string{"argument(s) missing"}, "sensor", "create", "--address", "x")
	})
	t.Run("sensor get", func(t *testing.T) {
		expect(t, env, 0, []string{"door1", "Svobody st. 23"}, "sensor", "get", "door1")
		expect(t, env, 1, []string{`sensor "nosuch" not found`, "HTTP 404"}, "sensor", "get", "nosuch")
		expect(t, env, 2, []string{`unexpected argument "door2"`}, "sensor", "get", "door1", "door2")
	})
	t.Run("sensor list", func(t *testing.T) {
		expect(t, env, 0, nil, "sensor", "create", "door2", "--address", "Second door", "--lost-after", "90s")
		r := expect(t, env, 0, []string{"ID", "door1", "door2", "Second door"}, "sensor", "list")
		r = expect(t, env, 0, nil, "sensor", "list", "--json", "--limit", "1")
		var page struct {
			Sensors []struct {
				ID string `json:"id"`
			} `json:"sensors"`
			Next string `json:"next_page_token"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || len(page.Sensors) != 1 || page.Next == "" {
			t.Fatalf("sensor list --json --limit 1: %v %+v; %s", err, page, r)
		}
		expect(t, env, 2, []string{"--data must be 0 or 1"}, "sensor", "list", "--data", "2")
		expect(t, env, 2, []string{"flag provided but not defined: -url"}, "sensor", "list", "--url", "x")
	})
	t.Run("sensor delete", func(t *testing.T) {
		expect(t, env, 0, []string{"deleted sensor door2"}, "sensor", "delete", "door2")
		expect(t, env, 1, []string{`sensor "door2" not found`}, "sensor", "get", "door2")
		expect(t, env, 1, []string{`sensor "door2" not found`}, "sensor", "delete", "door2")
	})
	t.Run("client create", func(t *testing.T) {
		r := expect(t, env, 0, nil, "client", "create", "demo", "--url", "http://"+rcvAddr+"/hook", "--env")
		clientID, secret = clientEnv(t, r.stdout)
		expect(t, env, 0, []string{"signing secret", "whsec_", "http://127.0.0.1:1/other"}, "client", "create", "other", "--url", "http://127.0.0.1:1/other")
		r = expect(t, env, 0, nil, "client", "create", "third", "--url", "http://127.0.0.1:1/third", "--json", "--event-types", "sensor.state_changed")
		var c struct {
			ID, SigningSecret string
			EventTypes        []string `json:"event_types"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || !strings.HasPrefix(c.ID, "cl_") || len(c.EventTypes) != 1 {
			t.Fatalf("client create --json: %v %+v; %s", err, c, r)
		}
		expect(t, env, 1, []string{"webhook_url", "HTTP 400"}, "client", "create", "bad", "--url", "not a url")
		expect(t, env, 2, []string{"--url is required"}, "client", "create", "demo")
	})
	t.Run("receive", func(t *testing.T) {
		rcv = startReceiver(top, rcvAddr, secret)
		r := expect(t, env, 0, []string{"sent test event"}, "client", "test-event", clientID)
		evt := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(r.stdout), "sent test event"))
		testenv.Eventually(t, 30*time.Second, "the receiver verifying the test event "+evt, func() bool {
			return strings.Contains(rcv.String(), "verified  webhook-id="+evt+"  type=sensor.test")
		})
		// A webhook signed with another secret is refused with 401.
		req, _ := http.NewRequest(http.MethodPost, "http://"+rcvAddr+"/hook", strings.NewReader(`{"type":"sensor.state_changed"}`))
		req.Header.Set("webhook-id", "evt_forged")
		req.Header.Set("webhook-timestamp", strconv.FormatInt(time.Now().Unix(), 10))
		req.Header.Set("webhook-signature", "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("forged webhook: %s, want 401", resp.Status)
		}
		testenv.Eventually(t, 5*time.Second, "the receiver refusing the forged webhook", func() bool {
			return strings.Contains(rcv.String(), "refused   webhook-id=evt_forged  no signature matches the secret (answered 401)")
		})
		expect(t, env, 1, []string{`client "cl_nosuch" not found`, "HTTP 404"}, "client", "test-event", "cl_nosuch")
		expect(t, env, 2, []string{"--secret is required"}, "receive", "--listen", testenv.FreeAddr(t))
		expect(t, env, 2, []string{"whsec_"}, "receive", "--secret", "nope")
		expect(t, env, 1, []string{"address already in use"}, "receive", "--listen", rcvAddr, "--secret", secret)
	})
	t.Run("client get", func(t *testing.T) {
		expect(t, env, 0, []string{clientID, "demo", "http://" + rcvAddr + "/hook", secret, "enabled"}, "client", "get", clientID)
		expect(t, env, 1, []string{`client "cl_nosuch" not found`, "HTTP 404"}, "client", "get", "cl_nosuch")
	})
	t.Run("client list", func(t *testing.T) {
		expect(t, env, 0, []string{"ID", clientID, "other", "third", "sensor.state_changed"}, "client", "list")
	})
	var otherID string
	t.Run("client disable and enable", func(t *testing.T) {
		r := expect(t, env, 0, nil, "client", "list", "--json")
		var l struct {
			Clients []struct{ ID, Name string }
		}
		if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
			t.Fatal(err)
		}
		for _, c := range l.Clients {
			if c.Name == "other" {
				otherID = c.ID
			}
		}
		expect(t, env, 0, []string{"disabled since", "maintenance"}, "client", "disable", otherID, "--reason", "maintenance")
		expect(t, env, 0, []string{"enabled"}, "client", "enable", otherID)
		expect(t, env, 1, []string{`client "cl_nosuch" not found`}, "client", "disable", "cl_nosuch")
		expect(t, env, 1, []string{`client "cl_nosuch" not found`}, "client", "enable", "cl_nosuch")
	})
	t.Run("client rotate-secret", func(t *testing.T) {
		r := expect(t, env, 0, []string{"previous secret", "still signs until"}, "client", "rotate-secret", otherID)
		if !strings.Contains(r.stdout, "whsec_") {
			t.Fatalf("no new secret shown; %s", r)
		}
		expect(t, env, 1, []string{`client "cl_nosuch" not found`}, "client", "rotate-secret", "cl_nosuch")
	})
	t.Run("subscription create", func(t *testing.T) {
		expect(t, env, 0, []string{"subscribed client " + clientID + " to sensor door1 (all events)"}, "subscription", "create", "door1", clientID)
		expect(t, env, 1, []string{"not found", "HTTP 404"}, "subscription", "create", "nosuch", clientID)
		expect(t, env, 2, []string{"argument(s) missing"}, "subscription", "create", "door1")
	})
	t.Run("publish", func(t *testing.T) {
		expect(t, env, 0, []string{`published {"sensor_id":"door1","data":1} to ` + s.rabbit.Queue}, "publish", "door1", "1")
		testenv.Eventually(t, 30*time.Second, "the receiver verifying door1's first state change", func() bool {
			return strings.Contains(rcv.String(), "type=sensor.state_changed  sensor=door1  data=1  previous_data=null  revision=1")
		})
		expect(t, env, 0, []string{`"ts":"2026-11-22T10:00:00Z"`}, "publish", "door1", "0", "--ts", "2026-11-22T10:00:00Z", "--message-id", "m1")
		testenv.Eventually(t, 30*time.Second, "the receiver verifying door1's second state change", func() bool {
			return strings.Contains(rcv.String(), "type=sensor.state_changed  sensor=door1  data=0  previous_data=1  revision=2")
		})
		expect(t, env, 2, []string{"0 (open) or 1 (closed)"}, "publish", "door1", "2")
		expect(t, env, 2, []string{"--ts"}, "publish", "door1", "1", "--ts", "yesterday")
		expect(t, withEnv(env, "LOCKS_AMQP_URL=http://x"), 2, []string{"LOCKS_AMQP_URL"}, "publish", "door1", "1")
		expect(t, env, 1, []string{"no queue nosuch.queue", "bridge"}, "publish", "door1", "1", "--amqp-queue", "nosuch.queue")
	})
	t.Run("state", func(t *testing.T) {
		eventually(t, env, `data\s+0 \(open\)[\s\S]*connection\s+online[\s\S]*revision\s+2`, "state", "door1")
		expect(t, env, 1, []string{`sensor "nosuch" has no state`, "HTTP 404"}, "state", "nosuch")
	})
	t.Run("readings", func(t *testing.T) {
		eventually(t, env, `(?m)^\S+ \S+\s+1 \(closed\)\s+\S+ \S+\n2026-11-22 10:00:00.000Z\s+0 \(open\)`, "readings", "door1")
		r := eventually(t, env, `"readings"`, "readings", "door1", "--json")
		var l struct {
			Readings []json.RawMessage `json:"readings"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &l); err != nil || len(l.Readings) != 2 {
			t.Fatalf("readings --json: %v, %d readings, want 2; %s", err, len(l.Readings), r)
		}
		expect(t, env, 2, []string{"--start"}, "readings", "door1", "--start", "today")
		expect(t, env, 1, []string{"sensor_id", "HTTP 400"}, "readings", "not-an-id")
	})
	t.Run("events", func(t *testing.T) {
		eventually(t, env, `sensor\.state_changed\s+0 \(open\)\s+1 \(closed\)\s+2\s+evt_`, "events", "door1")
		expect(t, env, 2, []string{"--since and --start"}, "events", "door1", "--since", "1h", "--start", "2026-11-22T10:00:00Z")
		expect(t, env, 1, []string{"sensor_id", "HTTP 400"}, "events", "bad!id")
	})
	t.Run("deliveries", func(t *testing.T) {
		eventually(t, env, `evt_\S+\s+door1\s+1\s+204\s+[0-9.]+ ms\s+delivered`, "deliveries", clientID)
		expect(t, env, 1, []string{"client_id", "HTTP 400"}, "deliveries", "bad!id")
	})
	t.Run("deliveries --dead and redrive", func(t *testing.T) {
		// The client "other" points at a closed port: with two retries 100 ms apart, its
		// webhook is dead-lettered at once.
		expect(t, env, 0, nil, "subscription", "create", "door1", otherID)
		expect(t, env, 0, nil, "publish", "door1", "1")
		eventually(t, env, `evt_\S+\s+door1\s+3\s+\d+\s+0\s+\S`, "deliveries", otherID, "--dead")
		expect(t, env, 0, []string{"redriven 1 dead deliveries of client " + otherID}, "redrive", otherID)
		expect(t, env, 1, []string{`client "cl_nosuch" not found`}, "redrive", "cl_nosuch")
	})
	t.Run("subscription delete", func(t *testing.T) {
		expect(t, env, 0, []string{"unsubscribed client " + otherID + " from sensor door1"}, "subscription", "delete", "door1", otherID)
		expect(t, env, 1, []string{"no subscription of client", "HTTP 404"}, "subscription", "delete", "door1", otherID)
	})
	t.Run("client delete", func(t *testing.T) {
		expect(t, env, 0, []string{"deleted client " + otherID}, "client", "delete", otherID)
		expect(t, env, 1, []string{"not found"}, "client", "get", otherID)
	})
	t.Run("api failures", func(t *testing.T) {
		expect(t, withEnv(env, "LOCKS_API_TOKEN=wrong-token-0123456789"), 1, []string{"HTTP 401"}, "sensor", "list")
		expect(t, env, 1, []string{"does not answer"}, "sensor", "list", "--api-url", "http://"+testenv.FreeAddr(t))
		expect(t, env, 2, []string{"--api-url"}, "sensor", "list", "--api-url", "ftp://x")
	})
}

// Usage errors exit 2 before anything is called, and each command's --help lists only its
// own flags (loadgen's and replay's no longer every configuration variable).
func TestCLIUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sensor"}, "locks sensor create ID --address ADDRESS"},
		{[]string{"sensor", "frobnicate"}, `unknown verb "frobnicate"`},
		{[]string{"client", "create"}, "argument(s) missing"},
		{[]string{"client", "create", "x", "--url", "http://a", "--env", "--json"}, "--env and --json"},
		{[]string{"subscription", "delete", "a", "b", "c"}, `unexpected argument "c"`},
		{[]string{"state"}, "argument(s) missing"},
		{[]string{"readings", "door1", "--limit", "-1"}, "--limit"},
		{[]string{"deliveries"}, "argument(s) missing"},
		{[]string{"events", "door1", "--follow"}, "--follow and --after are for a client's feed"},
		{[]string{"events", "cl_aaaaaaaaaaaaaaaaaaaa", "--since", "1h"}, "--since, --start and --end are for a sensor's events"},
		{[]string{"events", "cl_aaaaaaaaaaaaaaaaaaaa", "--limit", "-1"}, "--limit"},
		{[]string{"redrive", "x", "--end", "soon"}, "--end"},
		{[]string{"publish", "door1"}, "argument(s) missing"},
		{[]string{"receive", "--count", "-1", "--secret", "whsec_AAAA"}, "--count"},
	} {
		var stdout, stderr strings.Builder
		if code := run(c.args, func(string) string { return "" }, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("locks %v: exit %d, stderr %q; want 2 and %q", c.args, code, stderr.String(), c.want)
		}
	}
	for _, c := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"sensor", "create", "--help"}, []string{"usage: locks sensor create ID", "-address", "-json", "-token"}, []string{"-url", "-amqp-url"}},
		{[]string{"client", "--help"}, []string{"locks client rotate-secret CLIENT", "locks client test-event CLIENT"}, nil},
		{[]string{"publish", "-h"}, []string{"-amqp-url", "-amqp-queue", "-message-id", "-ts"}, []string{"-postgres-url", "-json"}},
		{[]string{"receive", "--help"}, []string{"-listen", "-secret", "-count"}, []string{"-amqp-url", "-token"}},
		{[]string{"loadgen", "--help"}, []string{"-rate", "-amqp-url"}, []string{"-alert", "-postgres-url", "-retry-schedule"}},
		{[]string{"replay", "-h"}, []string{"-projection", "-postgres-url", "-nats-url"}, []string{"-alert", "-amqp-url", "-retry-schedule"}},
		{[]string{"help"}, []string{"locks sensor create|get|list|delete", "locks receive"}, nil},
	} {
		var stdout, stderr strings.Builder
		code := run(c.args, func(string) string { return "" }, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		if code != 0 {
			t.Errorf("locks %v: exit %d, want 0; %s", c.args, code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("locks %v: no %q in:\n%s", c.args, w, out)
			}
		}
		for _, n := range c.not {
			if strings.Contains(out, "\n  "+n) {
				t.Errorf("locks %v: %q should not be listed:\n%s", c.args, n, out)
			}
		}
	}
	var stdout, stderr strings.Builder
	run([]string{"replay", "-h"}, func(string) string { return "" }, &stdout, &stderr)
	if n := strings.Count(stdout.String()+stderr.String(), "\n  -"); n > 25 {
		t.Errorf("locks replay -h lists %d flags; want only replay's own and the settings it reads", n)
	}
}
