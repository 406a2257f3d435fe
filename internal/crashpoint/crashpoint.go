// Package crashpoint lets crash tests kill a process at the worst moment of its work: a
// part calls Hit("state.after_commit") at that moment, and a test that starts the part in a
// child process with LOCKS_CRASHPOINT=state.after_commit (optionally "name:N" for the N-th
// hit) sees it die there with exit code 137, as a SIGKILL would leave it: no deferred call,
// no flush, no ack. Unset, Hit costs one atomic load.
package crashpoint

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

// Env is the variable naming the crash point of this process.
const Env = "LOCKS_CRASHPOINT"

// ExitCode is what a process killed at a crash point exits with.
const ExitCode = 137

var (
	name  string
	after int64 = 1
	hits  atomic.Int64
	armed atomic.Bool
)

func init() {
	v := os.Getenv(Env)
	if v == "" {
		return
	}
	n, count, ok := strings.Cut(v, ":")
	name = n
	if ok {
		if c, err := strconv.ParseInt(count, 10, 64); err == nil && c > 0 {
			after = c
		}
	}
	armed.Store(true)
}

// Hit kills the process if it is the armed crash point's after-th hit.
func Hit(point string) {
	if !armed.Load() || point != name {
		return
	}
	if hits.Add(1) >= after {
		os.Exit(ExitCode)
	}
}
