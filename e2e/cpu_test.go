package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// natsServerPkg prefixes the functions of the embedded NATS server in a CPU profile.
const natsServerPkg = "github.com/nats-io/nats-server/"

// cpuProfile takes a CPU profile of the process at s.http (LOCKS_PPROF) for d, in the
// background; wait returns it (nil and the error if it could not be taken).
func (s *system) cpuProfile(ctx context.Context, d time.Duration) (wait func() (*profile.Profile, error)) {
	type res struct {
		p   *profile.Profile
		err error
	}
	done := make(chan res, 1)
	go func() {
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.http, max(1, int(d.Seconds())))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			done <- res{nil, err}
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- res{nil, err}
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			done <- res{nil, fmt.Errorf("GET %s: %s", url, resp.Status)}
			return
		}
		p, err := profile.Parse(resp.Body)
		done <- res{p, err}
	}()
	return func() (*profile.Profile, error) { r := <-done; return r.p, r.err }
}

// natsShare is the share of p's CPU samples that ran code of the embedded NATS server: the
// process's CPU is split between `locks` and NATS by it. The garbage collector's background
// work has no such frames and counts as the locks side.
func natsShare(p *profile.Profile) float64 {
	var all, nats int64
	for _, s := range p.Sample {
		all += s.Value[len(s.Value)-1] // cpu nanoseconds (the last value; samples first)
		if inNATS(s) {
			nats += s.Value[len(s.Value)-1]
		}
	}
	if all == 0 {
		return 0
	}
	return float64(nats) / float64(all)
}

func inNATS(s *profile.Sample) bool {
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil && strings.HasPrefix(l.Function.Name, natsServerPkg) {
				return true
			}
		}
	}
	return false
}

// saveProfile writes p to the directory LOCKS_BENCH_CPUPROFILE names, if set, for `go tool
// pprof`: where the time goes.
func saveProfile(b *testing.B, p *profile.Profile) {
	dir := os.Getenv("LOCKS_BENCH_CPUPROFILE")
	if dir == "" || p == nil {
		return
	}
	f, err := os.CreateTemp(dir, strings.NewReplacer("/", "_", "=", "-").Replace(b.Name())+"-*.pprof")
	if err != nil {
		b.Error(err)
		return
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		b.Error(err)
	}
	b.Logf("CPU profile of locks: %s", f.Name())
}
