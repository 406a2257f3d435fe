package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
)

// historyFlags are the time window and length of a history list.
type historyFlags struct {
	start, end string
	since      time.Duration
	limit      int
}

func (h *historyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.start, "start", "", "from this time on (RFC 3339, inclusive)")
	fs.StringVar(&h.end, "end", "", "before this time (RFC 3339, exclusive)")
	fs.DurationVar(&h.since, "since", 0, "from this long ago on (e.g. 1h; instead of --start)")
	fs.IntVar(&h.limit, "limit", 100, "at most this many, oldest first (0: all)")
}

func (h *historyFlags) query() (url.Values, error) {
	q := url.Values{}
	if h.since != 0 && h.start != "" {
		return nil, usagef("--since and --start exclude each other")
	}
	if h.since < 0 {
		return nil, usagef("--since must be positive")
	}
	if h.limit < 0 {
		return nil, usagef("--limit must be 0 (all) or more")
	}
	if h.since > 0 {
		q.Set("start_time", time.Now().Add(-h.since).UTC().Format(time.RFC3339Nano))
	}
	for name, v := range map[string]string{"start": h.start, "end": h.end} {
		if v == "" {
			continue
		}
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			return nil, usagef("--%s=%q is not an RFC 3339 time (e.g. 2026-11-22T10:00:00Z)", name, v)
		}
		q.Set(name+"_time", v)
	}
	return q, nil
}

var readingsCommand = cliCommand{
	args:  "SENSOR [--since D | --start T] [--end T] [--limit N]",
	about: "Lists a sensor's readings, oldest first: each with the sensor's time and the time it was received.",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		c.apiFlags(fs)
		var h historyFlags
		h.register(fs)
		pos, err := c.parse(fs, args, 1, 1)
		if err != nil {
			return err
		}
		q, err := h.query()
		if err != nil {
			return err
		}
		items, next, err := c.listPages(ctx, "/v1/sensors/"+pathID(pos[0])+"/readings", q, "readings", h.limit)
		if err != nil {
			return err
		}
		return c.printList(items, next, "readings", "TIME\tDATA\tRECEIVED", func(b []byte) (string, error) {
			var r struct {
				Data         int    `json:"data"`
				Time         string `json:"time"`
				ReceivedTime string `json:"received_time"`
			}
			err := json.Unmarshal(b, &r)
			return fmt.Sprintf("%s\t%s\t%s", showTime(r.Time), doorData(r.Data), showTime(r.ReceivedTime)), err
		})
	},
}

// eventType is EVENT_TYPE_STATE_CHANGED as the webhooks name it, sensor.state_changed.
func eventType(t string) string {
	if s, ok := strings.CutPrefix(t, "EVENT_TYPE_"); ok {
		return "sensor." + strings.ToLower(s)
	}
	return t
}

// apiEvent is a sensor's event in the history (proto SensorEvent).
type apiEvent struct {
	ID           string  `json:"id"`
	Type         string  `json:"type"`
	Time         string  `json:"time"`
	Data         int     `json:"data"`
	PreviousData *int    `json:"previous_data"`
	Revision     jsonInt `json:"revision"`
}

var eventsCommand = cliCommand{
	args: "SENSOR [--since D | --start T] [--end T] [--limit N]  |  CLIENT [--follow] [--after CURSOR] [--limit N]",
	about: "Lists a sensor's events, oldest first: state changes and connections lost and restored, as its webhooks carried them.\n" +
		"For a CLIENT (cl_…): its event feed, every event its subscriptions selected in the order it got them, each the webhook body;\n" +
		"--follow keeps watching and resumes from the last event after a disconnect. A client token (LOCKS_API_TOKEN) reads its own.",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		c.apiFlags(fs)
		var h historyFlags
		h.register(fs)
		var f feedFlags
		f.register(fs)
		pos, err := c.parse(fs, args, 1, 1)
		if err != nil {
			return err
		}
		set := map[string]bool{}
		fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
		if isClientID(pos[0]) {
			if set["since"] || set["start"] || set["end"] {
				return usagef("--since, --start and --end are for a sensor's events; a client's feed reads on from --after")
			}
			if h.limit < 0 {
				return usagef("--limit must be 0 (all) or more")
			}
			limit := h.limit
			if !set["limit"] {
				limit = 0 // the feed to its end, or for ever with --follow
			}
			return c.clientEvents(ctx, pos[0], f, limit)
		}
		if set["follow"] || set["after"] {
			return usagef("--follow and --after are for a client's feed (locks events CLIENT); %q is a sensor id", pos[0])
		}
		q, err := h.query()
		if err != nil {
			return err
		}
		items, next, err := c.listPages(ctx, "/v1/sensors/"+pathID(pos[0])+"/events", q, "events", h.limit)
		if err != nil {
			return err
		}
		return c.printList(items, next, "events", "TIME\tTYPE\tDATA\tPREVIOUS\tREVISION\tEVENT ID", func(b []byte) (string, error) {
			var e apiEvent
			err := json.Unmarshal(b, &e)
			prev := "-"
			if e.PreviousData != nil {
				prev = doorData(*e.PreviousData)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s", showTime(e.Time), eventType(e.Type), doorData(e.Data), prev, e.Revision, e.ID), err
		})
	},
}

// outcome is DELIVERY_OUTCOME_DELIVERED as "delivered".
func outcome(o string) string {
	return strings.ToLower(strings.TrimPrefix(o, "DELIVERY_OUTCOME_"))
}

// latency is a proto Duration ("0.012s") in milliseconds.
func latency(d string) string {
	v, err := time.ParseDuration(d)
	if err != nil {
		return nonEmpty(d)
	}
	return fmt.Sprintf("%.1f ms", float64(v)/float64(time.Millisecond))
}

var deliveriesCommand = cliCommand{
	args:  "CLIENT [--dead] [--since D | --start T] [--end T] [--limit N]",
	about: "Lists a client's webhook attempts, oldest first (status, latency, outcome); with --dead its dead letters instead, which `locks redrive` sends again.",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		c.apiFlags(fs)
		var h historyFlags
		h.register(fs)
		dead := fs.Bool("dead", false, "the dead-lettered deliveries (every attempt failed) instead of the attempts")
		pos, err := c.parse(fs, args, 1, 1)
		if err != nil {
			return err
		}
		q, err := h.query()
		if err != nil {
			return err
		}
		path := "/v1/clients/" + pathID(pos[0]) + "/deliveries"
		if !*dead {
			items, next, err := c.listPages(ctx, path, q, "deliveries", h.limit)
			if err != nil {
				return err
			}
			return c.printList(items, next, "deliveries", "TIME\tEVENT ID\tSENSOR\tATTEMPT\tSTATUS\tLATENCY\tOUTCOME\tERROR", func(b []byte) (string, error) {
				var d struct {
					EventID    string `json:"event_id"`
					SensorID   string `json:"sensor_id"`
					Attempt    int    `json:"attempt"`
					Time       string `json:"time"`
					StatusCode int    `json:"status_code"`
					Latency    string `json:"latency"`
					Outcome    string `json:"outcome"`
					Error      string `json:"error"`
				}
				err := json.Unmarshal(b, &d)
				return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s", showTime(d.Time), d.EventID, d.SensorID, d.Attempt, d.StatusCode, latency(d.Latency), outcome(d.Outcome), nonEmpty(d.Error)), err
			})
		}
		q.Set("state", "dead")
		items, next, err := c.listPages(ctx, path, q, "dead_deliveries", h.limit)
		if err != nil {
			return err
		}
		return c.printList(items, next, "dead_deliveries", "DEAD SINCE\tEVENT ID\tSENSOR\tREVISION\tATTEMPTS\tLAST STATUS\tLAST ERROR", func(b []byte) (string, error) {
			var d struct {
				EventID        string  `json:"event_id"`
				SensorID       string  `json:"sensor_id"`
				Revision       jsonInt `json:"revision"`
				Attempts       int     `json:"attempts"`
				LastStatusCode int     `json:"last_status_code"`
				LastError      string  `json:"last_error"`
				DeadTime       string  `json:"dead_time"`
			}
			err := json.Unmarshal(b, &d)
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%d\t%s", showTime(d.DeadTime), d.EventID, d.SensorID, d.Revision, d.Attempts, d.LastStatusCode, nonEmpty(d.LastError)), err
		})
	},
}

var redriveCommand = cliCommand{
	args:  "CLIENT [--start T] [--end T]",
	about: "Sends a client's dead letters again (those that died in the window, default all), as new deliveries with their webhook-ids.",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		c.apiFlags(fs)
		start := fs.String("start", "", "only those that died at or after this time (RFC 3339)")
		end := fs.String("end", "", "only those that died before this time (RFC 3339)")
		pos, err := c.parse(fs, args, 1, 1)
		if err != nil {
			return err
		}
		body := map[string]any{}
		for name, v := range map[string]string{"start": *start, "end": *end} {
			if v == "" {
				continue
			}
			if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
				return usagef("--%s=%q is not an RFC 3339 time (e.g. 2026-11-22T10:00:00Z)", name, v)
			}
			body[name+"_time"] = v
		}
		return c.do(ctx, http.MethodPost, "/v1/clients/"+pathID(pos[0])+"/deliveries:redrive", nil, body, func(b []byte, w *tabwriter.Writer) error {
			var r struct {
				Redriven int `json:"redriven"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("the API's answer: %w", err)
			}
			fmt.Fprintf(w, "redriven %d dead deliveries of client %s\n", r.Redriven, pos[0])
			return nil
		})
	},
}
