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
	r, err := loadgen.NewReceiver("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	key := []byte("0123456789abcdef0123456789abcdef")
	if err := r.SetSecret("whsec_" + base64.StdEncoding.EncodeToString(key)); err != nil {
		t.Fatal(err)
	}
	send := func(id, sensor string, rev int) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q,"type":"sensor.state_changed","occurred_at":"2026-11-22T10:00:00Z","sensor":{"id":%q},"data":1,"revision":%d}`, id, sensor, rev)
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
