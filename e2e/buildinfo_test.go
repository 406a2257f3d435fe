package e2e_test

import (
	"io"
	"net/http"
	"regexp"
	"testing"
)

// A running locks process says which build it is on /metrics, as the same build's
// `locks version` does.
func TestBuildInfoOnMetrics(t *testing.T) {
	t.Parallel()
	s := start(t)
	resp, err := http.Get("http://" + s.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^locks_build_info\{revision="[^"]*",version="[^"]+"\} 1$`).Match(b) {
		t.Errorf("/metrics has no locks_build_info{revision,version} 1:\n%s", b)
	}
}
