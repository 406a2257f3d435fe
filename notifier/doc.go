// Package notifier turns EVENTS into signed webhook deliveries with durable, growing retries.
package notifier
