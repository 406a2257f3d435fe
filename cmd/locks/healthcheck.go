package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// healthcheckTimeout bounds one probe; a container runtime runs it every few seconds.
const healthcheckTimeout = 3 * time.Second

// runHealthcheck is `locks healthcheck`: GET /readyz (or --path) of the locks process in the
// same container, at its LOCKS_HTTP_ADDR, and exit 0 on 200, 1 otherwise. The image has no
// shell, curl or wget, so a container healthcheck (deploy/compose) runs the binary itself.
func runHealthcheck(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("locks healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("path", "/readyz", "path to GET: /readyz (ready) or /healthz (alive)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return 2
	}
	addr := getenv("LOCKS_HTTP_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fmt.Fprintf(stderr, "locks healthcheck: LOCKS_HTTP_ADDR=%q: must be host:port\n", addr)
		return 2
	}
	// A process listening on every address is reached on loopback.
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + *path
	ctx, cancel := context.WithTimeout(context.Background(), healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "locks healthcheck: %v\n", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "locks healthcheck: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "locks healthcheck: GET %s: %s %s\n", url, resp.Status, body)
		return 1
	}
	fmt.Fprintf(stdout, "%s %s\n", url, resp.Status)
	return 0
}
