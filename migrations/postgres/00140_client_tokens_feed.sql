-- +goose Up
-- Client tokens (issue 27): bearer tokens bound to one client, created by an administrator.
-- Only the SHA-256 of a token is kept; the API looks it up on every call (no cache), so a
-- deleted token is refused at once by every API instance. last_used_at is written at most
-- about once a minute per token and instance, not per call.
CREATE TABLE client_tokens (
    id           text PRIMARY KEY,
    client_id    text NOT NULL REFERENCES clients (id) ON DELETE CASCADE,
    name         text NOT NULL,
    hash         bytea NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);
CREATE INDEX client_tokens_client ON client_tokens (client_id, created_at, id);

-- The event feed (GET /v1/clients/{id}/events) reads a client's deliveries in the order the
-- notifier took them in: by the inserting transaction's id, then the row id. A row is shown
-- only once every transaction with a smaller id has ended (pg_snapshot_xmin), so a
-- transaction that commits late can never land behind a cursor already handed out; a
-- (transaction, id) pair never changes, so cursors survive restarts. Rows of before this
-- migration get 0 (a constant default: no table rewrite) and are ordered by id among
-- themselves; new rows get their transaction's id.
ALTER TABLE notifier_deliveries ADD COLUMN ingest_xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE notifier_deliveries ALTER COLUMN ingest_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX notifier_deliveries_feed ON notifier_deliveries (client_id, ingest_xid, id);
-- Which clients' feeds grew since the last look (the API's watch hub, one query per API
-- process and poll, whatever the number of watchers).
CREATE INDEX notifier_deliveries_ingest ON notifier_deliveries (ingest_xid);

-- +goose Down
DROP INDEX notifier_deliveries_ingest;
DROP INDEX notifier_deliveries_feed;
ALTER TABLE notifier_deliveries DROP COLUMN ingest_xid;
DROP TABLE client_tokens;
