// Package whsign signs webhooks the Standard Webhooks way (docs/contract.md section 2): the
// notifier's client webhooks and the alerter's operator webhook share it, so both verify alike.
package whsign

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrSecret says a client's signing secret is not `whsec_<base64>`.
var ErrSecret = errors.New("signing secret is not whsec_<base64>")

// secretKey is the HMAC key of a `whsec_<base64>` secret.
func secretKey(secret string) ([]byte, error) {
	raw, ok := strings.CutPrefix(secret, "whsec_")
	if !ok {
		return nil, ErrSecret
	}
	k, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(k) == 0 {
		return nil, fmt.Errorf("%w: %v", ErrSecret, err)
	}
	return k, nil
}

// Signature is the webhook-signature header of docs/contract.md section 2 (Standard Webhooks):
// "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>", and during a rotation, while
// previousUntil is after now, the previous secret's signature too, space-separated.
func Signature(secret, previous string, previousUntil time.Time, now time.Time, id string, ts int64, body []byte) (string, error) {
	k, err := secretKey(secret)
	if err != nil {
		return "", err
	}
	sig := sign(k, id, ts, body)
	if previous != "" && previousUntil.After(now) {
		pk, err := secretKey(previous)
		if err != nil {
			return "", fmt.Errorf("previous secret: %w", err)
		}
		sig += " " + sign(pk, id, ts, body)
	}
	return sig, nil
}

func sign(key []byte, id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}
