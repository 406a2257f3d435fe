-- +goose Up
-- The W3C traceparent of the reading an event was derived from, while tracing is on: the
-- outbox relay sends it as the EVENTS message's traceparent header, so the event's consumers
-- join the reading's trace. NULL without tracing; adding a nullable column rewrites nothing.
ALTER TABLE outbox ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE outbox DROP COLUMN traceparent;
