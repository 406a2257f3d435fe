package loadgen

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Receiver is the load run's webhook receiver: it verifies every signature (from the
// Standard Webhooks spec, not with the system's signer), de-duplicates by webhook-id, and
// measures the latency from the reading's ts (its publish time) to receipt.
type Receiver struct {
	srv    *http.Server
	ln     net.Listener
	secret []byte

	mu         sync.Mutex
	seen       map[string]bool // webhook-ids received with a valid signature
	duplicates int64
	badSig     int64
	byType     map[string]int64
	lost       map[string]int64 // sensor → connection_lost count
	lostAt     map[string]time.Time
	latencies  []time.Duration  // state_changed: receipt − occurred_at
	occurred   []time.Time      // state_changed: occurred_at (the reading's publish), as latencies
	revision   map[string]int64 // sensor → highest revision received
	outOfOrder int64
}

// NewReceiver listens on addr (e.g. 127.0.0.1:0).
func NewReceiver(addr string) (*Receiver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("loadgen receiver: %w", err)
	}
	r := &Receiver{ln: ln, seen: map[string]bool{}, byType: map[string]int64{}, lost: map[string]int64{}, lostAt: map[string]time.Time{}, revision: map[string]int64{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// URL is where the system should send webhooks.
func (r *Receiver) URL() string { return "http://" + r.ln.Addr().String() + "/hook" }

// Close stops the receiver.
func (r *Receiver) Close() error { return r.srv.Close() }

// SetSecret sets the client's signing secret (whsec_<base64>).
func (r *Receiver) SetSecret(s string) error {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
	if err != nil {
		return fmt.Errorf("signing secret: %w", err)
	}
	r.mu.Lock()
	r.secret = k
	r.mu.Unlock()
	return nil
}

func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	id := req.Header.Get("webhook-id")
	var p struct {
		Type       string    `json:"type"`
		OccurredAt time.Time `json:"occurred_at"`
		Sensor     struct {
			ID string `json:"id"`
		} `json:"sensor"`
		Revision int64 `json:"revision"`
	}
	_ = json.Unmarshal(body, &p)
	r.mu.Lock()
	secret := r.secret
	r.mu.Unlock()
	valid := ValidSignature(secret, req.Header, body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !valid {
		r.badSig++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusNoContent)
	if r.seen[id] {
		r.duplicates++
		return
	}
	r.seen[id] = true
	r.byType[p.Type]++
	// The contract: never an older revision of a sensor after a newer one (supersede).
	if p.Revision < r.revision[p.Sensor.ID] {
		r.outOfOrder++
	}
	r.revision[p.Sensor.ID] = max(r.revision[p.Sensor.ID], p.Revision)
	switch p.Type {
	case "sensor.connection_lost":
		r.lost[p.Sensor.ID]++
		if _, ok := r.lostAt[p.Sensor.ID]; !ok {
			r.lostAt[p.Sensor.ID] = now
		}
	case "sensor.state_changed":
		r.latencies = append(r.latencies, now.Sub(p.OccurredAt))
		r.occurred = append(r.occurred, p.OccurredAt)
	}
}

// Tally is what the receiver got.
type Tally struct {
	ByType     map[string]int64
	Lost       map[string]int64
	LostAt     map[string]time.Time // first connection_lost of each sensor
	Received   int64                // distinct webhooks, correctly signed
	Duplicates int64
	BadSig     int64
	// OutOfOrder counts webhooks whose revision is below one already received for their sensor.
	OutOfOrder int64
	// P50, P95, P99 of publish → webhook receipt for state_changed.
	P50, P95, P99 time.Duration
}

// Seen says whether the webhook with this id was received with a valid signature.
func (r *Receiver) Seen(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

// Tally returns a copy of the counts so far.
func (r *Receiver) Tally() Tally {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := Tally{ByType: map[string]int64{}, Lost: map[string]int64{}, LostAt: map[string]time.Time{}, Duplicates: r.duplicates, BadSig: r.badSig, OutOfOrder: r.outOfOrder, Received: int64(len(r.seen))}
	for k, v := range r.lostAt {
		t.LostAt[k] = v
	}
	for k, v := range r.byType {
		t.ByType[k] = v
	}
	for k, v := range r.lost {
		t.Lost[k] = v
	}
	t.P50, t.P95, t.P99 = quantiles(slices.Clone(r.latencies))
	return t
}

// quantiles returns the p50, p95 and p99 of l (sorting it); zeros when it is empty.
func quantiles(l []time.Duration) (p50, p95, p99 time.Duration) {
	n := len(l)
	if n == 0 {
		return 0, 0, 0
	}
	slices.Sort(l)
	q := func(p float64) time.Duration { return l[int(p*float64(n-1))] }
	return q(0.5), q(0.95), q(0.99)
}

// QuantilesAfter returns the p50, p95 and p99 of publish → receipt of the state_changed
// webhooks whose readings were published at or after t, and how many there are: a run's
// steady state, without the first seconds of a system just started.
func (r *Receiver) QuantilesAfter(t time.Time) (p50, p95, p99 time.Duration, n int) {
	r.mu.Lock()
	var l []time.Duration
	for i, at := range r.occurred {
		if !at.Before(t) {
			l = append(l, r.latencies[i])
		}
	}
	r.mu.Unlock()
	p50, p95, p99 = quantiles(l)
	return p50, p95, p99, len(l)
}

// Latencies returns the publish → receipt latencies of the state_changed webhooks received
// after the first `from` of them (in receipt order), and how many there are in all: a time
// series takes each second's share with from = the previous call's total.
func (r *Receiver) Latencies(from int) ([]time.Duration, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if from > len(r.latencies) {
		from = len(r.latencies)
	}
	return slices.Clone(r.latencies[from:]), len(r.latencies)
}

// Counts returns the distinct webhooks received so far and the duplicates.
func (r *Receiver) Counts() (received, duplicates int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.seen)), r.duplicates
}

// Register creates a client for the receiver through the admin API at apiURL, registers the
// fleet's sensors and subscribes the client to each, through the batch calls (Registrar).
func (r *Receiver) Register(ctx context.Context, apiURL, token, prefix string, sensors int) error {
	reg := Registrar{APIURL: apiURL, Token: token}
	client, secret, err := reg.CreateClient(ctx, "loadgen", r.URL())
	if err != nil {
		return err
	}
	if err := r.SetSecret(secret); err != nil {
		return err
	}
	_, err = reg.Fleet(ctx, prefix, 0, sensors, client)
	return err
}

// ErrUnbalanced says the books of a run do not balance.
var ErrUnbalanced = errors.New("loadgen: the books do not balance")

// Check balances the books of a run against what the receiver got: every expected
// state_changed received once, each silent sensor lost exactly once, no other sensor lost
// while the run still fed it (a lost event received later than lostAfter after the sensor's
// last published reading is the fleet stopping, not a false alarm), no duplicate, every
// signature valid. silentDone
// says whether enough time passed for the silent sensors to be declared lost. It returns the
// problems found, none when balanced.
func Check(b Books, t Tally, lostAfter time.Duration, silentDone bool) []string {
	var problems []string
	if got := t.ByType["sensor.state_changed"]; got != b.Changes {
		problems = append(problems, fmt.Sprintf("state_changed: received %d, expected %d (missing %d)", got, b.Changes, b.Changes-got))
	}
	if t.Duplicates > 0 {
		problems = append(problems, fmt.Sprintf("%d duplicate deliveries (same webhook-id)", t.Duplicates))
	}
	if t.BadSig > 0 {
		problems = append(problems, fmt.Sprintf("%d webhooks with a bad signature", t.BadSig))
	}
	silent := map[string]bool{}
	for _, id := range b.Silent {
		silent[id] = true
		if silentDone && t.Lost[id] != 1 {
			problems = append(problems, fmt.Sprintf("silent sensor %s: %d connection_lost, want 1", id, t.Lost[id]))
		}
	}
	for id, n := range t.Lost {
		last, ok := b.LastAt[id]
		if !ok {
			last = b.End
		}
		if !silent[id] && t.LostAt[id].Before(last.Add(lostAfter)) {
			problems = append(problems, fmt.Sprintf("sensor %s kept reporting but got %d connection_lost", id, n))
		}
	}
	if len(problems) > 20 {
		problems = append(problems[:20], fmt.Sprintf("… and %d more", len(problems)-20))
	}
	return problems
}

// ValidSignature says whether a webhook's headers sign body with secret as the Standard
// Webhooks scheme does: v1 is the HMAC-SHA256 of "id.timestamp.body", and
// webhook-signature may list several (one per secret while one is rotated). A receiver's own
// check, written apart from the notifier's signing.
func ValidSignature(secret []byte, h http.Header, body []byte) bool {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)))
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	return slices.Contains(strings.Fields(h.Get("webhook-signature")), want)
}
