package part

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/lock-sensors/lock-sensors"

// parts are the module's parts: each is read, tested, deployed and scaled alone, so none
// imports another (they meet in the log and the databases); cmd/locks alone wires them.
var parts = []string{
	"alerter", "api", "bridge", "notifier", "watchdog", "ui",
	"projector/state", "projector/history", "projector/rebuild",
}

// libraries are the packages outside internal/ that parts may import besides internal/*.
var libraries = []string{"history", "migrations", "proto/locks/v1"}

// outside are the trees that are neither parts nor libraries: commands, deployment, docs
// and the end-to-end tests, which may import anything; loadgen is the command's load
// generator.
var outside = []string{"cmd/", "deploy/", "docs", "e2e", "loadgen", "proto"}

// TestPartsDoNotImportParts reads the module's packages with `go list` and fails when a
// part imports another part, when a package under internal/ imports a part, or when a
// package is none of a part, a library, internal/ or a command (a new part must be listed).
// Test files are left out: a part's tests may run other parts as real neighbours.
func TestPartsDoNotImportParts(t *testing.T) {
	t.Parallel()
	pkgs := listPackages(t)
	if len(pkgs) < len(parts) {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	isPart := func(p string) bool { return slices.Contains(parts, p) }
	found := map[string]bool{}
	for _, p := range pkgs {
		rel, ok := strings.CutPrefix(p.ImportPath, module+"/")
		if !ok {
			continue // the module's root, if it ever has a package
		}
		var local []string
		for _, imp := range p.Imports {
			if r, ok := strings.CutPrefix(imp, module+"/"); ok {
				local = append(local, r)
			}
		}
		switch {
		case isPart(rel):
			found[rel] = true
			for _, imp := range local {
				if isPart(imp) {
					t.Errorf("part %s imports part %s: share it through internal/ instead", rel, imp)
				}
			}
		case strings.HasPrefix(rel, "internal/"), slices.Contains(libraries, rel):
			for _, imp := range local {
				if isPart(imp) || strings.HasPrefix(imp, "cmd/") {
					t.Errorf("%s imports %s: internal/ and the libraries know no part", rel, imp)
				}
			}
		case !slices.ContainsFunc(outside, func(o string) bool { return strings.HasPrefix(rel, o) }):
			t.Errorf("package %s is neither a part, a library nor a command: list it in parts or libraries", rel)
		}
	}
	for _, p := range parts {
		if !found[p] {
			t.Errorf("part %s not found by go list", p)
		}
	}
}

// listed is what `go list -json` says of a package, the fields read.
type listed struct {
	ImportPath string
	Imports    []string
}

// listPackages lists the module's packages.
func listPackages(t *testing.T) []listed {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the packages: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), goCmd, "list", "-json=ImportPath,Imports", module+"/...")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v: %s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
}
