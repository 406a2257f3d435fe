package event_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

func TestIDIsStableAndDistinct(t *testing.T) {
	t.Parallel()
	a, b := event.ID("s1", 1), event.ID("s1", 2)
	if a != event.ID("s1", 1) {
		t.Fatal("ID is not deterministic")
	}
	if a == b || a == event.ID("s11", 1) {
		t.Fatalf("IDs collide: %s %s", a, b)
	}
	if !strings.HasPrefix(a, "evt_") || len(a) != 30 {
		t.Fatalf("ID %q: want evt_ and 26 characters", a)
	}
}

func TestDecodeRefusesUnknownVersion(t *testing.T) {
	t.Parallel()
	if _, err := event.DecodeLog([]byte(`{"v":2,"kind":"reading"}`)); !errors.Is(err, event.ErrVersion) {
		t.Fatalf("v2 log: %v", err)
	}
	if _, err := event.DecodeEvent([]byte(`{"v":0}`)); !errors.Is(err, event.ErrVersion) {
		t.Fatalf("v0 event: %v", err)
	}
	if _, err := event.DecodeLog([]byte(`{"v":1,"kind":"reading","sensor_id":"a","data":1}`)); err != nil {
		t.Fatal(err)
	}
}
