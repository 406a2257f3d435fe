// Package docs holds the documentation; its test checks the links of every Markdown file of the
// repository, so that a moved section or file breaks the build instead of a reader's click.
package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	heading  = regexp.MustCompile(`(?m)^#+ (.*)$`)
	fence    = regexp.MustCompile("(?ms)^```.*?^```")
	link     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	notInRef = regexp.MustCompile(`[^\w\- ]`)
)

// slug is GitHub's anchor of a heading.
func slug(h string) string {
	return strings.ReplaceAll(notInRef.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
}

// Every relative link of every Markdown file leads to a file of the repository, and to a heading
// of it when it names one; nothing points outside the repository.
func TestMarkdownLinksStayInTheRepository(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	texts := map[string]string{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "bench-out") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		texts[p] = string(b)
		anchors[p] = map[string]bool{}
		for _, h := range heading.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
			anchors[p][slug(h[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(texts) < 5 {
		t.Fatalf("%d Markdown files under %s: the walk went wrong", len(texts), root)
	}
	for p, text := range texts {
		rel, _ := filepath.Rel(root, p)
		if strings.Contains(text, "../shared") {
			t.Errorf("%s points to ../shared, outside the repository", rel)
		}
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := p
			if file != "" {
				dest = filepath.Join(filepath.Dir(p), file)
			}
			if r, err := filepath.Rel(root, dest); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s: link %s leaves the repository", rel, target)
				continue
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: link %s: no such file", rel, target)
				continue
			}
			if anchor != "" && anchors[dest] != nil && !anchors[dest][anchor] {
				t.Errorf("%s: link %s: no heading #%s there", rel, target, anchor)
			}
		}
	}
}
