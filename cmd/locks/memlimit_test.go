package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestSetMemoryLimitFromCgroup(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	limited := file("limited", "1073741824\n")
	unlimited := file("max", "max\n")
	v1none := file("v1", "9223372036854771712\n")
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		name   string
		getenv func(string) string
		files  []string
		want   int64
	}{
		{"a 1 GiB cgroup", noEnv, []string{limited}, 858993459},
		{"GOMEMLIMIT wins", func(k string) string {
			if k == "GOMEMLIMIT" {
				return "2GiB"
			}
			return ""
		}, []string{limited}, 0},
		{"cgroup v2 without a limit", noEnv, []string{unlimited, limited}, 0},
		{"cgroup v1 without a limit", noEnv, []string{v1none}, 0},
		{"no cgroup files: the v1 file after a missing v2 one", noEnv, []string{filepath.Join(dir, "missing"), limited}, 858993459},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(old)
			got := setMemoryLimit(tc.getenv, tc.files)
			if got != tc.want {
				t.Fatalf("limit %d, want %d", got, tc.want)
			}
			if cur := debug.SetMemoryLimit(-1); tc.want > 0 && cur != tc.want {
				t.Fatalf("runtime limit %d, want %d", cur, tc.want)
			}
		})
	}
}
