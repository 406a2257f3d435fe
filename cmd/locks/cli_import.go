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
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// importBatch is the most sensors of one batchCreate call (the API's limit).
const importBatch = 1000

// sensorLine is one sensor of an import file and the line it is on.
type sensorLine struct {
	line        int
	id, address string
}

// readSensorLines reads `ID,ADDRESS` lines (the address is everything after the first comma,
// commas included: an id has none); blank lines and lines starting with # are skipped.
func readSensorLines(r io.Reader) ([]sensorLine, error) {
	var out []sensorLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		id, addr, ok := strings.Cut(l, ",")
		if !ok {
			return nil, fmt.Errorf("line %d: want ID,ADDRESS", n)
		}
		out = append(out, sensorLine{line: n, id: strings.TrimSpace(id), address: strings.TrimSpace(addr)})
	}
	return out, sc.Err()
}

// itemRef is how the API names an item of a batch: requests[3], requests[3].sensor.id.
var itemRef = regexp.MustCompile(`requests\[(\d+)\](?:\.sensor)?\.?`)

// inLines says the API's message about a batch in the import file's terms: requests[3] is
// the fourth sensor of the batch, and requests[3].sensor.id "x" says "line 57 id "x"".
func inLines(err error, batch []sensorLine) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	msg := itemRef.ReplaceAllStringFunc(ae.Message, func(m string) string {
		i, _ := strconv.Atoi(itemRef.FindStringSubmatch(m)[1])
		if i < len(batch) {
			return "line " + strconv.Itoa(batch[i].line) + " "
		}
		return m
	})
	return &apiError{Status: ae.Status, Message: fmt.Sprintf("lines %d to %d: %s", batch[0].line, batch[len(batch)-1].line, msg)}
}

var sensorImportCommand = cliCommand{
	args:  "FILE|- [--subscribe CLIENT] [--skip-existing]",
	about: "Registers many sensors from ID,ADDRESS lines (a file, or - for stdin), 1,000 a call (POST /v1/sensors:batchCreate), each call all or none; with --subscribe, subscribes the client to them too.",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		c.apiFlags(fs)
		client := fs.String("subscribe", "", "subscribe this client to every sensor of the file")
		skip := fs.Bool("skip-existing", false, "leave the sensors already registered as they are instead of failing (to run an import again)")
		pos, err := c.parse(fs, args, 1, 1)
		if err != nil {
			return err
		}
		var in io.Reader = os.Stdin
		if pos[0] != "-" {
			f, err := os.Open(pos[0])
			if err != nil {
				return err
			}
			defer f.Close()
			in = f
		}
		lines, err := readSensorLines(in)
		if err != nil {
			return usagef("%s: %v", pos[0], err)
		}
		if len(lines) == 0 {
			return usagef("%s holds no sensor", pos[0])
		}
		a, err := c.api()
		if err != nil {
			return err
		}
		start := time.Now()
		var created, subscribed int
		for lo := 0; lo < len(lines); lo += importBatch {
			batch := lines[lo:min(lo+importBatch, len(lines))]
			sensors := make([]map[string]any, len(batch))
			subs := make([]map[string]any, len(batch))
			for i, l := range batch {
				sensors[i] = map[string]any{"sensor": map[string]any{"id": l.id, "address": l.address}}
				subs[i] = map[string]any{"sensor_id": l.id}
			}
			b, err := a.call(ctx, http.MethodPost, "/v1/sensors:batchCreate", nil, map[string]any{"requests": sensors, "skip_existing": *skip})
			if err != nil {
				return fmt.Errorf("%w (%d sensors registered before)", inLines(err, batch), created)
			}
			var res struct {
				Created int `json:"created"`
			}
			if err := json.Unmarshal(b, &res); err != nil {
				return fmt.Errorf("the API's answer: %w", err)
			}
			created += res.Created
			if *client != "" {
				if _, err := a.call(ctx, http.MethodPost, "/v1/clients/"+url.PathEscape(*client)+"/sensors:batchCreate", nil, map[string]any{"requests": subs}); err != nil {
					return fmt.Errorf("subscribe: %w", inLines(err, batch))
				}
				subscribed += len(batch)
			}
		}
		took := time.Since(start)
		out := map[string]any{"sensors": len(lines), "created": created, "subscribed": subscribed, "seconds": took.Seconds()}
		if c.json {
			return json.NewEncoder(c.stdout).Encode(out)
		}
		fmt.Fprintf(c.stdout, "registered %d sensors (%d already were) in %s: %.0f/s\n",
			created, len(lines)-created, took.Round(time.Millisecond), float64(len(lines))/took.Seconds())
		if *client != "" {
			fmt.Fprintf(c.stdout, "subscribed client %s to %d sensors\n", *client, subscribed)
		}
		return nil
	},
}
