package main

import (
	"bytes"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

func TestConfigMarkdown(t *testing.T) {
	t.Parallel()
	var want, stdout, stderr bytes.Buffer
	if err := config.Markdown(&want); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"config", "--markdown"}, func(string) string { return "" }, &stdout, &stderr); code != 0 {
		t.Fatalf("locks config --markdown: exit %d: %s", code, stderr.String())
	}
	if !bytes.Equal(stdout.Bytes(), want.Bytes()) {
		t.Errorf("locks config --markdown printed something else than config.Markdown:\n%s", stdout.String())
	}
	for _, args := range [][]string{{"config"}, {"config", "--markdown", "extra"}, {"config", "--nope"}} {
		if code := run(args, func(string) string { return "" }, &stdout, &stderr); code != 2 {
			t.Errorf("locks %v: exit %d, want 2 (usage)", args, code)
		}
	}
}
