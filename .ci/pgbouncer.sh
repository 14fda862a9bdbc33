#!/usr/bin/env bash
# PgBouncer in transaction mode in front of the tests' PostgreSQL server, for the tests of
# `server.database_pooler = "transaction"`: installs Debian's `pgbouncer` if it is missing, starts
# an instance of its own for that server on 127.0.0.1, on the server's port + 1001 (as the
# `postgres` user: PgBouncer refuses to run as root), that passes any database name through to
# the server, and prints the URL of its `postgres` database:
#
#   export HOOKD_TEST_POSTGRES_URL=$(bash .ci/postgres.sh)
#   export HOOKD_TEST_PGBOUNCER_URL=$(bash .ci/pgbouncer.sh "$HOOKD_TEST_POSTGRES_URL")
#
# Few server connections (4 per database) for many clients, so consecutive transactions of one
# client connection really do run on different server connections. Safe to run again.
set -euo pipefail

server=${1:?usage: pgbouncer.sh POSTGRES_URL (from .ci/postgres.sh)}
# postgres://user:password@host:port/db
rest=${server#*://}
credentials=${rest%%@*}
user=${credentials%%:*}
password=${credentials#*:}
address=${rest#*@}
address=${address%%/*}
server_host=${address%%:*}
server_port=${address##*:}
port=$((server_port + 1001))

if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
  echo "installing pgbouncer (Debian)" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >&2
fi
pgbouncer=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)

dir=/tmp/hookd-pgbouncer-$port
if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  mkdir -p "$dir"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$server_host port=$server_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = plain
auth_file = $dir/users.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  printf '"%s" "%s"\n' "$user" "$password" >"$dir/users.txt"
  chmod 600 "$dir/users.txt"
  if [[ $(id -un) != postgres ]]; then chown -R postgres "$dir"; fi
  as_postgres() { if [[ $(id -un) == postgres ]]; then "$@"; else runuser -u postgres -- "$@"; fi; }
  as_postgres "$pgbouncer" -d "$dir/pgbouncer.ini" >&2
  for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.2
  done
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null ||
    { echo "pgbouncer did not start on port $port (see $dir/pgbouncer.log)" >&2; exit 1; }
fi
echo "postgres://$user:$password@127.0.0.1:$port/postgres"
