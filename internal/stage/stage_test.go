package stage

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPartsShareOneHistogram(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := New(reg, Append)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(reg, State)
	if err != nil {
		t.Fatalf("a second part of the same process: %v", err)
	}
	t0 := time.Now()
	a.Between(t0, t0.Add(3*time.Millisecond))
	s.Between(t0, t0.Add(40*time.Millisecond))
	s.Between(t0, t0.Add(-time.Second)) // a clock that disagrees: not observed
	s.Between(time.Time{}, t0)          // no start: not observed
	var zero Observer                   // a part built without metrics
	zero.Since(t0)
	if n := testutil.CollectAndCount(reg, "locks_stage_seconds"); n != len(names) {
		t.Fatalf("%d series, want one per stage (%d)", n, len(names))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	sums := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			st := m.GetLabel()[0].GetValue()
			counts[st], sums[st] = m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
		}
	}
	if counts[Append] != 1 || counts[State] != 1 || counts[Claim] != 0 {
		t.Fatalf("counts %v, want append 1, state 1, claim 0", counts)
	}
	if sums[State] < 0.039 || sums[State] > 0.041 {
		t.Fatalf("state sum %v, want 0.040", sums[State])
	}
}
