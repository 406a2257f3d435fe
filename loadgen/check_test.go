package loadgen

import (
	"strings"
	"testing"
	"time"
)

// A connection_lost counts as false only when it came before the sensor's last published
// reading + lost_after: sensors stop with the run, each at its own last reading, so one
// whose last reading was well before the end is rightly lost before end + lost_after.
func TestCheckLostAgainstEachSensorsLastReading(t *testing.T) {
	end := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	lostAfter := time.Minute
	books := Books{Changes: 0, End: end, Silent: []string{"s0"},
		LastAt: map[string]time.Time{"s0": end.Add(-150 * time.Second), "s1": end.Add(-33 * time.Second), "s2": end.Add(-1 * time.Second)}}
	for _, tc := range []struct {
		name   string
		lostAt map[string]time.Time
		want   string // a problem that must be reported; "" for none
	}{
		{"fleet stopping", map[string]time.Time{"s0": end.Add(-80 * time.Second), "s1": end.Add(30 * time.Second), "s2": end.Add(62 * time.Second)}, ""},
		{"lost while still fed", map[string]time.Time{"s0": end.Add(-80 * time.Second), "s1": end.Add(20 * time.Second)}, "sensor s1 kept reporting"},
		{"lost before its last reading", map[string]time.Time{"s0": end.Add(-80 * time.Second), "s2": end.Add(-10 * time.Second)}, "sensor s2 kept reporting"},
		{"silent never lost", map[string]time.Time{}, "silent sensor s0: 0 connection_lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tally := Tally{ByType: map[string]int64{}, Lost: map[string]int64{}, LostAt: tc.lostAt}
			for id := range tc.lostAt {
				tally.Lost[id] = 1
			}
			problems := Check(books, tally, lostAfter, true)
			joined := strings.Join(problems, "\n")
			if tc.want == "" && len(problems) > 0 {
				t.Fatalf("problems reported for a balanced run:\n%s", joined)
			}
			if tc.want != "" && !strings.Contains(joined, tc.want) {
				t.Fatalf("want a problem containing %q, got:\n%s", tc.want, joined)
			}
		})
	}
}
