package clock

import (
	"testing"
	"time"
)

type fixed time.Time

func (f fixed) Now() time.Time { return time.Time(f) }

func TestOr(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if got := Or(fixed(at)).Now(); !got.Equal(at) {
		t.Fatalf("Or(fixed).Now() = %v, want %v", got, at)
	}
	before := time.Now()
	if got := Or(nil).Now(); got.Before(before) || got.Sub(before) > time.Minute {
		t.Fatalf("Or(nil).Now() = %v, want the system time near %v", got, before)
	}
}
