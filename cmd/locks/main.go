// Command locks is the one binary of lock-sensors: `locks run --targets=all` runs every part
// in one process with an embedded NATS server; `--targets=bridge,state` runs a subset, and
// `--partitions` splits the partitions between processes. `locks migrate` applies the
// Postgres and ClickHouse migrations; `locks version` prints the version.
//
// main only parses configuration and wires the parts by hand; the parts never import one
// another.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/logfmt"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const usage = `locks: watches door-lock sensors (see README.md)

usage:
  locks run [--targets=all|bridge,state,history,notifier,watchdog,api] [--partitions=all|0-7|i/k] [flags]
  locks migrate [flags]
  locks loadgen [--sensors=N --rate=R --duration=D --change-ratio=F --silent-ratio=F --invalid-ratio=F --webhooks] [flags]
  locks replay --projection=state|history|all [--from-seq=N] [--drop-old] [flags]
  locks config --markdown
  locks healthcheck [--path=/readyz]   (exit 0 when the process at LOCKS_HTTP_ADDR is ready)
  locks nats-accounts [--partition-count=N]   (prints deploy/nats/accounts.conf for N partitions)
  locks version

The admin API (LOCKS_API_URL, LOCKS_API_TOKEN, an administrator's or a client token; default
the local "go tool task up"):
  locks sensor create|get|list|delete
  locks client create|get|list|delete|rotate-secret|test-event|enable|disable
  locks subscription create|delete SENSOR CLIENT
  locks state|readings|events SENSOR
  locks deliveries|redrive CLIENT
  locks events CLIENT [--follow]     the client's event feed; --follow watches and resumes
  locks publish SENSOR 0|1          one reading to RabbitMQ, as a sensor sends it
  locks receive --secret whsec_…    a demo receiver that verifies and prints webhooks
Each takes --help; --json prints the API's JSON instead of a table. Exit status: 0, 1 when
the call failed, 2 for bad usage.

Every LOCKS_* variable of the configuration can be given as a flag: LOCKS_LOST_AFTER=5s is
--lost-after=5s. Run "locks run -h" for the list.
`

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "version", "--version", "-version":
		printVersion(stdout, readBuildInfo())
		return 0
	case "config":
		return runConfig(args, stdout, stderr)
	case "healthcheck":
		return runHealthcheck(args, getenv, stdout, stderr)
	case "run", "migrate", "loadgen", "replay", "nats-accounts":
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		if isCLICommand(cmd) {
			return runCLI(cmd, args, getenv, stdout, stderr)
		}
		fmt.Fprintf(stderr, "locks: unknown command %q\n\n%s", cmd, usage)
		return 2
	}

	inv, code := parseInvocation(cmd, args, getenv, stderr)
	if inv == nil {
		return code
	}
	cfg := inv.cfg
	log := newLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if cmd == "nats-accounts" {
		conf, err := natsx.AccountsConf(cfg.Partitions)
		if err != nil {
			fmt.Fprintf(stderr, "locks: %v\n", err)
			return 1
		}
		fmt.Fprint(stdout, conf)
		return 0
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch cmd {
	case "migrate":
		err = migrate(ctx, cfg, true, true, log)
		if err == nil && cfg.NATSURL != "" {
			err = declareNATS(ctx, cfg, log)
		}
	case "loadgen":
		err = runLoadgen(ctx, cfg, inv.lg, stdout, log)
	case "replay":
		err = runReplay(ctx, cfg, inv.rp, stderr, log)
	case "run":
		var opts runOptions
		if opts, err = parseRunOptions(inv.targets, inv.partitions, cfg); err != nil {
			fmt.Fprintf(stderr, "locks: %v\n", err)
			return 2
		}
		err = runService(ctx, cfg, opts, getenv, log)
	}
	return exitStatus(err, stderr)
}

// invocation is a service command (run, migrate, loadgen, replay, nats-accounts) with its
// configuration and the flags of its own.
type invocation struct {
	cfg                 config.Config
	targets, partitions string          // run
	lg                  *loadgenOptions // loadgen
	rp                  *replayOptions  // replay
}

// parseInvocation reads cmd's flags and its configuration from args and getenv. When they
// are wrong or --help was asked for, it returns no invocation and the exit status.
func parseInvocation(cmd string, args []string, getenv func(string) string, stderr io.Writer) (*invocation, int) {
	fs := flag.NewFlagSet("locks "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	vals := configFlags(fs, settingsOf(cmd)...)
	inv := &invocation{}
	if cmd == "loadgen" {
		inv.lg = loadgenFlags(fs)
	}
	if cmd == "replay" {
		inv.rp = replayFlags(fs)
	}
	if cmd == "run" {
		fs.StringVar(&inv.targets, "targets", "all", "parts to run: all, or a comma list of "+allTargetsList())
		fs.StringVar(&inv.partitions, "partitions", "auto", "partitions this process owns: auto (state: its share, by leases; other parts: all), all, 0-7, 0,2,4, or i/k (the i-th of k shares)")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "locks %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return nil, 2
	}
	cfg, err := config.Load(getenv, fs, vals)
	if err != nil {
		fmt.Fprintf(stderr, "locks: %v\n", err)
		return nil, 2
	}
	inv.cfg = cfg
	return inv, 0
}

// runService is `locks run`: the chosen parts in this process, with the process's GC and
// memory limit set for a long-running service.
func runService(ctx context.Context, cfg config.Config, opts runOptions, getenv func(string) string, log *slog.Logger) error {
	if getenv("GOGC") == "" {
		// The pipeline allocates a little per reading and keeps little: collecting less
		// often trades some memory for CPU, which the servers beside it need. GOGC wins.
		debug.SetGCPercent(runGCPercent)
	}
	if soft := setMemoryLimit(getenv, cgroupMemoryFiles); soft > 0 {
		log.Info("memory limit from the cgroup (GOMEMLIMIT unset)", "soft_limit_mib", soft>>20)
	}
	return runParts(ctx, cfg, opts, log)
}

// exitStatus reports err, if any, on stderr and says the command's exit status: 2 for bad
// usage, 1 for any other failure.
func exitStatus(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	// One line naming what is wrong; the details are in the wrapped errors.
	fmt.Fprintf(stderr, "locks: %s\n", oneLine(err))
	if errors.Is(err, config.ErrUsage) {
		return 2
	}
	return 1
}

// runGCPercent is the GC target of `locks run` when GOGC is not set.
const runGCPercent = 400

// newLogger is the process's logger on w; level and format were validated by config.Load.
func newLogger(w io.Writer, level, format string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	h, err := logfmt.NewHandler(w, format, l)
	if err != nil {
		h, _ = logfmt.NewHandler(w, logfmt.Text, l)
	}
	return slog.New(h)
}

// oneLine folds an error whose text spans lines (pgx lists each address tried) into one line.
func oneLine(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	return strings.Join(slices.DeleteFunc(lines, func(l string) bool { return l == "" }), "; ")
}
