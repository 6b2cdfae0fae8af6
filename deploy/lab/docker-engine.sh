#!/usr/bin/env bash
# Makes sure a Docker engine answers on this host, for the lab suite and the quick-start:
# installs Debian's docker.io, docker-compose and mmdebstrap when missing, and starts dockerd in
# the background (log: $CAIRN_DOCKERD_LOG, default /var/log/cairn-dockerd.log) when nothing
# answers. Exit 0 once `docker info` works; exit 1, with dockerd's last words, when it cannot.
#
#   deploy/lab/docker-engine.sh [--check]   (--check: only say whether an engine answers)
set -uo pipefail

log="${CAIRN_DOCKERD_LOG:-/var/log/cairn-dockerd.log}"

answers() { docker info >/dev/null 2>&1; }

if answers; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  exit 1
fi
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } >&2 \
    || { echo "cannot install ${missing[*]}" >&2; exit 1; }
fi
if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
  echo "DOCKER_HOST=$DOCKER_HOST does not answer and is not a local socket" >&2
  exit 1
fi
echo "starting dockerd (log: $log)" >&2
args=()
if [ -n "${DOCKER_HOST:-}" ]; then args+=(-H "$DOCKER_HOST"); fi
nohup dockerd "${args[@]}" >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if answers; then
    echo "dockerd is up (storage driver: $(docker info -f '{{.Driver}}'))" >&2
    exit 0
  fi
  if ! kill -0 $! 2>/dev/null; then break; fi
  sleep 1
done
echo "dockerd did not start; its log ends with:" >&2
tail -n 20 "$log" >&2
exit 1
