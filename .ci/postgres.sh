#!/usr/bin/env bash
# A PostgreSQL server for the tests that need one: installs Debian's `postgresql` if it is
# missing, creates and starts a cluster of the tests' own (`hookdtest`; the server runs as the
# `postgres` user, also when this runs as root), creates the role the tests connect as, and
# prints their URL:
#
#   export HOOKD_TEST_POSTGRES_URL=$(bash .ci/postgres.sh)
#
# The tests' cluster does not fsync (`fsync = off`, `full_page_writes = off`): what it holds is
# thrown away, and a test cannot observe an fsync (none crashes the machine), while every test
# creating and dropping a database of its own would otherwise wait on a checkpoint's fsyncs.
# Commits still wait for their WAL write (`synchronous_commit` stays `on`).
#
#   export HOOKD_BENCH_POSTGRES_URL=$(bash .ci/postgres.sh --bench)
#
# is Debian's default cluster (`main`) instead, with its default, durable settings: the one the
# benchmarks measure.
#
#   export HOOKD_TEST_POSTGRES_CA=$(bash .ci/postgres.sh --ca)
#
# is the CA whose certificate the tests' cluster presents (see below).
#
# Installing needs root (as in CI); on a developer machine with PostgreSQL already running,
# only the cluster and role are created. Safe to run again.
set -euo pipefail

case "${1:-}" in
  "" | --ca) cluster=hookdtest ;;
  --bench) cluster=main ;;
  *) echo "usage: postgres.sh [--bench | --ca]" >&2; exit 2 ;;
esac

if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
  echo "installing postgresql (Debian)" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
version=$(ls /usr/lib/postgresql | sort -n | tail -1)
if ! pg_lsclusters -h | awk '{print $1, $2}' | grep -qx "$version $cluster"; then
  if [[ $cluster == main ]]; then
    pg_createcluster "$version" main >&2
  else
    pg_createcluster "$version" "$cluster" -o fsync=off -o full_page_writes=off >&2
  fi
fi
if ! pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c {print $4}' | grep -qx online; then
  pg_ctlcluster "$version" "$cluster" start >&2
fi
# The tests' cluster presents a certificate of a CA of its own, valid for `localhost` only (so
# a test can tell `verify-ca` from `verify-full` by connecting to 127.0.0.1); the tests find
# the CA at `.ci/postgres.sh --ca`'s path (HOOKD_TEST_POSTGRES_CA).
conf=/etc/postgresql/$version/$cluster
ca=$conf/hookd-test-ca.pem
if [[ $cluster == hookdtest && ! -s $conf/hookd-test-server.pem ]]; then
  tls=$(mktemp -d)
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=hookd test CA" -keyout "$tls/ca.key" -out "$tls/ca.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
    -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
    > "$tls/ext"
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -days 3650 \
    -extfile "$tls/ext" -out "$tls/server.pem" 2>/dev/null
  install -m 0644 "$tls/ca.pem" "$ca"
  install -m 0644 -o postgres -g postgres "$tls/server.pem" "$conf/hookd-test-server.pem"
  install -m 0600 -o postgres -g postgres "$tls/server.key" "$conf/hookd-test-server.key"
  rm -rf "$tls"
  pg_conftool "$version" "$cluster" set ssl on
  pg_conftool "$version" "$cluster" set ssl_cert_file "$conf/hookd-test-server.pem"
  pg_conftool "$version" "$cluster" set ssl_key_file "$conf/hookd-test-server.key"
  if pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c {print $4}' | grep -qx online; then
    pg_ctlcluster "$version" "$cluster" reload >&2
  fi
fi
if [[ ${1:-} == --ca ]]; then
  echo "$ca"
  exit 0
fi
port=$(pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c {print $3}')
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
