package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

var builds sync.Map // command directory → *built

type built struct {
	once sync.Once
	path string
	err  error
}

// Build is BuildBinary for a test: it fails t when the build fails.
func Build(t testing.TB, dir string) string {
	t.Helper()
	bin, err := BuildBinary(dir)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// BuildBinary builds the command in dir (relative to the repository root, such as
// "./cmd/locks") into a directory that the test binaries of this checkout share, and returns
// the executable's path (named as dir's last element). go build leaves an executable whose build ID
// matches the sources alone, so the packages of one `go test ./...` that all run `locks` link
// it once, not once each; an edit to the sources relinks it. Builds of one checkout take
// turns (a lock file); each test binary builds a package once.
func BuildBinary(dir string) (string, error) {
	v, _ := builds.LoadOrStore(dir, &built{})
	b := v.(*built)
	b.once.Do(func() { b.path, b.err = build(dir) })
	return b.path, b.err
}

// ReleaseVersion and ReleaseRevision are what BuildRelease stamps into the binary.
const (
	ReleaseVersion  = "0.1.0-test"
	ReleaseRevision = "0123456789abcdef0123456789abcdef01234567"
)

var release built

// BuildRelease builds ./cmd/locks as the container image builds it (deploy/container's
// Containerfile: CGO off, -trimpath, -s -w, the version and revision set with -X, here
// ReleaseVersion and ReleaseRevision) and returns its path. Like BuildBinary it is linked
// once for the packages of one run that need it.
func BuildRelease(t testing.TB) string {
	t.Helper()
	release.once.Do(func() {
		release.path, release.err = buildAs("./cmd/locks", "locks-release", []string{"CGO_ENABLED=0", "GOOS=linux"},
			"-trimpath", "-ldflags", "-s -w -X main.version="+ReleaseVersion+" -X main.revision="+ReleaseRevision)
	})
	if release.err != nil {
		t.Fatal(release.err)
	}
	return release.path
}

func build(cmdDir string) (string, error) {
	// Without DWARF (-w): a test runs the binary, nobody debugs it, and the link is shorter.
	// -trimpath, like the test binaries: compiled packages do not depend on where the checkout
	// is, so a fresh clone reuses the build cache.
	return buildAs(cmdDir, filepath.Base(cmdDir), nil, "-trimpath", "-ldflags=-w")
}

// buildAs builds the command in cmdDir as name in the checkout's shared directory, with env
// added to the environment and flags before the package.
func buildAs(cmdDir, name string, env []string, flags ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	// One directory per checkout: two worktrees at different commits never relink each other's
	// binaries. Under the temporary directory, the file system of go build's work directory,
	// so that a relink renames the new executable over the old one (a running process keeps
	// its file) instead of writing into a busy one.
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), "locks-test-bin-"+hex.EncodeToString(sum[:6]))
	unlock, err := lockDir(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	bin := filepath.Join(dir, name)
	var out bytes.Buffer
	cmd := exec.Command("go", append(append([]string{"build", "-o", bin}, flags...), cmdDir)...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, &out, &out
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", cmdDir, err, out.String())
	}
	return bin, nil
}

// lockDir creates dir if missing and waits for its lock (the file build.lock in it), which
// processes take in turns; the returned func gives it back.
func lockDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
