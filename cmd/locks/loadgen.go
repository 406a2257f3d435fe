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

func runLoadgen(ctx context.Context, cfg config.Config, o *loadgenOptions, stdout io.Writer, log *slog.Logger) error {
	lg := &o.cfg
	lg.AMQPURL, lg.Queue = cfg.AMQPURL, cfg.AMQPQueue
	if lg.Prefix == "" {
		lg.Prefix = "lg"
	}
	if err := lg.Validate(); err != nil {
		return &config.Error{Var: "loadgen", Value: "", Reason: err.Error()}
	}
	var rec *loadgen.Recorder
	var bridgeURLs []string
	if o.metricsURL != "none" {
		if o.metricsURL == "" {
			o.metricsURL = "http://" + cfg.HTTPAddr + "/metrics"
		}
		bridgeURLs = strings.Split(o.metricsURL, ",")
		var err error
		if rec, err = loadgen.NewRecorder(ctx, bridgeURLs); err != nil {
			return fmt.Errorf("%w (--metrics-url: the /metrics of the process running the bridge, or none)", err)
		}
	}
	var rcv *loadgen.Receiver
	if o.webhooks {
		if o.apiURL == "" {
			o.apiURL = "http://" + cfg.HTTPAddr
		}
		if o.apiToken == "" && len(cfg.APITokens) > 0 {
			o.apiToken = cfg.APITokens[0]
		}
		var err error
		if rcv, err = loadgen.NewReceiver(o.listen); err != nil {
			return err
		}
		defer rcv.Close()
		fmt.Fprintf(stdout, "registering %d sensors and a client for %s through %s…\n", lg.Sensors, rcv.URL(), o.apiURL)
		if err := rcv.Register(ctx, o.apiURL, o.apiToken, lg.Prefix, lg.Sensors); err != nil {
			return err
		}
	}
	silent := int64(float64(lg.Sensors) * lg.SilentRatio)
	live := &loadgen.Live{}
	lg.Live = live
	status := func() loadgenStatus {
		s := loadgenStatus{published: live.Published.Load(), invalid: live.Invalid.Load(), changes: live.Changes.Load(),
			recorded: -1, received: -1}
		if rec != nil {
			if r, err := rec.Read(ctx); err == nil {
				s.recorded = r.Recorded
			}
		}
		if rcv != nil {
			t := rcv.Tally()
			s.received, s.dups, s.lost = t.Received, t.Duplicates, int64(len(t.Lost))
			s.missing = max(s.changes-t.ByType["sensor.state_changed"], 0) + max(silent-int64(len(t.Lost)), 0)
		}
		return s
	}

	sctx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	// With the whole system in one process (locks run --targets=all), the state projector's
	// counters are on the same /metrics as the bridge's.
	sampler := &loadgen.Sampler{Live: live, BridgeURLs: bridgeURLs, StateURLs: bridgeURLs, Receiver: rcv}
	samplerDone := make(chan struct{})
	go func() { sampler.Run(sctx); close(samplerDone) }()
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				fmt.Fprintf(stdout, "\r%s   ", status())
			}
		}
	}()

	books, err := loadgen.Run(ctx, *lg, nil, log)
	if err != nil {
		return err
	}
	el := books.End.Sub(books.Start)
	fmt.Fprintf(stdout, "\npublished %d (%d invalid) in %s: %.0f/s; expected state changes %d; silent sensors %d\n",
		books.Published, books.Invalid, el.Round(time.Millisecond), float64(books.Published)/el.Seconds(),
		books.Changes, len(books.Silent))

	// Wait for the books to balance: every valid reading recorded, every change notified,
	// and the silent sensors' lost events after lost_after.
	lostBy := books.Start.Add(cfg.LostAfter).Add(o.settle)
	deadline := time.Now().Add(o.settle)
	if rcv != nil && len(books.Silent) > 0 && lostBy.After(deadline) {
		deadline = lostBy
	}
	var recorded loadgen.Recorded
	var recErr error
	for {
		done := true
		if rec != nil {
			recorded, recErr = rec.Read(ctx)
			done = recErr == nil && recorded.Recorded+recorded.Invalid >= books.Published
		}
		if rcv != nil {
			t := rcv.Tally()
			done = done && t.ByType["sensor.state_changed"] >= books.Changes && int64(len(t.Lost)) >= int64(len(books.Silent))
		}
		if done || !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	if rec != nil && recErr == nil {
		// Reached is not settled: a reading that is not the run's (another publisher on the
		// queue) may have filled the count while one of the run's was still on its way.
		time.Sleep(time.Second)
		recorded, recErr = rec.Read(ctx)
	}
	stopSampler()
	<-progressDone
	<-samplerDone
	final := status()
	fmt.Fprintf(stdout, "\r%s\n", final)
	if o.series != "" {
		f, err := os.Create(o.series)
		if err != nil {
			return fmt.Errorf("--series: %w", err)
		}
		err = errors.Join(loadgen.WriteSeries(f, sampler.Samples()), f.Close())
		if err != nil {
			return fmt.Errorf("--series: %w", err)
		}
	}

	var problems []string
	if rec != nil {
		if recErr != nil {
			problems = append(problems, recErr.Error())
		} else {
			problems = append(problems, loadgen.Balance(books, recorded)...)
		}
	}
	if rcv != nil {
		t := rcv.Tally()
		fmt.Fprintf(stdout, "received: %v; duplicates %d; bad signatures %d; publish→webhook p50 %s p95 %s p99 %s\n",
			t.ByType, t.Duplicates, t.BadSig, t.P50.Round(time.Millisecond), t.P95.Round(time.Millisecond), t.P99.Round(time.Millisecond))
		problems = append(problems, loadgen.Check(books, t, cfg.LostAfter, !time.Now().Before(lostBy))...)
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stdout, "MISMATCH:", p)
		}
		return loadgen.ErrUnbalanced
	}
	switch {
	case rec != nil && rcv != nil:
		fmt.Fprintln(stdout, "the books balance: published = recorded + invalid; every expected notification received once, no false lost event")
	case rec != nil:
		fmt.Fprintln(stdout, "the books balance: published = recorded + invalid")
	case rcv != nil:
		fmt.Fprintln(stdout, "the books balance: every expected notification received once, no false lost event (recorded not measured: --metrics-url=none)")
	}
	return nil
}
