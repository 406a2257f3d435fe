-- +goose Up
-- A claim writes only lease_until and lease_token, which no index holds: with room on the
-- row's page the update is HOT (no new index entries, nothing for the claim's index scans to
-- step over later). Rows are inserted in batches that fill their pages, so without free
-- space every claim was a full update, touching every index of the partition.
-- +goose StatementBegin
DO $$
BEGIN
    FOR r IN 0..15 LOOP
        EXECUTE format('ALTER TABLE notifier_deliveries_p%s SET (fillfactor = 50)', lpad(r::text, 2, '0'));
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    FOR r IN 0..15 LOOP
        EXECUTE format('ALTER TABLE notifier_deliveries_p%s RESET (fillfactor)', lpad(r::text, 2, '0'));
    END LOOP;
END
$$;
-- +goose StatementEnd
