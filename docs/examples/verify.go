// Command verify checks one lock-sensors webhook the way a receiver should, with Go's standard
// library only: docs/receiving-webhooks.md explains it, and e2e/receivers_test.go runs it
// against real deliveries.
//
//	verify SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE < body
//
// exits 0 and prints the event's type and id when the signature is good, 1 otherwise.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Tolerance is how far a webhook-timestamp may be from now: older deliveries are refused, so
// that a captured request cannot be replayed later.
const Tolerance = 5 * time.Minute

// Verify reports whether body, received with header, was signed with secret (the client's
// signing_secret, whsec_<base64>) within Tolerance of now. Pass the body exactly as received,
// before any JSON decoding. During a secret rotation the header holds two signatures; one
// matching is enough.
func Verify(secret string, header http.Header, body []byte, now time.Time) error {
	raw, ok := strings.CutPrefix(secret, "whsec_")
	if !ok {
		return errors.New("secret is not whsec_<base64>")
	}
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return fmt.Errorf("secret is not whsec_<base64>: %w", err)
	}
	id, ts := header.Get("webhook-id"), header.Get("webhook-timestamp")
	sent, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("webhook-timestamp is not unix seconds")
	}
	if d := now.Sub(time.Unix(sent, 0)); d > Tolerance || d < -Tolerance {
		return errors.New("webhook-timestamp is too far from now")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(header.Get("webhook-signature")) {
		version, b64, _ := strings.Cut(sig, ",")
		if version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: verify SECRET WEBHOOK_ID WEBHOOK_TIMESTAMP WEBHOOK_SIGNATURE < body")
		os.Exit(2)
	}
	body, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	header := http.Header{}
	header.Set("webhook-id", os.Args[2])
	header.Set("webhook-timestamp", os.Args[3])
	header.Set("webhook-signature", os.Args[4])
	if err := Verify(os.Args[1], header, body, time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, "rejected:", err)
		os.Exit(1)
	}
	var event struct{ ID, Type string }
	if err := json.Unmarshal(body, &event); err != nil {
		fmt.Fprintln(os.Stderr, "rejected: body is not JSON:", err)
		os.Exit(1)
	}
	fmt.Println("verified", event.Type, event.ID)
}
