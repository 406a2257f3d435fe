package natsx

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SetAsideStream keeps the log messages a consumer refused (invariant 9): setaside.<consumer>.
const SetAsideStream = "SET_ASIDE"

// SetAsideSubject is where consumer records a message it set aside.
func SetAsideSubject(consumer string) string { return "setaside." + consumer }

// Limits of SET_ASIDE: a flood of bad messages must not fill the disk, so the oldest records
// go first; 30 days is long enough for an operator to notice and look.
const (
	SetAsideMaxAge  = 30 * 24 * time.Hour
	SetAsideMaxMsgs = 1_000_000
	// Records hold a bounded prefix of the message (see internal/setaside), about 2 KiB each; 1 GiB holds half a million.
	SetAsideMaxBytes = 1 << 30
)

func setAsideConfig(c StreamsConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        SetAsideStream,
		Description: "log messages a consumer refused, with the reason, for operators (GET /v1/set-aside)",
		Subjects:    []string{"setaside.*"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      SetAsideMaxAge,
		MaxMsgs:     SetAsideMaxMsgs,
		MaxBytes:    SetAsideMaxBytes,
		Duplicates:  c.Duplicates,
		Replicas:    c.Replicas,
	}
}
