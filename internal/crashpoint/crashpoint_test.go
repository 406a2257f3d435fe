package crashpoint

import "testing"

func TestArm(t *testing.T) {
	for _, tc := range []struct {
		spec  string
		name  string
		after int64
	}{
		{"state.after_commit", "state.after_commit", 1},
		{"state.after_commit:15", "state.after_commit", 15},
		{"x:0", "x", 1},
		{"x:bad", "x", 1},
	} {
		Arm(tc.spec)
		p := armed.Load()
		if p == nil || p.name != tc.name || p.after != tc.after {
			t.Fatalf("Arm(%q) = %+v, want %s after %d", tc.spec, p, tc.name, tc.after)
		}
		Hit("another") // not this point: no exit
	}
	Arm("")
	if armed.Load() != nil {
		t.Fatal(`Arm("") left a point armed`)
	}
	Hit("x") // disarmed: no exit
}
