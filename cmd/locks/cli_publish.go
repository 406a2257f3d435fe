package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/redact"
)

var publishCommand = cliCommand{
	args:  "SENSOR 0|1 [--message-id ID] [--ts T]",
	about: "Publishes one reading to RabbitMQ as a sensor sends it: {\"sensor_id\", \"data\"[, \"ts\"]} to the queue the bridge reads (LOCKS_AMQP_QUEUE), persistent. 0 is open, 1 closed.",
	run: func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
		vals := configFlags(fs, commandSettings["publish"]...)
		msgID := fs.String("message-id", "", "the AMQP message_id: a second reading of this sensor with the same one is recorded once")
		ts := fs.String("ts", "", `the sensor's time of the reading (RFC 3339, or "now"); default none: the time it is received`)
		pos, err := c.parse(fs, args, 2, 2)
		if err != nil {
			return err
		}
		cfg, err := config.Load(c.getenv, fs, vals)
		if err != nil {
			return usagef("%v", err)
		}
		reading := struct {
			SensorID string `json:"sensor_id"`
			Data     int    `json:"data"`
			TS       string `json:"ts,omitempty"`
		}{SensorID: pos[0]}
		switch pos[1] {
		case "0", "1":
			reading.Data = int(pos[1][0] - '0')
		default:
			return usagef("the reading is 0 (open) or 1 (closed), not %q", pos[1])
		}
		switch *ts {
		case "":
		case "now":
			reading.TS = time.Now().UTC().Format(time.RFC3339Nano)
		default:
			if _, err := time.Parse(time.RFC3339Nano, *ts); err != nil {
				return usagef("--ts=%q is not an RFC 3339 time (e.g. 2026-11-22T10:00:00.123Z) or now", *ts)
			}
			reading.TS = *ts
		}
		body, err := json.Marshal(reading)
		if err != nil {
			return err
		}
		if err := publishReading(ctx, cfg.AMQPURL, cfg.AMQPQueue, *msgID, body); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "published %s to %s on %s\n", body, cfg.AMQPQueue, redact.URL(cfg.AMQPURL))
		return nil
	},
}

// publishReading publishes body to queue through the default exchange, persistent and
// mandatory, and waits for RabbitMQ's confirm: a queue that does not exist (no bridge has
// declared it yet) is an error, not a reading silently dropped.
func publishReading(ctx context.Context, amqpURL, queue, msgID string, body []byte) error {
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": "locks-publish"}})
	if err != nil {
		return fmt.Errorf("LOCKS_AMQP_URL=%s: %w", redact.URL(amqpURL), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "application/json", MessageId: msgID, Timestamp: time.Now(), Body: body,
	})
	if err != nil {
		return fmt.Errorf("publish to %s: %w", queue, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("publish to %s: no confirm from RabbitMQ: %w", queue, err)
	}
	// RabbitMQ sends a mandatory message's return before its confirm, and the library hands
	// both over in that order: a return, if any, is in the channel now.
	select {
	case r := <-returns:
		return fmt.Errorf("RabbitMQ has no queue %s to route the reading to (%s): is the bridge (locks run) running, with the same LOCKS_AMQP_QUEUE?", queue, r.ReplyText)
	default:
	}
	if !acked {
		return fmt.Errorf("publish to %s: RabbitMQ refused the reading (nack)", queue)
	}
	return nil
}
