#!/usr/bin/env bash
# A PostgreSQL server for the tests that need one: installs Debian's `postgresql` if it is
# missing, starts its cluster (the server runs as the `postgres` user, also when this runs as
# root), creates the role the tests connect as, and prints their URL:
#
#   export HOOKD_TEST_POSTGRES_URL=$(bash .ci/postgres.sh)
#
# Installing needs root (as in CI); on a developer machine with PostgreSQL already running,
# only the role is created. Safe to run again.
set -euo pipefail

if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
  echo "installing postgresql (Debian)" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
version=$(ls /usr/lib/postgresql | sort -n | tail -1)
if ! pg_lsclusters -h | awk '{print $1, $2}' | grep -qx "$version main"; then
  pg_createcluster "$version" main >&2
fi
if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $4}' | grep -qx online; then
  pg_ctlcluster "$version" main start >&2
fi
port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}')
for _ in $(seq 50); do
  pg_isready -q -h 127.0.0.1 -p "$port" && break
  sleep 0.2
done
pg_isready -q -h 127.0.0.1 -p "$port" || { echo "postgresql did not start on port $port" >&2; exit 1; }

as_postgres() { if [[ $(id -un) == postgres ]]; then "$@"; else runuser -u postgres -- "$@"; fi; }
if ! as_postgres psql -p "$port" -qtAc "SELECT 1 FROM pg_roles WHERE rolname = 'hookd'" | grep -qx 1; then
  as_postgres psql -p "$port" -qc "CREATE ROLE hookd LOGIN PASSWORD 'hookd' CREATEDB" >&2
fi
echo "postgres://hookd:hookd@127.0.0.1:$port/postgres"
