package loadgen_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/loadgen"
)

// The receiver counts a webhook whose revision is below one already received for its
// sensor (the contract's supersede promise broken), but not a repeat of one received.
func TestReceiverCountsOlderRevisionsAfterNewer(t *testing.T) {
	r, key := newReceiver(t)
	send := sender(t, r, key, "2026-11-22T10:00:00Z")
	send("evt_1", "a", 1)
	send("evt_3", "a", 3)
	send("evt_3", "a", 3) // a duplicate, not out of order
	send("evt_1b", "b", 1)
	send("evt_2", "a", 2) // older than 3: out of order
	tally := r.Tally()
	if tally.OutOfOrder != 1 || tally.Duplicates != 1 || tally.Received != 4 {
		t.Fatalf("out of order %d, duplicates %d, received %d; want 1, 1, 4", tally.OutOfOrder, tally.Duplicates, tally.Received)
	}
}

// newReceiver is a receiver with a signing key, closed at the end of the test.
func newReceiver(t *testing.T) (*loadgen.Receiver, []byte) {
	r, err := loadgen.NewReceiver("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	key := []byte("0123456789abcdef0123456789abcdef")
	if err := r.SetSecret("whsec_" + base64.StdEncoding.EncodeToString(key)); err != nil {
		t.Fatal(err)
	}
	return r, key
}

// sender sends r signed state_changed webhooks of readings that occurred at occurred.
func sender(t *testing.T, r *loadgen.Receiver, key []byte, occurred string) func(id, sensor string, rev int) {
	return func(id, sensor string, rev int) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"type":"sensor.state_changed","occurred_at":%q,"sensor":{"id":%q},"data":1,"revision":%d}`, id, occurred, sensor, rev)
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "." + body))
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, r.URL(), strings.NewReader(body))
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", ts)
		req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("%s: status %d", id, resp.StatusCode)
		}
	}
}

// QuantilesAfter summarises only the webhooks of readings published at or after its time:
// the warm-up's slow ones are left out, the whole run's tally keeps them.
func TestReceiverQuantilesAfterLeaveTheWarmUpOut(t *testing.T) {
	r, key := newReceiver(t)
	warm := time.Now().Add(-time.Hour).UTC()
	send := sender(t, r, key, warm.Format(time.RFC3339Nano)) // an hour late
	for i := range 5 {
		send(fmt.Sprintf("evt_w%d", i), "w", i+1)
	}
	steady := time.Now().UTC()
	send = sender(t, r, key, steady.Format(time.RFC3339Nano))
	for i := range 5 {
		send(fmt.Sprintf("evt_s%d", i), "s", i+1)
	}
	p50, _, p99, n := r.QuantilesAfter(steady)
	if n != 5 || p99 > time.Minute || p50 < 0 {
		t.Fatalf("after the warm-up: %d webhooks, p50 %s, p99 %s; want 5, all under a minute", n, p50, p99)
	}
	if all := r.Tally(); all.P99 < time.Hour {
		t.Fatalf("the whole run's p99 %s leaves the warm-up out", all.P99)
	}
}
