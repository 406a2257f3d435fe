package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// readmeSection is the README's section with the newcomer's walk-through.
const readmeSection = "## First five minutes"

// readmeBlocks are the fenced blocks of the section, by language (```sh, ```text).
func readmeBlocks(t *testing.T) map[string][][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n"+readmeSection+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", readmeSection)
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	blocks := map[string][][]string{}
	var lang string
	var cur []string
	in := false
	for _, line := range strings.Split(sec, "\n") {
		switch {
		case !in && strings.HasPrefix(line, "```"):
			in, lang, cur = true, strings.TrimPrefix(line, "```"), nil
		case in && line == "```":
			in = false
			blocks[lang] = append(blocks[lang], cur)
		case in:
			cur = append(cur, line)
		}
	}
	if in {
		t.Fatalf("README.md, %s: a fenced block is not closed", readmeSection)
	}
	return blocks
}

// Issue 24's must-show: the README's walk-through, run literally. The first ```sh block
// starts the system (`go tool task up` with the variables it sets, which are given to the
// `locks run` started here); the other ```sh blocks run as one bash script, as a newcomer
// pastes them, in a directory whose bin/locks is this binary. What is per test comes from
// the variables the README's commands read (the API's address, the queue) and the token
// file `go tool task up` keeps; the receiver's port 9999 becomes a free one. The receiver
// must print both verified webhooks, as the ```text block shows them.
func TestReadmeFirstFiveMinutes(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t)
	sh := blocks["sh"]
	if len(sh) < 2 {
		t.Fatalf("README.md, %s: want a ```sh block starting the system and more with the walk-through, got %d", readmeSection, len(sh))
	}

	// The system, with what the README sets on `go tool task up`.
	if len(sh[0]) != 1 || !strings.HasSuffix(sh[0][0], "go tool task up") {
		t.Fatalf("README.md, %s: the first ```sh block should be the one line `[VAR=value …] go tool task up`, got %q", readmeSection, sh[0])
	}
	var sysEnv []string
	for _, w := range strings.Fields(strings.TrimSuffix(sh[0][0], "go tool task up")) {
		if !regexp.MustCompile(`^LOCKS_[A-Z_]+=\S+$`).MatchString(w) {
			t.Fatalf("README.md, %s: %q before go tool task up is not a LOCKS_ variable", readmeSection, w)
		}
		sysEnv = append(sysEnv, w)
	}
	s := startCLISystem(t, sysEnv...)

	// The newcomer's directory: bin/locks and the token file of `go tool task up`.
	dir := t.TempDir()
	self, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\nLOCKS_TEST_MAIN=1 exec " + shellQuote(self) + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "bin", "locks"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, ".locks"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".locks", "api-token"), []byte(s.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	var script strings.Builder
	script.WriteString("set -e\n")
	for _, b := range sh[1:] {
		for _, line := range b {
			script.WriteString(line + "\n")
		}
	}
	const readmePort = "127.0.0.1:9999"
	if !strings.Contains(script.String(), readmePort) {
		t.Fatalf("README.md, %s: the walk-through no longer uses %s; update this test", readmeSection, readmePort)
	}
	text := strings.ReplaceAll(script.String(), readmePort, testenv.FreeAddr(t))

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", text)
	cmd.Dir = dir
	cmd.Env = cliEnv([]string{
		"LOCKS_HTTP_ADDR=" + s.httpAddr, // as the system's: `locks` calls the API there
		"LOCKS_AMQP_URL=" + s.rabbit.URL,
		"LOCKS_AMQP_QUEUE=" + s.rabbit.Queue,
	})
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("the walk-through:\n%s\nprinted:\n%s", text, out)
	if err != nil {
		t.Fatalf("the walk-through failed: %v", err)
	}

	// Both webhooks verified, as the README shows them.
	var shown []string
	for _, b := range blocks["text"] {
		for _, line := range b {
			if strings.HasPrefix(line, "verified") {
				shown = append(shown, line)
			}
		}
	}
	if len(shown) != 2 {
		t.Fatalf("README.md, %s: want a ```text block with the receiver's two verified lines, got %q", readmeSection, shown)
	}
	for _, line := range shown {
		re := regexp.MustCompile("(?m)^" + strings.ReplaceAll(regexp.QuoteMeta(line), "…", `\S+`) + "$")
		if !re.Match(out) {
			t.Errorf("the receiver did not print the README's line\n%s", line)
		}
	}
}
