#!/usr/bin/env bash
# The dashboard's server time on a large SQLite database:
#
#   bench/dashboard.sh [EVENTS]        (default 1 000 000)
#
# Builds release hookd (HOOKD=path to use another binary), lets it create and migrate an empty
# database in target/bench/dashboard/, fills it with EVENTS synthetic events
# (bench/dashboard_db.py says what they are), serves it again, signs in once, and asks each page
# RUNS times (default 7), printing the median and the slowest of curl's total time (loopback, so
# that is the server's time plus a few tens of microseconds); then the same for a /metrics
# scrape. Needs python3 and curl. FILL_ONLY=1 stops after filling; FILLED=1 reuses the filled
# database (to fill while the machine is busy and time the pages once it is quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
events="${1:-1000000}"
runs="${RUNS:-7}"
dir=target/bench/dashboard
admin=127.0.0.1:18181
if [ -z "${HOOKD:-}" ]; then
    cargo build --release -p host >&2
    HOOKD=target/release/hookd
fi
if [ -z "${FILLED:-}" ]; then
rm -rf "$dir"
mkdir -p "$dir/plugins"
cat >"$dir/hookd.toml" <<TOML
[server]
listen = "127.0.0.1:18180"
admin_listen = "$admin"
admin_token = "bench-token"
database = "hookd.db"
plugins_dir = "plugins"

[sources.github]
scheme = "github"
secrets = ["bench"]
handlers = ["classifier"]

[sources.stripe]
scheme = "stripe"
secrets = ["whsec_bench"]
handlers = ["classifier"]

[sources.generic]
scheme = "hmac-sha256"
secrets = ["bench"]
signature_header = "x-signature"
handlers = ["classifier"]

[plugins.classifier]
TOML
fi

serve() {
    "$HOOKD" serve --config "$dir/hookd.toml" >>"$dir/hookd.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        curl -sf "http://$admin/healthz" >/dev/null && return
        sleep 0.1
    done
    echo "hookd did not start; see $dir/hookd.log" >&2
    exit 1
}
stop() { kill -INT "$pid"; wait "$pid" || true; }

if [ -z "${FILLED:-}" ]; then
serve
stop
echo "filling $dir/hookd.db with $events events" >&2
python3 bench/dashboard_db.py "$dir/hookd.db" "$events" >&2
fi
[ -n "${FILL_ONLY:-}" ] && exit 0
serve
trap stop EXIT

jar="$dir/cookies"
curl -s -o /dev/null -c "$jar" --data-urlencode "token=bench-token" "http://$admin/sign-in"
mid=$((events / 2))
day_ms=$(( $(date +%s) * 1000 - 15 * 86400000 ))
since=$(date -u -d "@$((day_ms / 1000))" +%Y-%m-%dT%H:%M)
until=$(date -u -d "@$((day_ms / 1000 + 3600))" +%Y-%m-%dT%H:%M)
pages=(
    "/"
    "/events"
    "/events?before=$mid"
    "/events?q=evt-$mid"
    "/events?source=generic"
    "/events?event_type=rare.type"
    "/events?state=dead"
    "/events?state=dead&before=$mid"
    "/events?state=pending&handler=classifier"
    "/events?since=$since&until=$until"
    "/events/github/evt-$((mid + 1))"
    "/dead-letters"
    "/quarantine"
    "/plugins"
)
# The median and the slowest of RUNS fetches of one admin-listener path; curl options first.
time_page() {
    local page=${*: -1} times=() t code
    for _ in $(seq "$runs"); do
        t=$(curl -s -o /dev/null "${@:1:$#-1}" -w '%{http_code} %{time_total}' "http://$admin$page")
        code=${t% *}
        [ "$code" = 200 ] || { echo "$page answered $code" >&2; exit 1; }
        times+=("${t#* }")
    done
    printf '%s\n' "${times[@]}" | sort -n | awk -v page="$page" '
        { t[NR] = $1 * 1000 }
        END { printf "%-48s %10.1f %10.1f\n", page, t[int((NR + 1) / 2)], t[NR] }'
}

printf '%-48s %10s %10s\n' page "median ms" "max ms"
for page in "${pages[@]}"; do
    time_page -b "$jar" "$page"
done
# A Prometheus scrape of the same host: the token as a bearer, as a scrape config sends it.
time_page -H "Authorization: Bearer bench-token" /metrics
