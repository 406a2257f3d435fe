package watchdog

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLastMsgs reads the last READINGS messages of several sensors in one batched get: the
// newest of each that has any, nothing for one that has none, and an error, never an empty
// answer, when the answer does not arrive in time (which would drop those expiries).
func TestLastMsgs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, lostAfter)
	w, _ := e.handDriven(lostAfter)
	e.reading("one")
	e.reading("two")
	newest := e.reading("two")
	got, err := w.lastMsgs(t.Context(), []string{"one", "two", "never"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["one"] == nil || got["two"] == nil {
		t.Fatalf("got %v, want the last messages of one and two only", got)
	}
	if !got["two"].Time.After(newest.Add(-time.Second)) || got["two"].Sequence <= got["one"].Sequence {
		t.Errorf("two: sequence %d at %s, want its newest reading (after one's, %d)", got["two"].Sequence, got["two"].Time, got["one"].Sequence)
	}
	if got, err := w.lastMsgs(t.Context(), []string{"never"}); err != nil || len(got) != 0 {
		t.Errorf("a sensor without messages: %v %v, want an empty answer", got, err)
	}
	late, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Millisecond))
	defer cancel()
	if got, err := w.lastMsgs(late, []string{"one", "two"}); !errors.Is(err, errIncompleteLookup) {
		t.Errorf("an answer cut short: %v %v, want errIncompleteLookup", got, err)
	}
}
