package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The bridge's counters, on the /metrics of every process that runs the bridge. A reading is
// recorded when the bridge appended it to READINGS for the first time: the bridge counts
// every valid reading it appended and acked (accepted, duplicates included) and, of those,
// the ones JetStream recognised as already in the stream (a redelivery after a lost ack).
// Recorded is therefore accepted − duplicates, taken as the change over the run. The
// bridge's counters are chosen over READINGS' stream info because READINGS also holds what
// the watchdog appends (liveness_timeout) and readings of earlier runs; the delta of the
// bridge's counters holds only what came through RabbitMQ while the run was on, which is
// this run's messages as long as nothing else publishes into the same queue meanwhile.
const (
	MetricAccepted   = "locks_bridge_readings_accepted_total"
	MetricDuplicates = "locks_bridge_duplicates_total"
	MetricInvalid    = "locks_bridge_invalid_total"
	// MetricApplied is the state projector's count of READINGS messages applied to
	// sensor_state (used for the committed-to-state rate of the time series).
	MetricApplied = "locks_state_applied_total"
)

// Scrape reads the Prometheus text exposition at each URL and returns, for each name
// asked for, the sum of its series over all the URLs (a counter with labels, or the same
// part in several processes, adds up).
func Scrape(ctx context.Context, urls []string, names ...string) (map[string]float64, error) {
	out := make(map[string]float64, len(names))
	for _, u := range urls {
		if err := scrapeOne(ctx, u, names, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var scrapeClient = &http.Client{Timeout: 5 * time.Second}

func scrapeOne(ctx context.Context, url string, names []string, out map[string]float64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("metrics %s: %w", url, err)
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return fmt.Errorf("metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metrics %s: HTTP %d", url, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		for _, n := range names {
			if rest, ok := strings.CutPrefix(line, n); ok && rest != "" && (rest[0] == ' ' || rest[0] == '{') {
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					return fmt.Errorf("metrics %s: %q: %w", url, line, err)
				}
				out[n] += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("metrics %s: %w", url, err)
	}
	return nil
}

// Recorder measures what the system recorded of one run from the bridge's counters: it
// reads them once before the run (NewRecorder) and then as often as asked, giving the change.
type Recorder struct {
	urls []string
	base map[string]float64
}

// Recorded is what the bridge did with the run's messages so far.
type Recorded struct {
	Recorded int64 // valid readings appended to READINGS for the first time
	Invalid  int64 // messages the bridge moved to the invalid queue
}

// NewRecorder reads the bridge's counters at urls (each a /metrics URL of a process running
// the bridge) as the run's starting point.
func NewRecorder(ctx context.Context, urls []string) (*Recorder, error) {
	base, err := Scrape(ctx, urls, MetricAccepted, MetricDuplicates, MetricInvalid)
	if err != nil {
		return nil, fmt.Errorf("loadgen: the bridge's counters: %w", err)
	}
	return &Recorder{urls: urls, base: base}, nil
}

// Read returns what was recorded since NewRecorder.
func (r *Recorder) Read(ctx context.Context) (Recorded, error) {
	now, err := Scrape(ctx, r.urls, MetricAccepted, MetricDuplicates, MetricInvalid)
	if err != nil {
		return Recorded{}, fmt.Errorf("loadgen: the bridge's counters: %w", err)
	}
	d := func(n string) int64 { return int64(now[n] - r.base[n]) }
	return Recorded{Recorded: d(MetricAccepted) - d(MetricDuplicates), Invalid: d(MetricInvalid)}, nil
}

// Balance says what is wrong with the books against what the bridge recorded:
// published = recorded + invalid, and the bridge found exactly the invalid messages sent.
func Balance(b Books, r Recorded) []string {
	var problems []string
	if want := b.Published - b.Invalid; r.Recorded != want {
		problems = append(problems, fmt.Sprintf("recorded %d readings, want published %d − invalid %d = %d (%+d)",
			r.Recorded, b.Published, b.Invalid, want, r.Recorded-want))
	}
	if r.Invalid != b.Invalid {
		problems = append(problems, fmt.Sprintf("the bridge rejected %d messages as invalid, %d were sent invalid", r.Invalid, b.Invalid))
	}
	return problems
}
