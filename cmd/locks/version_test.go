package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestFromBuildInfo(t *testing.T) {
	t.Parallel()
	stamped := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "c9a3f7a0c0ffee00c9a3f7a0c0ffee00c9a3f7a0"},
			{Key: "vcs.time", Value: "2026-11-24T00:12:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	cases := []struct {
		name       string
		bi         *debug.BuildInfo
		ok         bool
		ldV, ldRev string
		want       buildInfo
	}{
		{"vcs stamped", stamped, true, "", "",
			buildInfo{"v0.1.0", "c9a3f7a0c0ffee00c9a3f7a0c0ffee00c9a3f7a0", "2026-11-24T00:12:00Z", true, "go1.26.8"}},
		{"ldflags win", stamped, true, "0.1.0", "abc",
			buildInfo{"0.1.0", "abc", "2026-11-24T00:12:00Z", true, "go1.26.8"}},
		{"go run", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, true, "", "",
			buildInfo{Version: "(devel)", GoVersion: "go1.26.8"}},
		{"no build info", nil, false, "", "", buildInfo{Version: "(devel)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := fromBuildInfo(c.bi, c.ok, c.ldV, c.ldRev); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// `locks version` of a binary built as the image builds it (testenv.BuildRelease): the -X
// variables show, and the toolchain's own record (Go version) beside them.
func TestVersionCommandPrintsLdflags(t *testing.T) {
	t.Parallel()
	bin := testenv.BuildRelease(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("locks version: %v: %s", err, out)
	}
	for _, want := range []string{"locks " + testenv.ReleaseVersion + "\n", "revision: " + testenv.ReleaseRevision + "\n", "go: go1."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("locks version printed %q, want a line %q", out, want)
		}
	}
}

// locks_build_info as /metrics exposes it.
func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfoGauge(buildInfo{Version: "0.1.0", Revision: "c9a3f7a"}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if want := `locks_build_info{revision="c9a3f7a",version="0.1.0"} 1`; !strings.Contains(string(b), want) {
		t.Errorf("/metrics has no %s:\n%s", want, b)
	}
}
