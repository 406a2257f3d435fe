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

// apiSensor is what the tables show of a sensor (proto Sensor).
type apiSensor struct {
	ID         string    `json:"id"`
	Address    string    `json:"address"`
	LostAfter  string    `json:"lost_after"`
	State      *apiState `json:"state"`
	CreateTime string    `json:"create_time"`
}

// apiState is a sensor's state (proto SensorState).
type apiState struct {
	SensorID     string  `json:"sensor_id"`
	Data         int     `json:"data"`
	Connection   string  `json:"connection"`
	LastSeenTime string  `json:"last_seen_time"`
	ChangedTime  string  `json:"changed_time"`
	Revision     jsonInt `json:"revision"`
}

// connection is CONNECTION_ONLINE as "online"; the unspecified one (no reading yet) as "-".
func connection(c string) string {
	c = strings.ToLower(strings.TrimPrefix(c, "CONNECTION_"))
	if c == "" || c == "unspecified" {
		return "-"
	}
	return c
}

// summary is the state in one cell: "1 (closed), online, revision 2", or "no reading yet".
func (s *apiState) summary() string {
	if s == nil || s.Revision == 0 {
		return "no reading yet"
	}
	return fmt.Sprintf("%s, %s, revision %d", doorData(s.Data), connection(s.Connection), s.Revision)
}

func printSensor(b []byte, w *tabwriter.Writer) error {
	var s apiSensor
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("the API's sensor: %w", err)
	}
	fmt.Fprintf(w, "id\t%s\n", s.ID)
	fmt.Fprintf(w, "address\t%s\n", s.Address)
	if s.LostAfter != "" {
		if d, err := time.ParseDuration(s.LostAfter); err == nil {
			fmt.Fprintf(w, "lost after\t%s\n", d)
		}
	}
	fmt.Fprintf(w, "state\t%s\n", s.State.summary())
	fmt.Fprintf(w, "created\t%s\n", showTime(s.CreateTime))
	return nil
}

var sensorCommands = map[string]cliCommand{
	"import": sensorImportCommand,
	"create": {
		args:  "ID --address ADDRESS [--lost-after D]",
		about: "Registers a sensor (1 to 16 letters and digits). Its readings count from then on; a state it already has shows at once.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			address := fs.String("address", "", "where the lock is (required)")
			lostAfter := fs.Duration("lost-after", 0, "silence after which this sensor is lost (default the system's LOCKS_LOST_AFTER)")
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			if *address == "" {
				return usagef("--address is required")
			}
			body := map[string]any{"id": pos[0], "address": *address}
			if *lostAfter != 0 {
				body["lost_after"] = fmt.Sprintf("%gs", lostAfter.Seconds())
			}
			return c.do(ctx, http.MethodPost, "/v1/sensors", nil, body, printSensor)
		},
	},
	"get": {
		args:  "ID",
		about: "Shows a sensor with its state.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			return c.do(ctx, http.MethodGet, "/v1/sensors/"+pathID(pos[0]), nil, nil, printSensor)
		},
	},
	"list": {
		args:  "[--connection online|lost] [--data 0|1] [--limit N]",
		about: "Lists the registered sensors with their state.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			conn := fs.String("connection", "", "only the sensors online or lost")
			data := fs.String("data", "", "only the sensors whose last reading is 0 (open) or 1 (closed)")
			limit := fs.Int("limit", 0, "at most this many (0: all)")
			if _, err := c.parse(fs, args, 0, 0); err != nil {
				return err
			}
			q := url.Values{}
			switch *conn {
			case "":
			case "online", "lost":
				q.Set("connection", "CONNECTION_"+strings.ToUpper(*conn))
			default:
				return usagef("--connection must be online or lost")
			}
			switch *data {
			case "":
			case "0", "1":
				q.Set("data", *data)
			default:
				return usagef("--data must be 0 or 1")
			}
			items, next, err := c.listPages(ctx, "/v1/sensors", q, "sensors", *limit)
			if err != nil {
				return err
			}
			return c.printList(items, next, "sensors", "ID\tADDRESS\tDATA\tCONNECTION\tLAST SEEN\tREVISION", func(b []byte) (string, error) {
				var s apiSensor
				if err := json.Unmarshal(b, &s); err != nil {
					return "", err
				}
				if s.State == nil || s.State.Revision == 0 {
					return fmt.Sprintf("%s\t%s\t-\t-\t-\t-", s.ID, s.Address), nil
				}
				st := s.State
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d", s.ID, s.Address, doorData(st.Data), connection(st.Connection), showTime(st.LastSeenTime), st.Revision), nil
			})
		},
	},
	"delete": {
		args:  "ID",
		about: "Deletes a sensor and its subscriptions. Its readings are still recorded.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			return c.do(ctx, http.MethodDelete, "/v1/sensors/"+pathID(pos[0]), nil, nil, func(_ []byte, w *tabwriter.Writer) error {
				fmt.Fprintf(w, "deleted sensor %s\n", pos[0])
				return nil
			})
		},
	},
}

var stateCommand = cliCommand{
	args:  "SENSOR",
	about: "Shows a sensor's current state: its last reading, online or lost, since when, and its revision (the count of its events).",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		c.apiFlags(fs)
		pos, err := c.parse(fs, args, 1, 1)
		if err != nil {
			return err
		}
		return c.do(ctx, http.MethodGet, "/v1/sensors/"+pathID(pos[0])+"/state", nil, nil, func(b []byte, w *tabwriter.Writer) error {
			var s apiState
			if err := json.Unmarshal(b, &s); err != nil {
				return fmt.Errorf("the API's state: %w", err)
			}
			fmt.Fprintf(w, "sensor\t%s\n", s.SensorID)
			fmt.Fprintf(w, "data\t%s\n", doorData(s.Data))
			fmt.Fprintf(w, "connection\t%s\n", connection(s.Connection))
			fmt.Fprintf(w, "last seen\t%s\n", showTime(s.LastSeenTime))
			fmt.Fprintf(w, "changed\t%s\n", showTime(s.ChangedTime))
			fmt.Fprintf(w, "revision\t%d\n", s.Revision)
			return nil
		})
	},
}
