package main

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// memLimitShare is the part of a cgroup's memory limit given to the Go heap's soft limit
// when GOMEMLIMIT is not set: the rest is for the embedded NATS server's buffers, stacks and
// what the runtime does not count.
const memLimitShare = 0.8

// cgroupMemoryFiles are where a memory limit is read: cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// setMemoryLimit gives the runtime a soft memory limit when GOMEMLIMIT is not set and the
// process runs in a cgroup with a memory limit: with `locks run`'s GOGC of 400 and no limit,
// the heap may grow to five times what is live, and a container's OOM killer ends it.
// GOMEMLIMIT, when set, is the runtime's own and wins. It returns the limit set (0: none).
func setMemoryLimit(getenv func(string) string, files []string) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := cgroupMemoryLimit(files)
	if limit <= 0 {
		return 0
	}
	soft := int64(float64(limit) * memLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}

// cgroupMemoryLimit is the first finite limit found in files, or 0.
func cgroupMemoryLimit(files []string) int64 {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		// cgroup v1 says "no limit" with a number near the largest page-aligned int64.
		if err != nil || n <= 0 || n >= math.MaxInt64/2 {
			return 0
		}
		return n
	}
	return 0
}
