package testenv

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// Parallel lets up to n of a package's parallel tests run at once, unless the command line
// sets -test.parallel. go test's default, GOMAXPROCS, suits tests that compute; tests that
// spend their time waiting on servers and timers (a TTL, lost_after, a retry delay, a node's
// restart) can wait side by side, each on its own servers and databases. Call it first in
// TestMain.
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && n > runtime.GOMAXPROCS(0) {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// Main is a TestMain that runs the tests with Parallel(n).
func Main(m *testing.M, n int) {
	Parallel(n)
	os.Exit(m.Run())
}
