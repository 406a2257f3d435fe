// Command natsnode is nats-server as built from the module's go.mod (Debian's package is older
// than the 2.11 the liveness markers need), run with one config file: one node of the local
// cluster that deploy/cluster starts.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	conf := flag.String("c", "", "nats-server config file")
	flag.Parse()
	if err := run(*conf); err != nil {
		fmt.Fprintln(os.Stderr, "natsnode:", err)
		os.Exit(1)
	}
}

func run(conf string) error {
	if conf == "" {
		return fmt.Errorf("-c <config file> is required")
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		return err
	}
	// Signals are handled below, so that SIGTERM is a clean shutdown (and SIGKILL a crash).
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	s.ConfigureLogger()
	go s.Start()
	if !s.ReadyForConnections(60 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("not ready for connections within 60s")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}
