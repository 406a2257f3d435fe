package bridge

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// brokerHeaders are added by RabbitMQ itself on redelivery or dead-lettering; they must not
// make a redelivered message look new.
func brokerHeader(k string) bool {
	return k == "x-delivery-count" || k == "x-death" || strings.HasPrefix(k, "x-first-death-") ||
		strings.HasPrefix(k, "x-last-death-")
}

// MessageID is the Nats-Msg-Id of a delivery: its message_id when it has one, otherwise a
// digest of the body and of the properties a sender sets (timestamp, headers, correlation
// id, type, app id), so a redelivery gets the same id and two sends of the same body at
// different timestamps get different ones.
func MessageID(d amqp.Delivery) string {
	if d.MessageId != "" {
		return d.MessageId
	}
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(string(d.Body))
	if !d.Timestamp.IsZero() {
		field(d.Timestamp.UTC().Format(time.RFC3339Nano))
	} else {
		field("")
	}
	field(d.CorrelationId)
	field(d.Type)
	field(d.AppId)
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		if !brokerHeader(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		field(k)
		writeValue(h, d.Headers[k])
	}
	return "sha256:" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:18])
}

func writeValue(h hash.Hash, v any) {
	// %T and %v are deterministic for every AMQP table type (maps print sorted).
	s := fmt.Sprint(v) // the same text as %v, formatted once
	fmt.Fprintf(h, "%d:%T=%s;", len(s), v, s)
}
