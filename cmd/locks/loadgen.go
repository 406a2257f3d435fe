package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// loadgenOptions are the receiver side of a load run.
type loadgenOptions struct {
	cfg        loadgen.Config
	webhooks   bool
	listen     string
	apiURL     string
	apiToken   string
	metricsURL string
	series     string
	settle     time.Duration
	warmup     time.Duration
}

func loadgenFlags(fs *flag.FlagSet) *loadgenOptions {
	o := &loadgenOptions{}
	fs.BoolVar(&o.webhooks, "webhooks", false, "register the fleet through the API, receive its webhooks, verify signatures and balance the books")
	fs.StringVar(&o.listen, "webhook-listen", "127.0.0.1:0", "address of the load run's webhook receiver")
	fs.StringVar(&o.apiURL, "api-url", "", "admin API base URL (default http://LOCKS_HTTP_ADDR)")
	fs.StringVar(&o.apiToken, "api-token", "", "admin API token (default the first of LOCKS_API_TOKENS)")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "comma list of the /metrics URLs of the processes running the bridge, whose counters say what was recorded: published = recorded + invalid must hold after --settle (default http://LOCKS_HTTP_ADDR/metrics; none: do not balance recorded)")
	fs.StringVar(&o.series, "series", "", "write a per-second time series (CSV) to this file")
	fs.DurationVar(&o.settle, "settle", 30*time.Second, "after publishing, how long to wait for the books to balance (recorded readings, webhooks)")
	fs.DurationVar(&o.warmup, "warmup", 0, "with --webhooks, also summarise publish→webhook without the readings published in the run's first DURATION (a system just started warming up)")
	c := &o.cfg
	fs.IntVar(&c.Sensors, "sensors", 1000, "sensors in the simulated fleet")
	fs.Float64Var(&c.Rate, "rate", 1000, "readings per second over the fleet")
	fs.Float64Var(&c.ChangeRatio, "change-ratio", 0.1, "chance that a reading differs from the sensor's previous one")
	fs.Float64Var(&c.SilentRatio, "silent-ratio", 0, "share of sensors that report once and then go silent")
	fs.Float64Var(&c.InvalidRatio, "invalid-ratio", 0, "share of messages that are invalid")
	fs.DurationVar(&c.Duration, "duration", time.Minute, "how long to publish")
	fs.Int64Var(&c.Count, "count", 0, "stop after this many messages instead of after --duration")
	fs.StringVar(&c.Prefix, "prefix", "lg", "sensor id prefix (letters and digits)")
	fs.Uint64Var(&c.Seed, "seed", uint64(time.Now().UnixNano()), "random seed (message ids are unique per seed)")
	return o
}

// loadgenStatus is everything the progress line and the summary show.
type loadgenStatus struct {
	published, invalid, changes int64
	recorded                    int64 // −1: not measured
	received, lost, dups        int64 // −1: no receiver
	missing                     int64 // expected changes not yet received, plus silent sensors not yet lost
}

func (s loadgenStatus) String() string {
	rec := "n/a"
	if s.recorded >= 0 {
		rec = fmt.Sprint(s.recorded)
	}
	line := fmt.Sprintf("published %d, recorded %s, invalid %d, changes %d", s.published, rec, s.invalid, s.changes)
	if s.received >= 0 {
		line += fmt.Sprintf(", notifications received %d, lost events %d, missing %d, duplicates %d", s.received, s.lost, s.missing, s.dups)
	}
	return line
}

// runLoadgen is `locks loadgen`: it publishes the simulated fleet's readings, waits for the
// books to balance, and reports what does not.
func runLoadgen(ctx context.Context, cfg config.Config, o *loadgenOptions, stdout io.Writer, log *slog.Logger) error {
	lg := &o.cfg
	lg.AMQPURL, lg.Queue = cfg.AMQPURL, cfg.AMQPQueue
	if lg.Prefix == "" {
		lg.Prefix = "lg"
	}
	if err := lg.Validate(); err != nil {
		return &config.Error{Var: "loadgen", Value: "", Reason: err.Error()}
	}
	w := &loadWatch{silent: int64(float64(lg.Sensors) * lg.SilentRatio), live: &loadgen.Live{}, warmup: o.warmup}
	bridgeURLs, err := w.openRecorder(ctx, cfg, o)
	if err != nil {
		return err
	}
	if err := w.openReceiver(ctx, cfg, o, stdout); err != nil {
		return err
	}
	if w.rcv != nil {
		defer w.rcv.Close()
	}
	lg.Live = w.live

	sctx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	// With the whole system in one process (locks run --targets=all), the state projector's
	// counters are on the same /metrics as the bridge's.
	sampler := &loadgen.Sampler{Live: w.live, BridgeURLs: bridgeURLs, StateURLs: bridgeURLs, Receiver: w.rcv}
	samplerDone := make(chan struct{})
	go func() { sampler.Run(sctx); close(samplerDone) }()
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		w.progress(ctx, sctx.Done(), stdout)
	}()

	books, err := loadgen.Run(ctx, *lg, nil, log)
	if err != nil {
		return err
	}
	el := books.End.Sub(books.Start)
	fmt.Fprintf(stdout, "\npublished %d (%d invalid) in %s: %.0f/s; expected state changes %d; silent sensors %d\n",
		books.Published, books.Invalid, el.Round(time.Millisecond), float64(books.Published)/el.Seconds(),
		books.Changes, len(books.Silent))

	// The silent sensors' lost events come after lost_after.
	lostBy := books.Start.Add(cfg.LostAfter).Add(o.settle)
	deadline := time.Now().Add(o.settle)
	if w.rcv != nil && len(books.Silent) > 0 && lostBy.After(deadline) {
		deadline = lostBy
	}
	recorded, recErr := w.settle(ctx, books, deadline)
	stopSampler()
	<-progressDone
	<-samplerDone
	fmt.Fprintf(stdout, "\r%s\n", w.status(ctx))
	if o.series != "" {
		if err := writeSeries(o.series, sampler.Samples()); err != nil {
			return fmt.Errorf("--series: %w", err)
		}
	}
	return w.report(stdout, books, recorded, recErr, cfg.LostAfter, !time.Now().Before(lostBy))
}

// loadWatch is how a load run sees the system: the bridge's counters (rec; nil with
// --metrics-url=none), the webhook receiver (rcv; nil without --webhooks) and the
// generator's own counts.
type loadWatch struct {
	rec    *loadgen.Recorder
	rcv    *loadgen.Receiver
	live   *loadgen.Live
	silent int64 // sensors that report once and then go silent
	// warmup is --warmup: the readings published in the run's first warmup are left out of
	// a second latency summary.
	warmup time.Duration
}

// openRecorder reads the bridge's counters from --metrics-url (default this process's
// /metrics) unless it is none, and returns the URLs it reads.
func (w *loadWatch) openRecorder(ctx context.Context, cfg config.Config, o *loadgenOptions) ([]string, error) {
	if o.metricsURL == "none" {
		return nil, nil
	}
	if o.metricsURL == "" {
		o.metricsURL = "http://" + cfg.HTTPAddr + "/metrics"
	}
	bridgeURLs := strings.Split(o.metricsURL, ",")
	var err error
	if w.rec, err = loadgen.NewRecorder(ctx, bridgeURLs); err != nil {
		return nil, fmt.Errorf("%w (--metrics-url: the /metrics of the process running the bridge, or none)", err)
	}
	return bridgeURLs, nil
}

// openReceiver, with --webhooks, starts the webhook receiver and registers the fleet and a
// client for it through the API.
func (w *loadWatch) openReceiver(ctx context.Context, cfg config.Config, o *loadgenOptions, stdout io.Writer) error {
	if !o.webhooks {
		return nil
	}
	if o.apiURL == "" {
		o.apiURL = "http://" + cfg.HTTPAddr
	}
	if o.apiToken == "" && len(cfg.APITokens) > 0 {
		o.apiToken = cfg.APITokens[0]
	}
	rcv, err := loadgen.NewReceiver(o.listen)
	if err != nil {
		return err
	}
	lg := &o.cfg
	fmt.Fprintf(stdout, "registering %d sensors and a client for %s through %s…\n", lg.Sensors, rcv.URL(), o.apiURL)
	if err := rcv.Register(ctx, o.apiURL, o.apiToken, lg.Prefix, lg.Sensors); err != nil {
		_ = rcv.Close()
		return err
	}
	w.rcv = rcv
	return nil
}

// status is the run's progress so far.
func (w *loadWatch) status(ctx context.Context) loadgenStatus {
	live := w.live
	s := loadgenStatus{published: live.Published.Load(), invalid: live.Invalid.Load(), changes: live.Changes.Load(),
		recorded: -1, received: -1}
	if w.rec != nil {
		if r, err := w.rec.Read(ctx); err == nil {
			s.recorded = r.Recorded
		}
	}
	if w.rcv != nil {
		t := w.rcv.Tally()
		s.received, s.dups, s.lost = t.Received, t.Duplicates, int64(len(t.Lost))
		s.missing = max(s.changes-t.ByType["sensor.state_changed"], 0) + max(w.silent-int64(len(t.Lost)), 0)
	}
	return s
}

// progress rewrites the status line every second until stop is closed.
func (w *loadWatch) progress(ctx context.Context, stop <-chan struct{}, stdout io.Writer) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fmt.Fprintf(stdout, "\r%s   ", w.status(ctx))
		}
	}
}

// settle waits until deadline at most for the books to balance: every valid reading
// recorded, every change notified, every silent sensor lost. It returns the last count of
// recorded readings.
func (w *loadWatch) settle(ctx context.Context, books loadgen.Books, deadline time.Time) (loadgen.Recorded, error) {
	var recorded loadgen.Recorded
	var recErr error
	for {
		done := true
		if w.rec != nil {
			recorded, recErr = w.rec.Read(ctx)
			done = recErr == nil && recorded.Recorded+recorded.Invalid >= books.Published
		}
		if w.rcv != nil {
			t := w.rcv.Tally()
			done = done && t.ByType["sensor.state_changed"] >= books.Changes && int64(len(t.Lost)) >= int64(len(books.Silent))
		}
		if done || !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	if w.rec != nil && recErr == nil {
		// Reached is not settled: a reading that is not the run's (another publisher on the
		// queue) may have filled the count while one of the run's was still on its way.
		time.Sleep(time.Second)
		recorded, recErr = w.rec.Read(ctx)
	}
	return recorded, recErr
}

// report prints every mismatch of the books (ErrUnbalanced) or that they balance.
// silentDone says whether the silent sensors had time to be declared lost.
func (w *loadWatch) report(stdout io.Writer, books loadgen.Books, recorded loadgen.Recorded, recErr error, lostAfter time.Duration, silentDone bool) error {
	var problems []string
	if w.rec != nil {
		if recErr != nil {
			problems = append(problems, recErr.Error())
		} else {
			problems = append(problems, loadgen.Balance(books, recorded)...)
		}
	}
	if w.rcv != nil {
		t := w.rcv.Tally()
		fmt.Fprintf(stdout, "received: %v; duplicates %d; bad signatures %d; publish→webhook p50 %s p95 %s p99 %s\n",
			t.ByType, t.Duplicates, t.BadSig, t.P50.Round(time.Millisecond), t.P95.Round(time.Millisecond), t.P99.Round(time.Millisecond))
		if w.warmup > 0 {
			p50, p95, p99, n := w.rcv.QuantilesAfter(books.Start.Add(w.warmup))
			fmt.Fprintf(stdout, "after the first %s: %d webhooks; publish→webhook p50 %s p95 %s p99 %s\n",
				w.warmup, n, p50.Round(time.Millisecond), p95.Round(time.Millisecond), p99.Round(time.Millisecond))
		}
		problems = append(problems, loadgen.Check(books, t, lostAfter, silentDone)...)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stdout, "MISMATCH:", p)
		}
		return loadgen.ErrUnbalanced
	}
	switch {
	case w.rec != nil && w.rcv != nil:
		fmt.Fprintln(stdout, "the books balance: published = recorded + invalid; every expected notification received once, no false lost event")
	case w.rec != nil:
		fmt.Fprintln(stdout, "the books balance: published = recorded + invalid")
	case w.rcv != nil:
		fmt.Fprintln(stdout, "the books balance: every expected notification received once, no false lost event (recorded not measured: --metrics-url=none)")
	}
	return nil
}

// writeSeries writes the per-second samples as CSV to the file at path.
func writeSeries(path string, samples []loadgen.Sample) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(loadgen.WriteSeries(f, samples), f.Close())
}
