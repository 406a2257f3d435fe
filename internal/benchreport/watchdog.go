package main

import (
	"fmt"
	"strings"
)

// renderWatchdogMemory states the watchdog's memory figure (issue 13: the process's memory
// with 1,000,000 sensors tracked) in a sentence, with what the process held before the
// watchdog started, since the figure includes the embedded NATS server.
func renderWatchdogMemory(b *strings.Builder, rs []result) {
	for _, r := range rs {
		if r.name != "BenchmarkTrack" || r.pkg != "watchdog" {
			continue
		}
		m := r.metrics
		if _, ok := m["rss-MB"]; !ok {
			continue
		}
		fmt.Fprintf(b, "\nWatchdog memory (`watchdog` BenchmarkTrack): %s sensors tracked, every key live: "+
			"heap in use %s MB, RSS %s MB, for the whole process (the embedded NATS server holding READINGS and the liveness bucket included); "+
			"before the watchdog started: heap %s MB, RSS %s MB.\n",
			human(m["sensors"]), human(m["heap-MB"]), human(m["rss-MB"]), human(m["heap-before-MB"]), human(m["rss-before-MB"]))
	}
}
