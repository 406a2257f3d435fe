package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Jaeger is a real Jaeger all-in-one (the version deploy/jaeger/go.mod pins, with
// deploy/jaeger/config.yaml) on free loopback ports, for the test.
type Jaeger struct {
	// OTLPHTTP and OTLPGRPC are OTEL_EXPORTER_OTLP_ENDPOINT values for each protocol.
	OTLPHTTP, OTLPGRPC string
	// Query is the base URL of Jaeger's query API (and UI).
	Query string
}

// StartJaeger builds Jaeger once (JaegerBinary) and runs it until the test ends.
func StartJaeger(t testing.TB) *Jaeger {
	t.Helper()
	bin, err := JaegerBinary()
	if err != nil {
		t.Fatalf("Jaeger: %v", err)
	}
	root, _ := repoRoot()
	j := &Jaeger{}
	grpcAddr, httpAddr, queryAddr := FreeAddr(t), FreeAddr(t), FreeAddr(t)
	j.OTLPGRPC, j.OTLPHTTP, j.Query = "http://"+grpcAddr, "http://"+httpAddr, "http://"+queryAddr
	cmd := exec.Command(bin, "--config", filepath.Join(root, "deploy", "jaeger", "config.yaml"))
	cmd.Env = append(os.Environ(), "JAEGER_OTLP_GRPC="+grpcAddr, "JAEGER_OTLP_HTTP="+httpAddr,
		"JAEGER_QUERY_HTTP="+queryAddr, "JAEGER_QUERY_GRPC="+FreeAddr(t))
	log := &LogBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("jaeger log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(j.Query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return j
			}
		}
		select {
		case <-exited:
			t.Fatalf("jaeger exited before it was ready:\n%s", log.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger not ready within 60 s:\n%s", log.String())
		}
	}
}

// JaegerTrace is one trace as Jaeger's query API returns it.
type JaegerTrace struct {
	TraceID string       `json:"traceID"`
	Spans   []JaegerSpan `json:"spans"`
}

// JaegerSpan is one span of a JaegerTrace; times in microseconds.
type JaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64 `json:"startTime"`
	Duration  int64 `json:"duration"`
	Tags      []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

// Tag is the span's tag key as text ("" when absent).
func (s JaegerSpan) Tag(key string) string {
	for _, tg := range s.Tags {
		if tg.Key == key {
			return fmt.Sprint(tg.Value)
		}
	}
	return ""
}

// Parent is the span id of the span's CHILD_OF reference ("" for a root).
func (s JaegerSpan) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Trace asks Jaeger's query API for one trace; nil while Jaeger has none of that id.
func (j *Jaeger) Trace(ctx context.Context, traceID string) (*JaegerTrace, error) {
	data, err := j.traces(ctx, "/api/traces/"+traceID)
	if err != nil || len(data) == 0 {
		return nil, err
	}
	return &data[0], nil
}

// Operations are the spans named operation of service's traces in the last hour (at most
// 1000 traces), as Jaeger's search finds them.
func (j *Jaeger) Operations(ctx context.Context, service, operation string) ([]JaegerSpan, error) {
	q := url.Values{"service": {service}, "operation": {operation}, "lookback": {"1h"}, "limit": {"1000"}}
	data, err := j.traces(ctx, "/api/traces?"+q.Encode())
	if err != nil {
		return nil, err
	}
	var spans []JaegerSpan
	for _, tr := range data {
		for _, sp := range tr.Spans {
			if sp.OperationName == operation {
				spans = append(spans, sp)
			}
		}
	}
	return spans, nil
}

// traces GETs a query path of Jaeger's API that answers traces; none when it answers 404.
func (j *Jaeger) traces(ctx context.Context, path string) ([]JaegerTrace, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	var out struct {
		Data []JaegerTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("GET %s (%s): %w", path, resp.Status, err)
	}
	return out.Data, nil
}

var jaegerBin struct {
	once sync.Once
	path string
	err  error
}

// JaegerBinary is the path of Jaeger's all-in-one at the version deploy/jaeger/go.mod pins,
// built once per machine and kept by version in the Go build cache's directory
// ($GOCACHE/lock-sensors/, which go's own trimming leaves alone; its first build takes
// minutes: the dependency tree is large). LOCKS_TEST_JAEGER_BIN names a binary to use instead.
func JaegerBinary() (string, error) {
	jaegerBin.once.Do(func() { jaegerBin.path, jaegerBin.err = buildJaeger() })
	return jaegerBin.path, jaegerBin.err
}

func buildJaeger() (string, error) {
	if bin := os.Getenv("LOCKS_TEST_JAEGER_BIN"); bin != "" {
		return bin, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	mod := filepath.Join(root, "deploy", "jaeger")
	version, err := jaegerVersion(filepath.Join(mod, "go.mod"))
	if err != nil {
		return "", err
	}
	// Beside the Go build cache, so that CI's cache of it (actions/setup-go's) keeps the
	// binary too; without it, the compiled packages in that cache make a rebuild a link.
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if c := strings.TrimSpace(string(gocache)); err != nil || c == "" || c == "off" {
		return "", fmt.Errorf("go env GOCACHE: %q, %v", c, err)
	}
	dir := filepath.Join(strings.TrimSpace(string(gocache)), "lock-sensors", "jaeger-"+version+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	bin := filepath.Join(dir, "jaeger")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	// One build at a time across the test binaries that want it: the others wait for it.
	unlock, err := lockDir(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	tmp := bin + ".tmp"
	var out bytes.Buffer
	build := exec.Command("go", "build", "-o", tmp, "github.com/jaegertracing/jaeger/cmd/jaeger")
	build.Dir, build.Stdout, build.Stderr = mod, &out, &out
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("go build Jaeger %s in deploy/jaeger: %w\n%s", version, err, out.String())
	}
	return bin, os.Rename(tmp, bin)
}

// jaegerVersion is the version of github.com/jaegertracing/jaeger that go.mod requires.
func jaegerVersion(gomod string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "github.com/jaegertracing/jaeger" {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s requires no github.com/jaegertracing/jaeger", gomod)
}

// rootModule is the module line of the repository's own go.mod.
var rootModule = regexp.MustCompile(`(?m)^module github\.com/lock-sensors/lock-sensors$`)

// repoRoot is the directory of the lock-sensors module's go.mod, above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && rootModule.Match(b) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the lock-sensors repository")
		}
		dir = parent
	}
}
