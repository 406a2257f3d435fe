package partition_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

func TestParse(t *testing.T) {
	t.Parallel()
	cases := []struct {
		spec string
		want partition.Set
		bad  bool
	}{
		{"", partition.All(4), false},
		{"all", partition.All(4), false},
		{"0-1", partition.Set{0, 1}, false},
		{"3,0-1", partition.Set{0, 1, 3}, false},
		{"1/2", partition.Set{1, 3}, false},
		{"0/3", partition.Set{0, 3}, false},
		{"4", nil, true},
		{"2-1", nil, true},
		{"x", nil, true},
		{"2/2", nil, true},
		{"-1", nil, true},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%q", c.spec), func(t *testing.T) {
			got, err := partition.Parse(c.spec, 4)
			if c.bad {
				if err == nil {
					t.Fatalf("Parse(%q) = %v, want error", c.spec, got)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("Parse(%q) = %v, %v; want %v", c.spec, got, err, c.want)
			}
		})
	}
}

func TestSetCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    partition.Set
		n    int
		fail bool
	}{
		{nil, 4, false},
		{partition.Set{0, 3}, 4, false},
		{partition.Set{4}, 4, true},
		{partition.Set{-1}, 4, true},
		{partition.Set{0}, 1, false},
	} {
		if err := tc.s.Check(tc.n); (err != nil) != tc.fail {
			t.Errorf("%v.Check(%d) = %v, want failure %v", tc.s, tc.n, err, tc.fail)
		}
	}
}
