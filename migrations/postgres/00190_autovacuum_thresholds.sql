-- +goose Up
-- A vacuum or analyze of a partition makes every connection plan its statements over the
-- whole table again (each plan covers every partition), which with all connections busy costs
-- Postgres more CPU than the statements themselves, and webhooks wait meanwhile. With the
-- default threshold of 50 rows, each busy partition was vacuumed and analyzed at every
-- autovacuum round (once a minute), even with a few hundred rows. A partition now waits for
-- 5,000 changed rows (or its scale factor, on a large one): the rounds that touch it come
-- several times less often at an ordinary load, and a few thousand dead rows per partition
-- cost nothing to keep.
-- A threshold already set on a partition (by hand) is left as it is.
-- +goose StatementBegin
DO $$
DECLARE
    p regclass;
    opt text;
BEGIN
    FOR p IN SELECT relid FROM pg_partition_tree('sensor_state') WHERE isleaf
             UNION ALL
             SELECT relid FROM pg_partition_tree('notifier_deliveries') WHERE isleaf LOOP
        FOREACH opt IN ARRAY ARRAY['autovacuum_vacuum_threshold', 'autovacuum_analyze_threshold'] LOOP
            IF NOT EXISTS (SELECT 1 FROM pg_class c, unnest(c.reloptions) o
                           WHERE c.oid = p AND o LIKE opt || '=%') THEN
                EXECUTE format('ALTER TABLE %s SET (%s = 5000)', p, opt);
            END IF;
        END LOOP;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    p regclass;
BEGIN
    FOR p IN SELECT relid FROM pg_partition_tree('sensor_state') WHERE isleaf
             UNION ALL
             SELECT relid FROM pg_partition_tree('notifier_deliveries') WHERE isleaf LOOP
        EXECUTE format('ALTER TABLE %s RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold)', p);
    END LOOP;
END
$$;
-- +goose StatementEnd
