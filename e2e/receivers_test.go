package e2e_test

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// snippet is one of the verification programs of docs/receiving-webhooks.md
// (docs/examples), run as a command: SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE,
// the body on stdin; exit 0 when the signature is good.
type snippet struct {
	name string
	argv []string
}

func snippets(t *testing.T) []snippet {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "verify")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", bin, "../docs/examples").CombinedOutput(); err != nil {
		t.Fatalf("build docs/examples/verify.go: %v: %s", err, out)
	}
	for _, tool := range []string{"python3", "node"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to run the receivers' examples (Debian: apt-get install python3 nodejs): %v", tool, err)
		}
	}
	return []snippet{
		{"go", []string{bin}},
		{"python", []string{"python3", "../docs/examples/verify.py"}},
		{"node", []string{"node", "../docs/examples/verify.js"}},
	}
}

// run feeds one recorded delivery (with body in place of its own) to the snippet.
func (s snippet) run(secret string, h webhook, body []byte) (string, error) {
	cmd := exec.Command(s.argv[0], append(s.argv[1:], secret, h.id, h.ts, h.signature)...)
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The receivers' examples in Go, Python and Node.js accept real deliveries of a running
// system, signed with one secret and, during a rotation, with both, and reject a tampered body,
// a wrong secret and a delivery whose signature belongs to another body.
func TestReceiverExamplesVerifyRealDeliveries(t *testing.T) {
	t.Parallel()
	s := start(t)
	rcv := newReceiver(t)
	examples := snippets(t)

	var client struct {
		ID            string `json:"id"`
		SigningSecret string `json:"signing_secret"`
	}
	if code := s.call("POST", "/v1/clients", map[string]string{"name": "receivers", "webhook_url": rcv.URL + "/hook"}, &client); code != 200 {
		t.Fatalf("create client: %d", code)
	}
	if code := s.call("POST", "/v1/sensors", map[string]string{"id": "frontDoor", "address": "Svobody st. 23"}, nil); code != 200 {
		t.Fatalf("register sensor: %d", code)
	}
	if code := s.call("PUT", "/v1/sensors/frontDoor/clients/"+client.ID, nil, nil); code != 200 {
		t.Fatalf("subscribe: %d", code)
	}
	s.publish(reading("frontDoor", 1))
	first := rcv.wait(t, 1, 30*time.Second)[0]
	verify(t, client.SigningSecret, first) // the e2e suite's own check, from the spec

	// A rotation: for a while every delivery carries the new secret's and the old one's signature.
	old := client.SigningSecret
	var rotated struct {
		SigningSecret string `json:"signing_secret"`
	}
	if code := s.call("POST", "/v1/clients/"+client.ID+":rotateSecret", map[string]string{}, &rotated); code != 200 {
		t.Fatalf("rotate secret: %d", code)
	}
	newSecret := rotated.SigningSecret
	if newSecret == "" || newSecret == old {
		t.Fatalf("rotation gave secret %q (old %q)", newSecret, old)
	}
	s.publish(reading("frontDoor", 0))
	second := rcv.wait(t, 2, 30*time.Second)[1]
	if n := len(strings.Fields(second.signature)); n != 2 {
		t.Fatalf("delivery during a rotation has %d signatures, want 2: %q", n, second.signature)
	}

	tampered := bytes.Replace(first.body, []byte(`"data":1`), []byte(`"data":0`), 1)
	if bytes.Equal(tampered, first.body) {
		t.Fatalf("no \"data\":1 to tamper with in %s", first.body)
	}
	for _, ex := range examples {
		t.Run(ex.name, func(t *testing.T) {
			for _, c := range []struct {
				what   string
				secret string
				h      webhook
				body   []byte
			}{
				{"genuine", old, first, first.body},
				{"during rotation, new secret", newSecret, second, second.body},
				{"during rotation, old secret", old, second, second.body},
			} {
				out, err := ex.run(c.secret, c.h, c.body)
				if err != nil || !strings.Contains(out, "verified "+c.h.payload.Type+" "+c.h.id) {
					t.Errorf("%s delivery %s: %v: %q, want it verified", c.what, c.h.id, err, out)
				}
			}
			for _, c := range []struct {
				what   string
				secret string
				h      webhook
				body   []byte
			}{
				{"tampered body", old, first, tampered},
				{"wrong secret", newSecret, first, first.body},
				{"another delivery's body", old, first, second.body},
			} {
				out, err := ex.run(c.secret, c.h, c.body)
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 1 {
					t.Errorf("%s: %v: %q, want it rejected with exit 1", c.what, err, out)
				}
			}
		})
	}
}
