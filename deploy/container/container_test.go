// Package container holds the image definition of the locks binary (Containerfile); this
// machine cannot pull base images, so its test checks what the image relies on instead.
package container

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The image's final stage has no libc: the binary must be static. Built as the Containerfile
// builds it (CGO off: testenv.BuildRelease), it has no ELF interpreter and no dynamic
// libraries, and it runs.
func TestStaticBinary(t *testing.T) {
	bin := testenv.BuildRelease(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v program header: it is dynamically linked", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs shared libraries %v", libs)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "locks run") {
		t.Fatalf("locks --help: %v: %s", err, out)
	}
}

// The Containerfile keeps the properties the test above cannot see: a build stage with CGO
// off, a distroless or scratch final stage, and a non-root user.
func TestContainerfile(t *testing.T) {
	f, err := os.Open("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var froms []string
	var user string
	cgoOff := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		fields := strings.Fields(line)
		if len(fields) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			froms = append(froms, fields[1])
		case "USER":
			user = fields[1]
		}
		if strings.Contains(line, "CGO_ENABLED=0") {
			cgoOff = true
		}
	}
	if len(froms) < 2 {
		t.Errorf("stages %v: want a build stage and a runtime stage", froms)
	}
	if last := froms[len(froms)-1]; !strings.Contains(last, "distroless/static") && last != "scratch" {
		t.Errorf("final stage %s: want distroless/static or scratch", last)
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("USER %q: want a non-root user", user)
	}
	if !cgoOff {
		t.Error("the build does not set CGO_ENABLED=0")
	}
}

// The image's labels are the OCI ones, and its default VERSION is the release the changelog
// names last and the Helm chart's appVersion: one version, in three places a release edits.
func TestOneVersion(t *testing.T) {
	cf, err := os.ReadFile("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"title", "version", "revision", "created", "source", "licenses"} {
		if !strings.Contains(string(cf), "org.opencontainers.image."+l+"=") {
			t.Errorf("Containerfile has no org.opencontainers.image.%s label", l)
		}
	}
	if !strings.Contains(string(cf), "-X main.version=${VERSION}") {
		t.Error("Containerfile does not pass VERSION to the binary (-X main.version=${VERSION})")
	}
	image := firstMatch(t, string(cf), `(?m)^ARG VERSION=(\S+)$`)
	chart, err := os.ReadFile("../helm/lock-sensors/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	appVersion := firstMatch(t, string(chart), `(?m)^appVersion: "?([^"\s]+)"?$`)
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	release := firstMatch(t, string(changelog), `(?m)^## \[(\d+\.\d+\.\d+[^\]]*)\]`)
	if image != release || appVersion != release {
		t.Errorf("Containerfile VERSION %s, Chart.yaml appVersion %s, CHANGELOG.md's last release %s: want one version",
			image, appVersion, release)
	}
}

func firstMatch(t *testing.T, s, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no match for %s", re)
	}
	return m[1]
}
