package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// loadgenOptions are the receiver side of a load run.
type loadgenOptions struct {
	cfg       loadgen.Config
	webhooks  bool
	listen    string
	apiURL    string
	apiToken  string
	settle    time.Duration
	lostAfter time.Duration
}

func loadgenFlags(fs *flag.FlagSet) *loadgenOptions {
	o := &loadgenOptions{}
	fs.BoolVar(&o.webhooks, "webhooks", false, "register the fleet through the API, receive its webhooks, verify signatures and balance the books")
	fs.StringVar(&o.listen, "webhook-listen", "127.0.0.1:0", "address of the load run's webhook receiver")
	fs.StringVar(&o.apiURL, "api-url", "", "admin API base URL (default http://LOCKS_HTTP_ADDR)")
	fs.StringVar(&o.apiToken, "api-token", "", "admin API token (default the first of LOCKS_API_TOKENS)")
	fs.DurationVar(&o.settle, "settle", 30*time.Second, "after publishing, how long to wait for outstanding webhooks")
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

func runLoadgen(ctx context.Context, cfg config.Config, o *loadgenOptions, stdout io.Writer, log *slog.Logger) error {
	lg := &o.cfg
	lg.AMQPURL, lg.Queue = cfg.AMQPURL, cfg.AMQPQueue
	if lg.Prefix == "" {
		lg.Prefix = "lg"
	}
	if err := lg.Validate(); err != nil {
		return &config.Error{Var: "loadgen", Value: "", Reason: err.Error()}
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
	books, err := loadgen.Run(ctx, *lg, stdout, log)
	if err != nil {
		return err
	}
	el := books.End.Sub(books.Start)
	fmt.Fprintf(stdout, "published %d (%d invalid) in %s: %.0f/s; expected state changes %d; silent sensors %d\n",
		books.Published, books.Invalid, el.Round(time.Millisecond), float64(books.Published)/el.Seconds(),
		books.Changes, len(books.Silent))
	if rcv == nil {
		return nil
	}
	// Wait for the webhooks: the changes, and the silent sensors' lost events after lost_after.
	lostBy := books.Start.Add(cfg.LostAfter).Add(o.settle)
	deadline := time.Now().Add(o.settle)
	if len(books.Silent) > 0 && lostBy.After(deadline) {
		deadline = lostBy
	}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		t := rcv.Tally()
		if t.ByType["sensor.state_changed"] >= books.Changes && int64(len(t.Lost)) >= int64(len(books.Silent)) {
			break
		}
		fmt.Fprintf(stdout, "\rwaiting for webhooks: %d of %d changes, %d of %d lost   ",
			t.ByType["sensor.state_changed"], books.Changes, len(t.Lost), len(books.Silent))
		time.Sleep(time.Second)
	}
	t := rcv.Tally()
	fmt.Fprintf(stdout, "\nreceived: %v; duplicates %d; bad signatures %d; publish→webhook p50 %s p95 %s p99 %s\n",
		t.ByType, t.Duplicates, t.BadSig, t.P50.Round(time.Millisecond), t.P95.Round(time.Millisecond), t.P99.Round(time.Millisecond))
	if problems := loadgen.Check(books, t, cfg.LostAfter, !time.Now().Before(lostBy)); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stdout, "MISMATCH:", p)
		}
		return loadgen.ErrUnbalanced
	}
	fmt.Fprintln(stdout, "the books balance: every expected notification received once, no false lost event")
	return nil
}
