package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
)

// apiClientRes is what the tables show of a client (proto Client).
type apiClientRes struct {
	ID                  string   `json:"id"`
	Name                string   `json:"name"`
	WebhookURL          string   `json:"webhook_url"`
	SigningSecret       string   `json:"signing_secret"`
	PreviousSecretUntil string   `json:"previous_secret_until"`
	EventTypes          []string `json:"event_types"`
	CreateTime          string   `json:"create_time"`
	DisabledTime        string   `json:"disabled_time"`
	DisabledReason      string   `json:"disabled_reason"`
}

func (cl *apiClientRes) eventTypes() string {
	if len(cl.EventTypes) == 0 {
		return "all"
	}
	return strings.Join(cl.EventTypes, ",")
}

func (cl *apiClientRes) enabled() string {
	if cl.DisabledTime == "" {
		return "enabled"
	}
	return fmt.Sprintf("disabled since %s: %s", showTime(cl.DisabledTime), cl.DisabledReason)
}

func decodeClient(b []byte) (apiClientRes, error) {
	var cl apiClientRes
	if err := json.Unmarshal(b, &cl); err != nil {
		return cl, fmt.Errorf("the API's client: %w", err)
	}
	return cl, nil
}

func printClient(b []byte, w *tabwriter.Writer) error {
	cl, err := decodeClient(b)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "id\t%s\n", cl.ID)
	fmt.Fprintf(w, "name\t%s\n", cl.Name)
	fmt.Fprintf(w, "webhook url\t%s\n", cl.WebhookURL)
	fmt.Fprintf(w, "signing secret\t%s\n", cl.SigningSecret)
	if cl.PreviousSecretUntil != "" {
		fmt.Fprintf(w, "previous secret\tstill signs until %s\n", showTime(cl.PreviousSecretUntil))
	}
	fmt.Fprintf(w, "event types\t%s\n", cl.eventTypes())
	fmt.Fprintf(w, "webhooks\t%s\n", cl.enabled())
	fmt.Fprintf(w, "created\t%s\n", showTime(cl.CreateTime))
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// clientVerb is a command that takes one CLIENT and posts to /v1/clients/{id}:action.
func clientVerb(about, action string, print func(id string, b []byte, w *tabwriter.Writer) error) cliCommand {
	return cliCommand{
		args:  "CLIENT",
		about: about,
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			return c.do(ctx, http.MethodPost, "/v1/clients/"+pathID(pos[0])+":"+action, nil, map[string]any{},
				func(b []byte, w *tabwriter.Writer) error { return print(pos[0], b, w) })
		},
	}
}

var clientCommands = map[string]cliCommand{
	"create": {
		args:  "NAME --url URL [--event-types T,…] [--env]",
		about: "Registers a webhook client and prints its id and signing secret (whsec_…), with which its receiver verifies each webhook.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			u := fs.String("url", "", "the webhook URL the client's webhooks are POSTed to (required)")
			types := fs.String("event-types", "", "comma list of event types to send (default all): sensor.state_changed, sensor.connection_lost, sensor.connection_restored")
			env := fs.Bool("env", false, "print shell lines CLIENT_ID='…' and CLIENT_SECRET='…' (for eval \"$(locks client create …)\" or an env file)")
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			if *u == "" {
				return usagef("--url is required")
			}
			if *env && c.json {
				return usagef("--env and --json exclude each other")
			}
			body := map[string]any{"name": pos[0], "webhook_url": *u}
			if *types != "" {
				body["event_types"] = strings.Split(*types, ",")
			}
			print := printClient
			if *env {
				print = func(b []byte, w *tabwriter.Writer) error {
					cl, err := decodeClient(b)
					if err != nil {
						return err
					}
					fmt.Fprintf(w, "CLIENT_ID=%s\nCLIENT_SECRET=%s\n", shellQuote(cl.ID), shellQuote(cl.SigningSecret))
					return nil
				}
			}
			return c.do(ctx, http.MethodPost, "/v1/clients", nil, body, print)
		},
	},
	"get": {
		args:  "CLIENT",
		about: "Shows a client: its webhook URL, signing secret, event types, and whether its webhooks are enabled.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			return c.do(ctx, http.MethodGet, "/v1/clients/"+pathID(pos[0]), nil, nil, printClient)
		},
	},
	"list": {
		args:  "[--limit N]",
		about: "Lists the webhook clients.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			limit := fs.Int("limit", 0, "at most this many (0: all)")
			if _, err := c.parse(fs, args, 0, 0); err != nil {
				return err
			}
			items, next, err := c.listPages(ctx, "/v1/clients", nil, "clients", *limit)
			if err != nil {
				return err
			}
			return c.printList(items, next, "clients", "ID\tNAME\tWEBHOOK URL\tEVENT TYPES\tWEBHOOKS", func(b []byte) (string, error) {
				cl, err := decodeClient(b)
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", cl.ID, cl.Name, cl.WebhookURL, cl.eventTypes(), cl.enabled()), err
			})
		},
	},
	"delete": {
		args:  "CLIENT",
		about: "Deletes a client: its subscriptions end and its waiting webhooks are not attempted.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			return c.do(ctx, http.MethodDelete, "/v1/clients/"+pathID(pos[0]), nil, nil, func(_ []byte, w *tabwriter.Writer) error {
				fmt.Fprintf(w, "deleted client %s\n", pos[0])
				return nil
			})
		},
	},
	"rotate-secret": clientVerb("Gives a client a new signing secret; for a while webhooks carry the signatures of both, so its receiver can switch without losing one.",
		"rotateSecret", func(_ string, b []byte, w *tabwriter.Writer) error { return printClient(b, w) }),
	"test-event": clientVerb("Sends the client a signed sensor.test webhook (it shows in its deliveries) and prints its event id.",
		"sendTestEvent", func(_ string, b []byte, w *tabwriter.Writer) error {
			var r struct {
				EventID string `json:"event_id"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("the API's answer: %w", err)
			}
			fmt.Fprintf(w, "sent test event\t%s\n", r.EventID)
			return nil
		}),
	"enable": clientVerb("Enables a client's webhooks again; those that waited are delivered in order.",
		"enable", func(_ string, b []byte, w *tabwriter.Writer) error { return printClient(b, w) }),
	"disable": {
		args:  "CLIENT [--reason TEXT]",
		about: "Disables a client's webhooks: they wait, in order, until it is enabled.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			reason := fs.String("reason", "", "why (shown on the client and the dashboard)")
			pos, err := c.parse(fs, args, 1, 1)
			if err != nil {
				return err
			}
			body := map[string]any{}
			if *reason != "" {
				body["reason"] = *reason
			}
			return c.do(ctx, http.MethodPost, "/v1/clients/"+pathID(pos[0])+":disable", nil, body, printClient)
		},
	},
}

var subscriptionCommands = map[string]cliCommand{
	"create": {
		args:  "SENSOR CLIENT [--event-types T,…]",
		about: "Subscribes a client to a sensor's events (again: replaces the event types).",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			types := fs.String("event-types", "", "comma list of event types (default all): sensor.state_changed, sensor.connection_lost, sensor.connection_restored")
			pos, err := c.parse(fs, args, 2, 2)
			if err != nil {
				return err
			}
			body := map[string]any{}
			if *types != "" {
				body["event_types"] = strings.Split(*types, ",")
			}
			return c.do(ctx, http.MethodPut, "/v1/sensors/"+pathID(pos[0])+"/clients/"+pathID(pos[1]), nil, body, func(b []byte, w *tabwriter.Writer) error {
				var s struct {
					EventTypes []string `json:"event_types"`
				}
				if err := json.Unmarshal(b, &s); err != nil {
					return fmt.Errorf("the API's subscription: %w", err)
				}
				t := "all events"
				if len(s.EventTypes) > 0 {
					t = strings.Join(s.EventTypes, ", ")
				}
				fmt.Fprintf(w, "subscribed client %s to sensor %s (%s)\n", pos[1], pos[0], t)
				return nil
			})
		},
	},
	"delete": {
		args:  "SENSOR CLIENT",
		about: "Unsubscribes a client from a sensor: its webhooks of that sensor still waiting are not attempted.",
		run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
			c.apiFlags(fs)
			pos, err := c.parse(fs, args, 2, 2)
			if err != nil {
				return err
			}
			return c.do(ctx, http.MethodDelete, "/v1/sensors/"+pathID(pos[0])+"/clients/"+pathID(pos[1]), nil, nil, func(_ []byte, w *tabwriter.Writer) error {
				fmt.Fprintf(w, "unsubscribed client %s from sensor %s\n", pos[1], pos[0])
				return nil
			})
		},
	},
}
