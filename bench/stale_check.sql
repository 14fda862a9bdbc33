-- The stale check of a PostgreSQL claim (host/src/inbox/postgres/lease.rs, NEWEST_HANDLED) before
-- and after migration 12, on 200 000 keyed deliveries over 1 000 keys, 1 in 500 replayed, with
-- generic plans as a claim runs it. Creates and drops database hookd_once_bench:
--   psql "$HOOKD_BENCH_POSTGRES_URL" -q -f bench/stale_check.sql
-- (the tables hold only the columns the statement reads; see docs/benchmarks.md).
DROP DATABASE IF EXISTS hookd_once_bench;
CREATE DATABASE hookd_once_bench;
\c hookd_once_bench
CREATE TABLE deliveries (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, source text NOT NULL, handler text NOT NULL, ordering_key text, sequence bigint, state text NOT NULL, attempts bigint NOT NULL DEFAULT 0, budget_base bigint NOT NULL DEFAULT 0);
CREATE TABLE attempts (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, delivery bigint NOT NULL REFERENCES deliveries(id), outcome text NOT NULL);
CREATE INDEX attempts_delivery ON attempts (delivery);
CREATE INDEX deliveries_open_heads ON deliveries (handler, source, ordering_key, (COALESCE(sequence, 0)), id) WHERE state IN ('pending', 'running', 'retrying') AND ordering_key IS NOT NULL;
CREATE INDEX deliveries_done_sequence ON deliveries (source, handler, ordering_key, sequence) WHERE state = 'done' AND ordering_key IS NOT NULL;
CREATE INDEX deliveries_state_event ON deliveries (state, id);
INSERT INTO deliveries (source, handler, ordering_key, sequence, state, attempts, budget_base)
SELECT 's', 'h', 'k' || (n % 1000), n, (ARRAY['done','done','done','dead','discarded','pending'])[n % 6 + 1], 1, CASE WHEN n % 500 = 0 THEN 1 ELSE 0 END FROM generate_series(1, 200000) n;
INSERT INTO attempts (delivery, outcome) SELECT id, 'ok' FROM deliveries;
ANALYZE;
SET plan_cache_mode = force_generic_plan;
PREPARE before(text,text,text) AS SELECT GREATEST((SELECT MAX(sequence) FROM deliveries WHERE source=$1 AND handler=$2 AND ordering_key=$3 AND state='done'), (SELECT MAX(d.sequence) FROM deliveries d WHERE d.source=$1 AND d.handler=$2 AND d.ordering_key=$3 AND d.state IN ('pending','running','retrying','dead','discarded') AND EXISTS (SELECT 1 FROM attempts a WHERE a.delivery=d.id AND a.outcome='ok')));
CREATE INDEX deliveries_once_handled ON deliveries (source, handler, ordering_key, sequence) WHERE budget_base > 0 AND ordering_key IS NOT NULL;
PREPARE after(text,text,text) AS SELECT GREATEST((SELECT MAX(sequence) FROM deliveries WHERE source=$1 AND handler=$2 AND ordering_key=$3 AND state='done'), (SELECT MAX(d.sequence) FROM deliveries d WHERE d.source=$1 AND d.handler=$2 AND d.ordering_key=$3 AND d.budget_base > 0 AND d.state IN ('pending','running','retrying','dead','discarded') AND EXISTS (SELECT 1 FROM attempts a WHERE a.delivery=d.id AND a.outcome='ok')));
\timing on
EXECUTE before('s','h','k500');
EXECUTE before('s','h','k500');
EXECUTE before('s','h','k500');
EXECUTE after('s','h','k500');
EXECUTE after('s','h','k500');
EXECUTE after('s','h','k500');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE before('s','h','k500');
EXPLAIN (ANALYZE, BUFFERS) EXECUTE after('s','h','k500');
\c postgres
DROP DATABASE hookd_once_bench;
