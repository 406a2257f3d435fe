// Package crashpoint lets crash tests kill a process at the worst moment of its work: a
// part calls Hit("state.after_commit") at that moment, and a test that starts the part in a
// child process with LOCKS_CRASHPOINT=state.after_commit (optionally "name:N" for the N-th
// hit) sees it die there with exit code 137, as a SIGKILL would leave it: no deferred call,
// no flush, no ack. The child arms it at its start (ArmFromEnv; testenv.ChildMain does);
// nothing reads the environment by itself. Unarmed, Hit costs one atomic load.
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

// point is an armed crash point: the process dies at its after-th hit.
type point struct {
	name  string
	after int64
	hits  atomic.Int64
}

var armed atomic.Pointer[point]

// Arm arms the crash point spec, "name" or "name:N" (die at the N-th hit); "" disarms.
func Arm(spec string) {
	if spec == "" {
		armed.Store(nil)
		return
	}
	name, count, ok := strings.Cut(spec, ":")
	p := &point{name: name, after: 1}
	if ok {
		if c, err := strconv.ParseInt(count, 10, 64); err == nil && c > 0 {
			p.after = c
		}
	}
	armed.Store(p)
}

// ArmFromEnv arms the crash point named by the Env variable, if any.
func ArmFromEnv() { Arm(os.Getenv(Env)) }

// Hit kills the process if it is the armed crash point's after-th hit.
func Hit(name string) {
	p := armed.Load()
	if p == nil || name != p.name {
		return
	}
	if p.hits.Add(1) >= p.after {
		os.Exit(ExitCode)
	}
}
