package main

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/whsign"
)

// receiveTolerance is how far a webhook-timestamp may be from now: the Standard Webhooks
// verifiers' default, which stops a captured webhook from being replayed later.
const receiveTolerance = 5 * time.Minute

var receiveCommand = cliCommand{
	args:  "--listen ADDR --secret whsec_… [--count N]",
	about: "A demo webhook receiver: verifies each webhook's Standard Webhooks signature with the client's signing secret and prints it, one line per webhook; a bad signature is answered 401 and printed as refused.",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		listen := fs.String("listen", "127.0.0.1:9999", "address to listen on (the client's webhook_url points here; any path)")
		secret := fs.String("secret", "", "the client's signing secret, whsec_… (required; locks client create prints it)")
		count := fs.Int("count", 0, "exit after this many verified webhooks (0: run until Ctrl-C)")
		if _, err := c.parse(fs, args, 0, 0); err != nil {
			return err
		}
		if *secret == "" {
			return usagef("--secret is required")
		}
		if _, err := whsign.Signature(*secret, "", time.Time{}, time.Time{}, "", 0, nil); err != nil {
			return usagef("--secret: %v", err)
		}
		if *count < 0 {
			return usagef("--count must be 0 or more")
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		ctx, done := context.WithCancel(ctx)
		defer done()
		r := &receiver{secret: *secret, out: c.stdout, count: *count, done: done, seen: map[string]bool{}}
		srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
		fmt.Fprintf(c.stderr, "locks receive: listening on http://%s/ (any path), verifying with the secret given; Ctrl-C stops\n", ln.Addr())
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return err
		}
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	},
}

// receiver verifies and prints webhooks.
type receiver struct {
	secret string
	count  int
	done   func()

	mu       sync.Mutex
	out      io.Writer
	verified int
	seen     map[string]bool // webhook-ids verified before: a retry or a resend
}

// verify checks a webhook's headers and body against the secret, the way Standard Webhooks
// verifiers do: the timestamp within receiveTolerance, and one of the signatures (several
// during a secret rotation) equal to the HMAC of id.timestamp.body.
func (r *receiver) verify(h http.Header, body []byte, now time.Time) error {
	id, tsText, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || tsText == "" || sigs == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature")
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return fmt.Errorf("webhook-timestamp %q is not unix seconds", tsText)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > receiveTolerance || d < -receiveTolerance {
		return fmt.Errorf("webhook-timestamp is %s from now, more than %s", d.Round(time.Second), receiveTolerance)
	}
	want, err := whsign.Signature(r.secret, "", time.Time{}, now, id, ts, body)
	if err != nil {
		return err
	}
	for _, s := range strings.Fields(sigs) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return errors.New("no signature matches the secret")
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "webhooks are POSTed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	id := req.Header.Get("webhook-id")
	if err := r.verify(req.Header, body, time.Now()); err != nil {
		r.mu.Lock()
		fmt.Fprintf(r.out, "refused   webhook-id=%s  %v (answered 401)\n", nonEmpty(id), err)
		r.mu.Unlock()
		http.Error(w, "signature not verified: "+err.Error(), http.StatusUnauthorized)
		return
	}
	line := describeWebhook(body)
	r.mu.Lock()
	again := ""
	if r.seen[id] {
		again = "  (again: a retry or resend; de-duplicate by webhook-id)"
	}
	r.seen[id] = true
	r.verified++
	fmt.Fprintf(r.out, "verified  webhook-id=%s  %s%s\n", id, line, again)
	last := r.count > 0 && r.verified == r.count
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	if last {
		r.done()
	}
}

// describeWebhook is a webhook body (CONTRACT.md section 2) in one line: its type, sensor,
// data, previous data and revision.
func describeWebhook(body []byte) string {
	var b struct {
		Type   string `json:"type"`
		Sensor struct {
			ID string `json:"id"`
		} `json:"sensor"`
		Data         json.RawMessage `json:"data"`
		PreviousData json.RawMessage `json:"previous_data"`
		Revision     json.RawMessage `json:"revision"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return fmt.Sprintf("body (not JSON: %v): %q", err, body)
	}
	parts := []string{"type=" + nonEmpty(b.Type), "sensor=" + nonEmpty(b.Sensor.ID)}
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{{"data", b.Data}, {"previous_data", b.PreviousData}, {"revision", b.Revision}} {
		if len(f.v) > 0 {
			parts = append(parts, f.name+"="+string(f.v))
		}
	}
	return strings.Join(parts, "  ")
}
