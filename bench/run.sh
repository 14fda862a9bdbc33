#!/usr/bin/env bash
# hookd's benchmarks: bench/run.sh [ingest|dispatch|invoke|cluster|retention|languages|peer|outage|all]
# (default: all)
#
#   ingest    durable accepts/s + ack latency (wrk, 64 connections, github signature + Wasm
#             parser, ~1.5 KB bodies, 10% duplicates, durability = "full"), group commit vs one
#             commit per request, and fsyncs per acknowledged request under strace
#   dispatch  handled events/s accept -> done (counter, flaky), backlog drain rate, and resident
#             memory per in-flight handler with 1 000 handlers waiting at once
#   invoke    instantiate + call overhead of one handler call (host/examples/invoke.rs)
#   cluster   SQLite, PostgreSQL with one node and with three nodes side by side: durable
#             accepts/s (as ingest) and handled events/s (stateless flaky, as dispatch); starts
#             a local PostgreSQL (.ci/postgres.sh --bench: Debian's default cluster and settings)
#             unless HOOKD_BENCH_POSTGRES_URL is set,
#             and PgBouncer in transaction mode before it (.ci/pgbouncer.sh) for a fourth row,
#             one node through it, unless HOOKD_BENCH_PGBOUNCER_URL is set; and handled events/s
#             of one node behind BACKLOG (100000) waiting deliveries of a handler not loaded
#   retention database size on disk and ingest p99 under a steady load (bench/steady.lua), with
#             retention off, on (done_after 30s) and on with ids forgotten (dedupe_for 30s), side by side,
#             RETENTION_DURATION (default 600s) per host, sampled every RETENTION_WINDOW (10s)
#   languages the scenario handler in Rust, JavaScript and Python (built here; needs Node 20 and
#             python3, installs the JS toolchain and componentize-py like .ci/run): size, compile
#             time and instantiate + call (examples/invoke --languages), start-up with an empty
#             and a warm compile cache, resident memory per in-flight handler (LANG_IN_FLIGHT=32
#             handlers held HOLD_MS=6000 on a slow HTTP call)
#   peer      hookd beside a native reference receiver (axum + rusqlite, Standard Webhooks,
#             group commit, synchronous=FULL), side by side in one run: durable accepts/s and
#             p99 without parser or handler and with the `github` parser and a delivery row, and
#             bytes stored per event. PEER_DIR names the receiver's Cargo project (built into
#             target/peer); PEER_REQUESTS (35000 per wrk thread) per round, PEER_ROUNDS (3)
#   outage    accepts/s (as ingest) while every ordering key's head waits on a retry (the flaky
#             handler failing every attempt, its retry an hour away), against the same source
#             with the handler not loaded, OUTAGE_ROUNDS (2) rounds alternating
#
# Builds release hookd, the wasm plugins and the example first. Needs wrk, strace and python3
# (installs wrk and strace with apt-get when missing). Knobs (environment): DURATION=30s
# WARMUP=5s THREADS=2 CONNECTIONS=64 FSYNC_REQUESTS=2000 EVENTS=20000 IN_FLIGHT=1000
# SLEEP_MS=20000 CALLS=20000 QUIET_WAIT=300 (seconds to wait for an idle machine before each
# measurement) BENCH_KEEP=1 (keep the databases) CLUSTER_ROWS=postgres-1,postgres-3 (cluster: only
# these rows of sqlite, postgres-1, postgres-3, pgbouncer-1, postgres-1-backlog) BACKLOG=100000. Everything runs on 127.0.0.1; each
# host lives in target/bench/<scenario>/.
set -euo pipefail

scenario="${1:-all}"
case "$scenario" in
ingest | dispatch | invoke | cluster | retention | languages | peer | outage | all) ;;
*)
    echo "usage: bench/run.sh [ingest|dispatch|invoke|cluster|retention|languages|peer|outage|all]" >&2
    exit 2
    ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v strace >/dev/null || need+=(strace)
if ((${#need[@]})); then
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== building (release): hookd, wasm plugins, examples/invoke" >&2
# The tests package builds the same `hookd` binary and, through tests/build.rs, every plugin
# (release wasm32-wasip2, in target/wasm-plugins).
cargo build --release -p tests >&2
if [[ "$scenario" == invoke || "$scenario" == languages || "$scenario" == all ]]; then
    cargo build --release -p host --example invoke >&2
fi
if [[ "$scenario" == languages || "$scenario" == all ]]; then
    echo "== building the scenario handler in JavaScript and Python" >&2
    [[ -d plugin-sdk/js/node_modules ]] || npm ci --prefix plugin-sdk/js --no-audit --no-fund >&2
    if [[ ! -x target/py-venv/bin/componentize-py ]]; then
        python3 -m venv target/py-venv
        target/py-venv/bin/pip install --quiet --require-hashes \
            -r plugin-sdk/python/requirements.txt >&2
    fi
    lang_dir=target/bench/languages
    mkdir -p "$lang_dir"
    cp target/wasm-plugins/wasm32-wasip2/release/scenario.wasm "$lang_dir/rust.wasm"
    node plugin-sdk/js/build.mjs tests/plugins-js/scenario/scenario.ts "$lang_dir/javascript.wasm" >&2
    bash plugin-sdk/python/build.sh tests/plugins-py/scenario scenario "$lang_dir/python.wasm" >&2
fi

if [[ "$scenario" == peer || ("$scenario" == all && -n "${PEER_DIR:-}") ]]; then
    if [[ -z "${PEER_DIR:-}" || ! -f "$PEER_DIR/Cargo.toml" ]]; then
        echo "bench/run.sh peer: set PEER_DIR to the native receiver's Cargo project" >&2
        exit 2
    fi
    echo "== building the native receiver from $PEER_DIR" >&2
    cargo build --release --manifest-path "$PEER_DIR/Cargo.toml" --target-dir target/peer >&2
    export PEER_BIN="$root/target/peer/release/native-peer"
fi

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ "$scenario" == ingest || "$scenario" == all ]]; then
    python3 bench/driver.py ingest
fi
if [[ "$scenario" == dispatch || "$scenario" == all ]]; then
    python3 bench/driver.py dispatch
fi
if [[ "$scenario" == invoke || "$scenario" == all ]]; then
    target/release/examples/invoke \
        target/wasm-plugins/wasm32-wasip2/release/counter.wasm "${CALLS:-20000}" \
        target/wasm-plugins/wasm32-wasip2/release/github.wasm
fi
if [[ "$scenario" == cluster || "$scenario" == all ]]; then
    export HOOKD_BENCH_POSTGRES_URL="${HOOKD_BENCH_POSTGRES_URL:-$(bash .ci/postgres.sh --bench)}"
    export HOOKD_BENCH_PGBOUNCER_URL="${HOOKD_BENCH_PGBOUNCER_URL:-$(bash .ci/pgbouncer.sh "$HOOKD_BENCH_POSTGRES_URL")}"
    python3 bench/driver.py cluster
fi
if [[ "$scenario" == retention || "$scenario" == all ]]; then
    python3 bench/driver.py retention
fi
if [[ "$scenario" == languages || "$scenario" == all ]]; then
    target/release/examples/invoke --languages --calls "${LANG_CALLS:-2000}" \
        rust="$lang_dir/rust.wasm" javascript="$lang_dir/javascript.wasm" \
        python="$lang_dir/python.wasm"
    python3 bench/driver.py languages
fi
if [[ -n "${PEER_BIN:-}" ]]; then
    python3 bench/driver.py peer
fi
if [[ "$scenario" == outage || "$scenario" == all ]]; then
    python3 bench/driver.py outage
fi
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
