package main

// The command line for people (CONTRACT.md section 5): `locks RESOURCE VERB …` over the admin
// REST API, plus `locks publish` (a sensor's reading to RabbitMQ) and `locks receive` (a demo
// webhook receiver). Each command has a flag set of its own, so its --help shows only what it
// takes. Exit codes: 0, 1 when the call failed (the API's message on stderr), 2 for usage.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// cliCommand is one command of the command line: `locks NAME` or `locks RESOURCE VERB`.
type cliCommand struct {
	args  string // what follows the name in the usage line, e.g. "ID --address ADDRESS"
	about string
	// run registers its flags on fs, parses args with c.parse, and does the work.
	run func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error
}

// cliResources are the commands that take a verb; cliVerbless those that do not.
var (
	cliResources = map[string]map[string]cliCommand{
		"sensor":       sensorCommands,
		"client":       clientCommands,
		"subscription": subscriptionCommands,
	}
	cliVerbless = map[string]cliCommand{
		"state":      stateCommand,
		"readings":   readingsCommand,
		"events":     eventsCommand,
		"deliveries": deliveriesCommand,
		"redrive":    redriveCommand,
		"publish":    publishCommand,
		"receive":    receiveCommand,
	}
)

// isCLICommand says whether run hands cmd to runCLI.
func isCLICommand(cmd string) bool {
	_, res := cliResources[cmd]
	_, one := cliVerbless[cmd]
	return res || one
}

// cli is what every command shares: where to write, the environment, and the API settings.
type cli struct {
	name   string // "locks sensor create"
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string

	apiURL, token string
	json          bool
}

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// runCLI runs the command line's command cmd with args; it returns the exit status.
func runCLI(cmd string, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	name := "locks " + cmd
	c, ok := cliVerbless[cmd]
	if !ok {
		verbs := cliResources[cmd]
		if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			w, code := stderr, 2
			if len(args) > 0 {
				w, code = stdout, 0
			}
			fmt.Fprintf(w, "usage:\n%s", verbUsage(cmd, verbs))
			return code
		}
		if c, ok = verbs[args[0]]; !ok {
			fmt.Fprintf(stderr, "%s: unknown verb %q\n\nusage:\n%s", name, args[0], verbUsage(cmd, verbs))
			return 2
		}
		name += " " + args[0]
		args = args[1:]
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s %s\n\n%s\n", name, c.args, c.about)
		var n int
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(fs.Output(), "\nflags:")
			fs.PrintDefaults()
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cl := &cli{name: name, stdout: stdout, stderr: stderr, getenv: getenv}
	err := c.run(ctx, cl, fs, args)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		// Asked for: the usage goes to stdout (parse kept the flag package quiet).
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %s\n", name, ue.msg)
		fmt.Fprintf(stderr, "usage: %s %s (see %s --help)\n", name, c.args, name)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err))
		return 1
	}
}

func verbUsage(resource string, verbs map[string]cliCommand) string {
	names := make([]string, 0, len(verbs))
	for v := range verbs {
		names = append(names, v)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, v := range names {
		fmt.Fprintf(&b, "  locks %s %s %s\n      %s\n", resource, v, verbs[v].args, verbs[v].about)
	}
	return b.String()
}

// parse parses args with fs, flags and positional arguments in any order (`sensor create ID
// --address A` as well as `--address A ID`; after "--" everything is positional), and checks
// that there are from min to max positional arguments (max < 0: no limit).
func (c *cli) parse(fs *flag.FlagSet, args []string, min, max int) ([]string, error) {
	var pos []string
	for {
		// The flag package prints its own complaint on fs's output; keep it for --help only.
		fs.SetOutput(io.Discard)
		err := fs.Parse(args)
		fs.SetOutput(c.stderr)
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		if err != nil {
			return nil, usagef("%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	switch {
	case len(pos) < min:
		return nil, usagef("%d argument(s) missing", min-len(pos))
	case max >= 0 && len(pos) > max:
		return nil, usagef("unexpected argument %q", pos[max])
	}
	for _, p := range pos {
		if p == "" {
			return nil, usagef("an argument is empty")
		}
	}
	return pos, nil
}

// apiFlags are the flags of every command that calls the admin API.
func (c *cli) apiFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.apiURL, "api-url", "", "admin API base URL (env LOCKS_API_URL; default http://LOCKS_HTTP_ADDR, http://127.0.0.1:8080)")
	fs.StringVar(&c.token, "token", "", "API bearer token, an administrator's or a client token lsct_… (env LOCKS_API_TOKEN; default the first of LOCKS_API_TOKENS, else $LOCKS_DATA_DIR/api-token as go tool task up keeps it)")
	fs.BoolVar(&c.json, "json", false, "print the API's JSON instead of a table")
}
