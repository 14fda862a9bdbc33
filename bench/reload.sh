#!/usr/bin/env bash
# hookd's reload benchmarks: bench/reload.sh [swap|restart|all]   (default: all)
#
#   swap     time from a plugin file landing in plugins_dir (rename into place) to the first
#            handler attempt that ran the new version, while events arrive every 10 ms; for
#            each example plugin (a handler instance loads each file in turn), ROUNDS times.
#            Each landed file is a new version (a distinct custom section), so every round
#            compiles: the artifact cache cannot help a file it has never seen.
#   restart  `hookd serve` with 20 distinct plugin files (5 versions of each example plugin),
#            from process start to the first 200 from /healthz (plugins are loaded before
#            hookd serves): cold (empty compiled-artifact cache) and warm (cache filled by the
#            previous start), RUNS times each.
#
# Builds release hookd and the wasm plugins first (`cargo build --release -p tests`). Needs
# curl, jq, sha256sum and python3 (for free ports). Knobs (environment): ROUNDS=5 RUNS=5.
# Everything runs on 127.0.0.1; hosts live in target/bench-reload/.
set -euo pipefail

scenario="${1:-all}"
case "$scenario" in
swap | restart | all) ;;
*)
    echo "usage: bench/reload.sh [swap|restart|all]" >&2
    exit 2
    ;;
esac
ROUNDS="${ROUNDS:-5}"
RUNS="${RUNS:-5}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
for tool in curl jq sha256sum python3; do
    command -v "$tool" >/dev/null || {
        echo "bench/reload.sh needs $tool" >&2
        exit 1
    }
done

echo "== building (release): hookd and the wasm plugins" >&2
cargo build --release -p tests >&2
hookd="$root/target/release/hookd"
wasm="$root/target/wasm-plugins/wasm32-wasip2/release"
work="$root/target/bench-reload"
rm -rf "$work"
mkdir -p "$work"
token=bench-token

now_ms() { date +%s%3N; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# variant <plugin> <n> <dest>: the plugin's component plus a custom section naming version n,
# so each file has its own sha256 but the same code.
variant() {
    local payload
    payload="$(printf 'version-%04d' "$2")" # 12 bytes; section = 1 + 11 + 12 = 24 bytes
    {
        cat "$wasm/$1.wasm"
        printf '\x00\x18\x0bhookd-bench%s' "$payload"
    } >"$3"
}

# start <dir>: runs hookd serve on <dir>/hookd.toml in the background; sets pid.
start() {
    "$hookd" serve --config "$1/hookd.toml" >>"$1/hookd.log" 2>&1 &
    pid=$!
}

# wait_healthy <admin port>: blocks until /healthz answers 200 (a connection made while hookd
# still loads plugins waits in the accept queue, so this returns when serving starts).
wait_healthy() {
    until curl -sf -o /dev/null --max-time 30 "http://127.0.0.1:$1/healthz"; do
        kill -0 "$pid" 2>/dev/null || {
            echo "hookd exited; see its log" >&2
            exit 1
        }
        sleep 0.002
    done
}

stop() {
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# stats <name> <values...>: prints min / median / max (ms).
stats() {
    local name="$1"
    shift
    printf '%s\n' "$@" | sort -n | awk -v name="$name" '
        { v[NR] = $1 }
        END { printf "%-44s min %5d  median %5d  max %5d ms  (n=%d)\n", name, v[1], v[int((NR + 1) / 2)], v[NR], NR }'
}

swap() {
    local dir="$work/swap" ingest admin
    mkdir -p "$dir/plugins"
    ingest="$(free_port)"
    admin="$(free_port)"
    cp "$wasm/generic.wasm" "$dir/plugins/generic.wasm"
    variant classifier 0 "$dir/plugins/h.wasm"
    cat >"$dir/hookd.toml" <<EOF
[server]
listen = "127.0.0.1:$ingest"
admin_listen = "127.0.0.1:$admin"
admin_token = "$token"
durability = "normal"

[sources.b]
scheme = "none"
parser = "generic"
handlers = ["h"]

[plugins.generic]
config = { id_pointer = "/id" }

[plugins.h]
wasm = "h"
EOF
    start "$dir"
    wait_healthy "$admin"
    local auth=(-H "Authorization: Bearer $token")
    local n=0 plugin round
    for plugin in classifier github stripe generic; do
        # github/stripe/generic are parsers: loading one as `h` is still a swap; its attempts
        # then fail with missing_role, and the sha they record is what is measured.
        local results=()
        for round in $(seq 1 "$ROUNDS"); do
            n=$((n + 1))
            variant "$plugin" "$n" "$dir/next.wasm.part"
            local sha
            sha="$(sha256sum "$dir/next.wasm.part" | cut -d' ' -f1)"
            # Events every 10 ms, before and after the file lands.
            (
                k=0
                while :; do
                    k=$((k + 1))
                    curl -s -o /dev/null -X POST "http://127.0.0.1:$ingest/hooks/b" \
                        -d "{\"id\":\"r$n-$k\"}"
                    echo "$k" >"$dir/posted.tmp" && mv "$dir/posted.tmp" "$dir/posted"
                    sleep 0.01
                done
            ) &
            local poster=$!
            sleep 0.2
            local landed
            landed="$(now_ms)"
            mv "$dir/next.wasm.part" "$dir/plugins/h.wasm"
            # Wait until the registry reports the new version, then a little longer so the
            # events posted around the swap have been attempted.
            until curl -s "${auth[@]}" "http://127.0.0.1:$admin/admin/plugins" |
                jq -e --arg sha "$sha" '.[] | select(.name == "h") | .sha256 == $sha' >/dev/null; do
                sleep 0.005
                if (($(now_ms) - landed > 60000)); then
                    echo "no swap within 60 s; see $dir/hookd.log" >&2
                    exit 1
                fi
            done
            sleep 0.3
            kill "$poster" 2>/dev/null || true
            wait "$poster" 2>/dev/null || true
            # The first attempt that ran the new sha (events are scanned from the start).
            local first="" k last
            last="$(cat "$dir/posted")"
            for k in $(seq 1 "$last"); do
                local started
                started="$(curl -s "${auth[@]}" "http://127.0.0.1:$admin/admin/events/b/r$n-$k" |
                    jq -r --arg sha "$sha" \
                        '[.deliveries[]?.history[]? | select(.plugin_sha256 == $sha) | .started_at] | min // empty')"
                if [[ -n "$started" ]] && { [[ -z "$first" ]] || ((started < first)); }; then
                    first="$started"
                fi
            done
            if [[ -z "$first" ]]; then
                echo "no attempt ran $sha; see $dir/hookd.log" >&2
                exit 1
            fi
            results+=("$((first - landed))")
        done
        stats "swap $plugin ($(stat -c %s "$wasm/$plugin.wasm") bytes): land -> first attempt" "${results[@]}"
    done
    stop
}

restart() {
    local dir="$work/restart" admin i plugin
    mkdir -p "$dir/plugins"
    admin="$(free_port)"
    {
        printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n' "$(free_port)" "$admin"
        printf 'admin_token = "%s"\ndurability = "normal"\n' "$token"
        i=0
        for plugin in github stripe generic classifier; do
            for _ in 1 2 3 4 5; do
                i=$((i + 1))
                variant "$plugin" "$i" "$dir/plugins/p$i.wasm"
                printf '\n[plugins.p%d]\nwasm = "p%d"\n' "$i" "$i"
            done
        done
    } >"$dir/hookd.toml"
    local cold=() warm=() run started
    for run in $(seq 1 "$RUNS"); do
        rm -rf "$dir/.hookd-cache"
        started="$(now_ms)"
        start "$dir"
        wait_healthy "$admin"
        cold+=("$(($(now_ms) - started))")
        stop

        started="$(now_ms)"
        start "$dir"
        wait_healthy "$admin"
        warm+=("$(($(now_ms) - started))")
        stop
    done
    local loaded
    loaded="$(grep -c 'plugin loaded' "$dir/hookd.log")"
    echo "($loaded 'plugin loaded' lines over $((2 * RUNS)) starts of 20 plugins)"
    stats "restart, 20 plugins, cold cache: to healthy" "${cold[@]}"
    stats "restart, 20 plugins, warm cache: to healthy" "${warm[@]}"
}

echo "== machine: $(nproc) cores, $(uname -sr); load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ "$scenario" == swap || "$scenario" == all ]]; then
    echo "== swap (ROUNDS=$ROUNDS)"
    swap
fi
if [[ "$scenario" == restart || "$scenario" == all ]]; then
    echo "== restart (RUNS=$RUNS)"
    restart
fi
echo "== done; load average $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine inflates the figures)"
