package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision are set by the image build (deploy/container/Containerfile) with
// -ldflags "-X main.version=0.1.0 -X main.revision=<commit>"; left empty, they come from what
// the Go toolchain records in the binary (the module version, and the VCS revision and time of
// a build in a git checkout).
var version, revision = "", ""

// buildInfo is what `locks version`, the log's first line, the process registry and
// locks_build_info say about this binary.
type buildInfo struct {
	Version   string // the release (ldflags), or the module version ("(devel)" for go run)
	Revision  string // the VCS commit
	Time      string // the commit's time, RFC 3339
	Modified  bool   // built from a work tree with uncommitted changes
	GoVersion string
}

// readBuildInfo is this binary's buildInfo.
func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(bi, ok, version, revision)
}

// fromBuildInfo combines the ldflags variables (ldVersion, ldRevision) with what the
// toolchain recorded (bi, when ok); the ldflags win.
func fromBuildInfo(bi *debug.BuildInfo, ok bool, ldVersion, ldRevision string) buildInfo {
	b := buildInfo{Version: "(devel)"}
	if ok {
		b.GoVersion = bi.GoVersion
		if bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.time":
				b.Time = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if ldVersion != "" {
		b.Version = ldVersion
	}
	if ldRevision != "" {
		b.Revision = ldRevision
	}
	return b
}

// versionString is the short form: the version and the revision's first 12 characters.
func versionString() string {
	b := readBuildInfo()
	v := b.Version
	if len(b.Revision) >= 12 {
		v += " " + b.Revision[:12]
	}
	return v
}

// printVersion writes `locks version`: one "key: value" line each after the first.
func printVersion(w io.Writer, b buildInfo) {
	unknown := func(s string) string {
		if s == "" {
			return "unknown"
		}
		return s
	}
	fmt.Fprintf(w, "locks %s\nrevision: %s\ntime: %s\nmodified: %t\ngo: %s\n",
		b.Version, unknown(b.Revision), unknown(b.Time), b.Modified, unknown(b.GoVersion))
}

// buildInfoGauge is locks_build_info{version,revision}, always 1: joined on its labels, it
// tells which build each process runs (a roll-out half done shows two).
func buildInfoGauge(b buildInfo) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "locks_build_info",
		Help:        "The build of this locks process (version and VCS revision in the labels); always 1.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision},
	})
	g.Set(1)
	return g
}
