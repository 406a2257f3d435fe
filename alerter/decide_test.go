package alerter

import (
	"slices"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/procs"
)

// TestTransitionsOf is the fire/resolve decision of one evaluation.
func TestTransitionsOf(t *testing.T) {
	t.Parallel()
	c := condition{summary: "holds"}
	for _, tc := range []struct {
		name    string
		firing  map[string]int64
		conds   map[string]condition
		still   map[string]int64
		resolve []int64
		fire    []string
	}{
		{"nothing firing, nothing holds", nil, nil, map[string]int64{}, nil, nil},
		{"a new condition fires", nil, map[string]condition{"client/a": c}, map[string]int64{}, nil, []string{"client/a"}},
		{"a firing one that still holds stays, silently", map[string]int64{"client/a": 7}, map[string]condition{"client/a": c}, map[string]int64{"client/a": 7}, nil, nil},
		{"a firing one that no longer holds resolves", map[string]int64{"client/a": 7}, nil, map[string]int64{}, []int64{7}, nil},
		{"mixed, in subject order", map[string]int64{"client/b": 2, "client/a": 1, "client/c": 3},
			map[string]condition{"client/c": c, "client/e": c, "client/d": c},
			map[string]int64{"client/c": 3}, []int64{1, 2}, []string{"client/d", "client/e"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := transitionsOf(tc.firing, tc.conds)
			if len(tr.still) != len(tc.still) || !slices.Equal(tr.resolve, tc.resolve) || !slices.Equal(tr.fire, tc.fire) {
				t.Fatalf("transitionsOf = %+v, want still %v resolve %v fire %v", tr, tc.still, tc.resolve, tc.fire)
			}
			for s, id := range tc.still {
				if tr.still[s] != id {
					t.Fatalf("still[%s] = %d, want %d", s, tr.still[s], id)
				}
			}
		})
	}
}

// TestSetAsideFiring: a new record fires at once (even after the quiet time, e.g. the
// alerter was down); an alerted one keeps firing until quiet has passed without another.
func TestSetAsideFiring(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	const quiet = 10 * time.Minute
	for _, tc := range []struct {
		name      string
		seq, mark int64
		age       time.Duration
		want      bool
	}{
		{"new record, fresh", 5, 0, time.Second, true},
		{"new record, older than quiet", 5, 4, time.Hour, true},
		{"alerted, still within quiet", 5, 5, quiet - time.Second, true},
		{"alerted, quiet has passed", 5, 5, quiet, false},
		{"alerted long ago", 5, 9, 24 * time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := setAsideFiring(tc.seq, tc.mark, now.Add(-tc.age), now, quiet); got != tc.want {
				t.Fatalf("setAsideFiring = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMassLost: enough sensors lost together, and more than the share of all.
func TestMassLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		total, group int64
		min          int
		share        float64
		want         bool
	}{
		{"no sensors", 0, 0, 1, 0.5, false},
		{"half lost, share is half: not more than", 100, 50, 10, 0.5, false},
		{"just over the share", 100, 51, 10, 0.5, true},
		{"over the share but under the minimum", 10, 9, 10, 0.5, false},
		{"at the minimum", 10, 10, 10, 0.5, true},
		{"a few of many", 10000, 20, 10, 0.5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := massLost(tc.total, tc.group, tc.min, tc.share); got != tc.want {
				t.Fatalf("massLost = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestStoppedProcesses: stale entries fire unless a fresh process on the same host,
// started after the stale one's last report, runs all of its parts (a restart).
func TestStoppedProcesses(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	const stale = time.Minute
	old := procs.Info{ID: "old", Host: "h1", Parts: []string{"state", "notifier"}, StartedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-5 * time.Minute)}
	proc := func(id, host string, startedAgo, updatedAgo time.Duration, parts ...string) procs.Info {
		return procs.Info{ID: id, Host: host, Parts: parts, StartedAt: now.Add(-startedAgo), UpdatedAt: now.Add(-updatedAgo)}
	}
	for _, tc := range []struct {
		name string
		ps   []procs.Info
		want []string
	}{
		{"fresh only", []procs.Info{proc("a", "h1", time.Hour, time.Second, "state")}, nil},
		{"exactly stale", []procs.Info{proc("a", "h1", time.Hour, stale, "state")}, []string{"a"}},
		{"stale, alone", []procs.Info{old}, []string{"old"}},
		{"restarted on the same host with the same parts", []procs.Info{old, proc("new", "h1", time.Minute, time.Second, "notifier", "state", "api")}, nil},
		{"restarted with fewer parts", []procs.Info{old, proc("new", "h1", time.Minute, time.Second, "state")}, []string{"old"}},
		{"fresh process on another host", []procs.Info{old, proc("new", "h2", time.Minute, time.Second, "state", "notifier")}, []string{"old"}},
		{"fresh process started before the last report", []procs.Info{old, proc("new", "h1", 10*time.Minute, time.Second, "state", "notifier")}, []string{"old"}},
		{"replacement itself stale", []procs.Info{old, proc("new", "h1", 4*time.Minute, 2*time.Minute, "state", "notifier")}, []string{"old", "new"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, p := range stoppedProcesses(tc.ps, now, stale) {
				got = append(got, p.ID)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("stoppedProcesses = %v, want %v", got, tc.want)
			}
		})
	}
}
