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

func loadgenFlags(fs *flag.FlagSet) *loadgen.Config {
	c := &loadgen.Config{}
	fs.IntVar(&c.Sensors, "sensors", 1000, "sensors in the simulated fleet")
	fs.Float64Var(&c.Rate, "rate", 1000, "readings per second over the fleet")
	fs.Float64Var(&c.ChangeRatio, "change-ratio", 0.1, "chance that a reading differs from the sensor's previous one")
	fs.Float64Var(&c.SilentRatio, "silent-ratio", 0, "share of sensors that report once and then go silent")
	fs.Float64Var(&c.InvalidRatio, "invalid-ratio", 0, "share of messages that are invalid")
	fs.DurationVar(&c.Duration, "duration", time.Minute, "how long to publish")
	fs.Int64Var(&c.Count, "count", 0, "stop after this many messages instead of after --duration")
	fs.StringVar(&c.Prefix, "prefix", "lg", "sensor id prefix (letters and digits)")
	fs.Uint64Var(&c.Seed, "seed", uint64(time.Now().UnixNano()), "random seed (message ids are unique per seed)")
	return c
}

func runLoadgen(ctx context.Context, cfg config.Config, lg *loadgen.Config, stdout io.Writer, log *slog.Logger) error {
	lg.AMQPURL, lg.Queue = cfg.AMQPURL, cfg.AMQPQueue
	if err := lg.Validate(); err != nil {
		return &config.Error{Var: "loadgen", Value: "", Reason: err.Error()}
	}
	books, err := loadgen.Run(ctx, *lg, stdout, log)
	if err != nil {
		return err
	}
	el := books.End.Sub(books.Start)
	fmt.Fprintf(stdout, "published %d (%d invalid) in %s: %.0f/s; expected state changes %d; silent sensors %d\n",
		books.Published, books.Invalid, el.Round(time.Millisecond), float64(books.Published)/el.Seconds(),
		books.Changes, len(books.Silent))
	return nil
}
