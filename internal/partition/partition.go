// Package partition decides which partition of the READINGS log a sensor belongs to and
// parses the partition sets a process owns. The READINGS stream applies the same choice
// itself with the subject transform `partition(n,1)`, so publishers never compute it; this
// function exists so that other parts (EVENTS subjects, the watchdog, tests) agree with the
// server, and a test holds the two together.
package partition

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
)

// Of returns the partition of sensorID among n partitions: FNV-1a 32 of the id modulo n,
// exactly what nats-server's `partition(n,1)` subject transform computes.
func Of(sensorID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(sensorID))
	return int(h.Sum32() % uint32(n))
}

// Set is a sorted list of partitions owned by one process.
type Set []int

// Check fails when a partition of s is not one of n: a set given as a list (a part's
// Config.Partitions) is checked the way Parse checks a spec.
func (s Set) Check(n int) error {
	for _, p := range s {
		if p < 0 || p >= n {
			return fmt.Errorf("partition %d out of range 0-%d", p, n-1)
		}
	}
	return nil
}

// All is every partition of n.
func All(n int) Set {
	s := make(Set, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// Parse reads "" or "all" (every partition), "0-7", "0,2,4-6" or "i/k" (the i-th of k
// equal shares, 0-based) for n partitions.
func Parse(spec string, n int) (Set, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "all" {
		return All(n), nil
	}
	if i, k, ok := strings.Cut(spec, "/"); ok {
		idx, err1 := strconv.Atoi(i)
		cnt, err2 := strconv.Atoi(k)
		if err1 != nil || err2 != nil || cnt < 1 || idx < 0 || idx >= cnt {
			return nil, fmt.Errorf("partition share %q: want i/k with 0 <= i < k", spec)
		}
		var s Set
		for p := idx; p < n; p += cnt {
			s = append(s, p)
		}
		if len(s) == 0 {
			return nil, fmt.Errorf("partition share %q owns nothing of %d partitions", spec, n)
		}
		return s, nil
	}
	seen := map[int]bool{}
	for _, part := range strings.Split(spec, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("partition %q is not a number", lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("partition %q is not a number", hi)
			}
		}
		if a < 0 || b >= n || a > b {
			return nil, fmt.Errorf("partitions %q out of range 0-%d", part, n-1)
		}
		for p := a; p <= b; p++ {
			seen[p] = true
		}
	}
	s := make(Set, 0, len(seen))
	for p := range seen {
		s = append(s, p)
	}
	sort.Ints(s)
	return s, nil
}
