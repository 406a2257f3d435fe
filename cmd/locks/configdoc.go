package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// runConfig is `locks config --markdown`: the table of every setting, from internal/config's
// own definitions (docs/configuration.md is its output).
func runConfig(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("locks config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	markdown := fs.Bool("markdown", false, "print the settings as the Markdown of docs/configuration.md")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if !*markdown || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: locks config --markdown")
		return 2
	}
	if err := config.Markdown(stdout); err != nil {
		fmt.Fprintf(stderr, "locks: %v\n", err)
		return 1
	}
	return 0
}
