package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
)

// `locks events CLIENT`: a client's event feed (docs/contract.md, The event feed), read
// page by page, or with --follow watched live through events:watch (newline-delimited JSON)
// and resumed from the last cursor received whenever the watch ends for a reason that can
// pass: a disconnect, an API restart, a switch to another API instance behind the same
// address, a slow-watcher cut-off. A client token is enough: it reads its own client's feed.

// isClientID says whether an argument of `locks events` names a client: a client id has an
// underscore (cl_…), which a sensor id (letters and digits) never has.
func isClientID(id string) bool { return strings.HasPrefix(id, "cl_") }

// feedFlags are `locks events CLIENT`'s own flags.
type feedFlags struct {
	follow bool
	after  string
}

func (f *feedFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.follow, "follow", false, "for a CLIENT: keep watching and print each new event as it comes, resuming after a disconnect (Ctrl-C ends)")
	fs.StringVar(&f.after, "after", "", "for a CLIENT: start after this cursor (an item's cursor; without it, the oldest event kept)")
}

// feedLine is one item of the feed as the API sends it; event is the webhook body, kept
// byte for byte.
type feedLine struct {
	Cursor string          `json:"cursor"`
	Event  json.RawMessage `json:"event"`
}

// feedHeader and feedRow print a feed item as a table row; rows are written as they come,
// so the columns have fixed widths rather than a tabwriter's.
const feedHeader = "TIME                      SENSOR            TYPE                        DATA        PREVIOUS    REVISION  EVENT ID"

func feedRow(ev json.RawMessage) (string, error) {
	var b struct {
		ID           string              `json:"id"`
		Type         string              `json:"type"`
		OccurredAt   string              `json:"occurred_at"`
		Sensor       struct{ ID string } `json:"sensor"`
		Data         *int                `json:"data"`
		PreviousData *int                `json:"previous_data"`
		Revision     jsonInt             `json:"revision"`
	}
	if err := json.Unmarshal(ev, &b); err != nil {
		return "", fmt.Errorf("the API's event: %w", err)
	}
	data, prev := "-", "-"
	if b.Data != nil {
		data = doorData(*b.Data)
	}
	if b.PreviousData != nil {
		prev = doorData(*b.PreviousData)
	}
	return fmt.Sprintf("%-24s  %-16s  %-26s  %-10s  %-10s  %8d  %s", showTime(b.OccurredAt), nonEmpty(b.Sensor.ID), b.Type,
		data, prev, b.Revision, b.ID), nil
}

// feedPrinter prints items, a table row each, or with --json the item's line as the API
// sent it; it counts them against limit (0: none).
type feedPrinter struct {
	c      *cli
	limit  int
	n      int
	last   string // the cursor of the last item printed
	header bool
}

var errFeedLimit = errors.New("--limit reached")

func (p *feedPrinter) print(it feedLine) error {
	if p.c.json {
		b, err := json.Marshal(it)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(p.c.stdout, "%s\n", b); err != nil {
			return err
		}
	} else {
		if !p.header {
			p.header = true
			fmt.Fprintln(p.c.stdout, feedHeader)
		}
		row, err := feedRow(it.Event)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(p.c.stdout, row); err != nil {
			return err
		}
	}
	p.n++
	p.last = it.Cursor
	if p.limit > 0 && p.n >= p.limit {
		return errFeedLimit
	}
	return nil
}

// clientEvents runs `locks events CLIENT`.
func (c *cli) clientEvents(ctx context.Context, client string, f feedFlags, limit int) error {
	a, err := c.api()
	if err != nil {
		return err
	}
	p := &feedPrinter{c: c, limit: limit, last: f.after}
	if f.follow {
		err = c.followFeed(ctx, a, client, p)
	} else {
		err = readFeed(ctx, a, client, p)
	}
	if errors.Is(err, errFeedLimit) || (f.follow && ctx.Err() != nil) {
		err = nil
	}
	if p.last != "" && p.last != f.after {
		fmt.Fprintf(c.stderr, "(to read on from here: --after %s)\n", p.last)
	}
	if !p.header && !c.json && err == nil {
		fmt.Fprintln(c.stdout, feedHeader)
	}
	return err
}

// readFeed prints the feed from p.last to its end.
func readFeed(ctx context.Context, a *apiClient, client string, p *feedPrinter) error {
	for {
		q := url.Values{"page_size": {"1000"}}
		if p.last != "" {
			q.Set("after", p.last)
		}
		b, err := a.call(ctx, http.MethodGet, "/v1/clients/"+pathID(client)+"/events", q, nil)
		if err != nil {
			return err
		}
		var page struct {
			Events []feedLine `json:"events"`
		}
		if err := json.Unmarshal(b, &page); err != nil {
			return fmt.Errorf("the API's answer is not a feed page: %w", err)
		}
		if len(page.Events) == 0 {
			return nil
		}
		for _, it := range page.Events {
			if err := p.print(it); err != nil {
				return err
			}
		}
	}
}

// watchEnded is a watch that ended with the API's error line or a status other than 200.
type watchEnded struct {
	status  int // HTTP status of a refused watch; 0 for an error line
	code    int // gRPC code of an error line
	message string
}

func (e *watchEnded) Error() string {
	if e.status != 0 {
		return fmt.Sprintf("%s (HTTP %d)", e.message, e.status)
	}
	return fmt.Sprintf("%s (gRPC code %d)", e.message, e.code)
}

// resumable says whether a watch that ended so may be opened again from its last cursor:
// not when it was refused (a token, a client, a cursor that is wrong stays wrong).
func (e *watchEnded) resumable() bool {
	if e.status != 0 {
		return e.status == http.StatusTooManyRequests || e.status >= 500
	}
	switch e.code {
	case 4, 8, 10, 13, 14: // DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (a slow watcher), ABORTED, INTERNAL, UNAVAILABLE
		return true
	}
	return false
}

// followFeed watches the feed from p.last, opening the watch again from the last cursor
// printed whenever it ends for a reason that can pass, until ctx ends or an error that
// will not pass.
func (c *cli) followFeed(ctx context.Context, a *apiClient, client string, p *feedPrinter) error {
	// No overall timeout: a watch lasts as long as the caller wants.
	hc := &http.Client{Transport: a.hc.Transport}
	bo := backoff.New(200*time.Millisecond, 5*time.Second)
	for {
		before := p.n
		err := watchOnce(ctx, hc, a, client, p)
		if ctx.Err() != nil || errors.Is(err, errFeedLimit) {
			return err
		}
		var we *watchEnded
		if errors.As(err, &we) && !we.resumable() {
			return err
		}
		if p.n > before {
			bo.Reset()
		}
		from := "the start"
		if p.last != "" {
			from = "cursor " + p.last
		}
		fmt.Fprintf(c.stderr, "%s: the watch ended (%s); resuming from %s in %s\n", c.name, oneLine(err), from, bo.Delay())
		if !bo.Wait(ctx) {
			return ctx.Err()
		}
	}
}

// watchOnce opens one watch from p.last and prints its items until it ends.
func watchOnce(ctx context.Context, hc *http.Client, a *apiClient, client string, p *feedPrinter) error {
	u := a.base + "/v1/clients/" + pathID(client) + "/events:watch"
	if p.last != "" {
		u += "?after=" + url.QueryEscape(p.last)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("the API at %s does not answer: %w", a.base, err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 64<<10), 4<<20)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return &watchEnded{status: resp.StatusCode, message: errorMessage(b, resp.Status)}
	}
	for lines.Scan() {
		var line struct {
			feedLine
			Error *struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(lines.Bytes(), &line); err != nil {
			return fmt.Errorf("a line of the watch is not JSON: %w", err)
		}
		if line.Error != nil {
			return &watchEnded{code: line.Error.Code, message: line.Error.Message}
		}
		if line.Cursor == "" {
			return fmt.Errorf("a line of the watch has no cursor: %.200s", lines.Bytes())
		}
		if err := p.print(line.feedLine); err != nil {
			return err
		}
	}
	if err := lines.Err(); err != nil {
		return fmt.Errorf("the watch broke off: %w", err)
	}
	return errors.New("the API closed the watch")
}

// errorMessage is the message of an error body ({"message"} or an NDJSON {"error"} line),
// else the body itself, else status.
func errorMessage(b []byte, status string) string {
	var e struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	for _, m := range []string{e.Message, e.Error.Message, strings.TrimSpace(string(b)), status} {
		if m != "" {
			return m
		}
	}
	return strconv.Quote(status)
}
