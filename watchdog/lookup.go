package watchdog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

const (
	// lookupBatch is how many due expiries a settle worker takes at once: their sensors'
	// last messages come in one batched direct get (the server answers at most 1024).
	lookupBatch = 128
	// lookupTimeout bounds one batched direct get.
	lookupTimeout = 10 * time.Second
)

// lastMsgs is, per sensor, its last message in READINGS (none: nothing was ever stored for
// it), read with one batched direct get (multi_last) instead of a request per expiry: in a
// burst of expiries these lookups were one of the two round trips of every settle.
func (w *Watchdog) lastMsgs(ctx context.Context, sensors []string) (map[string]*jetstream.RawStreamMsg, error) {
	bySubject := make(map[string]string, len(sensors))
	subjects := make([]string, 0, len(sensors))
	for _, s := range sensors {
		subj := natsx.ReadingsStoredSubject(partition.Of(s, w.cfg.PartitionCount), s)
		bySubject[subj] = s
		subjects = append(subjects, subj)
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	msgs, err := jetstreamext.GetLastMsgsFor(ctx, w.js, natsx.ReadingsStream, subjects)
	if err != nil {
		return nil, fmt.Errorf("last READINGS messages of %d sensors: %w", len(sensors), err)
	}
	out := make(map[string]*jetstream.RawStreamMsg, len(sensors))
	// The iterator also ends quietly on a timeout or a closed subscription, which must not
	// pass for "these sensors have no message" (their expiries would be dropped): the answer
	// is complete only with its last message, the one nothing is pending after.
	complete := false
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			complete = true // none of them has any
			break
		}
		if err != nil {
			return nil, fmt.Errorf("last READINGS messages of %d sensors: %w", len(sensors), err)
		}
		if s, ok := bySubject[m.Subject]; ok {
			out[s] = m
		}
		complete = m.Header.Get(numPendingHeader) == "0"
	}
	if !complete {
		return nil, fmt.Errorf("last READINGS messages of %d sensors: %w", len(sensors), errIncompleteLookup)
	}
	return out, nil
}

// numPendingHeader is what a batched direct get says is left to send after each message.
const numPendingHeader = "Nats-Num-Pending"

// errIncompleteLookup is a batched direct get whose answer stopped before its last message.
var errIncompleteLookup = errors.New("the answer ended before its last message")
