-- +goose Up
-- The W3C traceparent of the reading an event was derived from, while tracing is on: the
-- outbox relay sends it as the EVENTS message's traceparent header, and the notifier keeps
-- it on each delivery, so that every attempt's span joins the reading's trace. NULL
-- without tracing; adding a nullable column rewrites no row.
ALTER TABLE outbox ADD COLUMN traceparent text;
ALTER TABLE notifier_deliveries ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE notifier_deliveries DROP COLUMN traceparent;
ALTER TABLE outbox DROP COLUMN traceparent;
