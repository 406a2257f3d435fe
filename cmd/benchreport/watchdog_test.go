package main

import (
	"strings"
	"testing"
)

// The watchdog's memory figures become a sentence of their own besides the table rows.
func TestRenderWatchdogMemory(t *testing.T) {
	rs := parse(strings.NewReader(`pkg: github.com/lock-sensors/lock-sensors/watchdog
BenchmarkTrack-2   	       1	21661132501 ns/op	     69943 kv-updates/s	   1000000 sensors	       412.5 heap-MB	      1040 rss-MB	       189.2 heap-before-MB	       452.1 rss-before-MB
BenchmarkWrittenMap-2   	       1	 408034664 ns/op	        53.13 B/sensor	        50.66 written-map-MB
`))
	doc := render(rs, "go test -run '^$' -bench BenchmarkTrack -benchtime 1x ./watchdog", nil, t.TempDir())
	for _, want := range []string{
		"| watchdog | BenchmarkTrack | 69943 kv-updates/s, 1000000 sensors, 412 heap-MB, 1040 rss-MB, 189 heap-before-MB, 452 rss-before-MB |",
		"Watchdog memory (`watchdog` BenchmarkTrack): 1000000 sensors tracked, every key live: heap in use 412 MB, RSS 1040 MB,",
		"before the watchdog started: heap 189 MB, RSS 452 MB. The watchdog's own per-sensor state (BenchmarkWrittenMap): 50.7 MB, 53.1 bytes per sensor.\n",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("report lacks %q:\n%s", want, doc)
		}
	}
}
