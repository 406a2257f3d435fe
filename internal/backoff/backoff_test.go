package backoff

import (
	"context"
	"testing"
	"time"
)

func TestPolicyNext(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		p       Policy
		attempt int
		want    time.Duration
	}{
		{Policy{}, 1, 100 * ms},
		{Policy{}, 2, 200 * ms},
		{Policy{}, 6, 3200 * ms},
		{Policy{}, 7, 5 * time.Second},
		{Policy{}, 1000, 5 * time.Second},
		{Policy{Min: 250 * ms, Max: 10 * time.Second}, 0, 250 * ms},
		{Policy{Min: 250 * ms, Max: 10 * time.Second}, 3, time.Second},
		{Policy{Min: 250 * ms, Max: 10 * time.Second}, 7, 10 * time.Second},
		{Policy{Min: time.Second, Max: ms}, 3, time.Second}, // Max below Min: Min
	}
	for _, tt := range tests {
		if got := tt.p.Next(tt.attempt); got != tt.want {
			t.Errorf("%+v.Next(%d) = %v, want %v", tt.p, tt.attempt, got, tt.want)
		}
	}
}

func TestBackoffCountsAndResets(t *testing.T) {
	t.Parallel()
	b := New(time.Millisecond, 4*time.Millisecond)
	for i, want := range []time.Duration{1, 2, 4, 4} {
		if got := b.Delay(); got != want*time.Millisecond {
			t.Fatalf("delay %d = %v, want %v", i, got, want*time.Millisecond)
		}
		if !b.Wait(t.Context()) {
			t.Fatal("Wait returned false with a live context")
		}
	}
	if b.Fails() != 4 {
		t.Fatalf("fails %d, want 4", b.Fails())
	}
	b.Reset()
	if b.Delay() != time.Millisecond {
		t.Fatalf("after Reset the delay is %v", b.Delay())
	}
}

func TestSleepCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep of an hour with a cancelled context reported the whole delay")
	}
	if !Sleep(t.Context(), 0) {
		t.Fatal("Sleep(0) with a live context is false")
	}
}
