package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// apiClient calls the admin REST API (CONTRACT.md section 3) with a bearer token.
type apiClient struct {
	base, token string
	hc          *http.Client
}

// apiError is the API's answer to a call that failed: its HTTP status and the gateway's
// {code, message, details} body.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// env is getenv's value of k, or def when it is empty.
func (c *cli) env(k, def string) string {
	if v := c.getenv(k); v != "" {
		return v
	}
	return def
}

// api resolves the API's URL and token: the flags, then LOCKS_API_URL and LOCKS_API_TOKEN,
// then what a local `go tool task up` serves (LOCKS_HTTP_ADDR, the first of LOCKS_API_TOKENS,
// or the token it keeps in $LOCKS_DATA_DIR/api-token).
func (c *cli) api() (*apiClient, error) {
	base := c.apiURL
	if base == "" {
		base = c.env("LOCKS_API_URL", "http://"+c.env("LOCKS_HTTP_ADDR", "127.0.0.1:8080"))
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("the API URL %q is not http(s)://host[:port] (--api-url, LOCKS_API_URL)", base)
	}
	token := c.token
	if token == "" {
		token = c.getenv("LOCKS_API_TOKEN")
	}
	if token == "" {
		token, _, _ = strings.Cut(c.getenv("LOCKS_API_TOKENS"), ",")
	}
	if token == "" {
		if b, err := os.ReadFile(filepath.Join(c.env("LOCKS_DATA_DIR", "./.locks"), "api-token")); err == nil {
			token = string(b)
		}
	}
	return &apiClient{base: strings.TrimRight(base, "/"), token: strings.TrimSpace(token), hc: &http.Client{Timeout: 30 * time.Second}}, nil
}

// call sends method path?query with body (nil: none) as JSON and returns the answer's body;
// an answer other than 2xx is an *apiError with the API's message.
func (a *apiClient) call(ctx context.Context, method, path string, query url.Values, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	u := a.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("the API at %s does not answer (is `go tool task up` running? --api-url, LOCKS_API_URL): %w", a.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return b, nil
	}
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
		if e.Message == "" {
			e.Message = resp.Status
		}
	}
	if resp.StatusCode == http.StatusUnauthorized && a.token == "" {
		e.Message += " (no token: set LOCKS_API_TOKEN or --token)"
	}
	return nil, &apiError{Status: resp.StatusCode, Message: e.Message}
}

// do calls the API and prints the answer: its JSON with --json, else table(body).
func (c *cli) do(ctx context.Context, method, path string, query url.Values, body any, table func(b []byte, w *tabwriter.Writer) error) error {
	a, err := c.api()
	if err != nil {
		return err
	}
	b, err := a.call(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	return c.print(b, table)
}

func (c *cli) print(b []byte, table func(b []byte, w *tabwriter.Writer) error) error {
	if c.json {
		var out bytes.Buffer
		if len(bytes.TrimSpace(b)) == 0 {
			b = []byte("{}")
		}
		if err := json.Indent(&out, b, "", "  "); err != nil {
			return fmt.Errorf("the API's answer is not JSON: %w", err)
		}
		out.WriteByte('\n')
		_, err := c.stdout.Write(out.Bytes())
		return err
	}
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	if err := table(b, w); err != nil {
		return err
	}
	return w.Flush()
}

// listPages follows a list's next_page_token, collecting the items of its array field until
// limit items (0: all). It returns the raw items and the token of the page after them.
func (c *cli) listPages(ctx context.Context, path string, query url.Values, field string, limit int) ([]json.RawMessage, string, error) {
	a, err := c.api()
	if err != nil {
		return nil, "", err
	}
	if query == nil {
		query = url.Values{}
	}
	var items []json.RawMessage
	for {
		size := 1000
		if limit > 0 && limit-len(items) < size {
			size = limit - len(items)
		}
		query.Set("page_size", strconv.Itoa(size))
		b, err := a.call(ctx, http.MethodGet, path, query, nil)
		if err != nil {
			return nil, "", err
		}
		page := map[string]json.RawMessage{}
		if err := json.Unmarshal(b, &page); err != nil {
			return nil, "", fmt.Errorf("the API's answer is not JSON: %w", err)
		}
		var got []json.RawMessage
		if raw := page[field]; len(raw) > 0 {
			if err := json.Unmarshal(raw, &got); err != nil {
				return nil, "", fmt.Errorf("the API's %s: %w", field, err)
			}
		}
		items = append(items, got...)
		var next string
		_ = json.Unmarshal(page["next_page_token"], &next)
		if next == "" || (limit > 0 && len(items) >= limit) {
			return items, next, nil
		}
		query.Set("page_token", next)
	}
}

// printList prints the items of a list: with --json as one object holding them under field
// (and the next page's token, when --limit cut the list), else a table with a row per item.
func (c *cli) printList(items []json.RawMessage, next, field string, header string, row func(item []byte) (string, error)) error {
	if c.json {
		if items == nil {
			items = []json.RawMessage{}
		}
		b, err := json.Marshal(map[string]any{field: items, "next_page_token": next})
		if err != nil {
			return err
		}
		return c.print(b, nil)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, header)
	for _, it := range items {
		line, err := row(it)
		if err != nil {
			return fmt.Errorf("the API's %s: %w", field, err)
		}
		fmt.Fprintln(w, line)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(c.stderr, "(more: raise --limit, or 0 for all)\n")
	}
	return nil
}

// jsonInt reads an integer the API sends as a JSON number or, for 64-bit ones (protojson), a
// string.
type jsonInt int64

func (n *jsonInt) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "null" || s == "" {
		*n = 0
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	*n = jsonInt(v)
	return err
}

// showTime is an API time (RFC 3339) in UTC to the millisecond; "-" when there is none.
func showTime(s string) string {
	if s == "" {
		return "-"
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// doorData names a reading's data: 0 is open, 1 closed (CONTRACT.md section 1).
func doorData(d int) string {
	switch d {
	case 0:
		return "0 (open)"
	case 1:
		return "1 (closed)"
	}
	return strconv.Itoa(d)
}

// pathID is one path segment of an id given on the command line.
func pathID(id string) string { return url.PathEscape(id) }

// nonEmpty is s, or "-" when it is empty.
func nonEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
