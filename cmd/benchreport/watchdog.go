package main

import (
	"fmt"
	"strings"
)

// renderWatchdogMemory states the watchdog's memory figure (issue 13: the process's memory
// with 1,000,000 sensors tracked) in a sentence, with what the process held before the
// watchdog started, since the figure includes the embedded NATS server.
func renderWatchdogMemory(b *strings.Builder, rs []result) {
	var track, own *result
	for i, r := range rs {
		switch {
		case r.pkg != "watchdog":
		case r.name == "BenchmarkTrack":
			track = &rs[i]
		case r.name == "BenchmarkWrittenMap":
			own = &rs[i]
		}
	}
	if track == nil || track.metrics["rss-MB"] == 0 {
		return
	}
	m := track.metrics
	fmt.Fprintf(b, "\nWatchdog memory (`watchdog` BenchmarkTrack): %s sensors tracked, every key live: "+
		"heap in use %s MB, RSS %s MB, for the whole process (the embedded NATS server holding READINGS and the liveness bucket included); "+
		"before the watchdog started: heap %s MB, RSS %s MB.",
		human(m["sensors"]), human(m["heap-MB"]), human(m["rss-MB"]), human(m["heap-before-MB"]), human(m["rss-before-MB"]))
	if own != nil {
		fmt.Fprintf(b, " The watchdog's own per-sensor state (BenchmarkWrittenMap): %s MB, %s bytes per sensor.",
			human(own.metrics["written-map-MB"]), human(own.metrics["B/sensor"]))
	}
	b.WriteString("\n")
}
