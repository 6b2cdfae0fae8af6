#!/usr/bin/env bash
# The lab cluster in one command, on a host with a running Docker engine:
#
#   deploy/compose/quickstart.sh [up]   builds the images (only what changed), writes .env with
#                                       fresh secrets on first use, starts the cluster, waits
#                                       until the API answers, prints how to log in
#   deploy/compose/quickstart.sh down   stops it and removes containers, network and volumes
#   deploy/compose/quickstart.sh join   prints the command that joins an agent on another host
#
# .env (mode 600) holds POSTGRES_PASSWORD, CAIRN_ADMIN_PASSWORD, CAIRN_AGENT_TOKEN, the image
# tags and the Docker socket the agents use (path and group); it is kept across runs (delete it,
# after `down`, to start over with new secrets).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
env_file="$here/.env"
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  compose=(docker-compose)
fi
compose+=(--project-directory "$here" -f "$here/docker-compose.yml" --env-file "$env_file")

secret() { python3 -c 'import secrets; print(secrets.token_hex(20))'; }

set_var() {  # set_var NAME VALUE: replaces or appends NAME=VALUE in .env
  python3 - "$env_file" "$1" "$2" <<'PY'
import sys
path, name, value = sys.argv[1:]
lines = [l for l in open(path).read().splitlines() if not l.startswith(name + "=")]
lines.append(f"{name}={value}")
open(path, "w").write("\n".join(lines) + "\n")
PY
}

api_port() { grep -E '^CAIRN_API_PORT=' "$env_file" | cut -d= -f2; }

up() {
  if [ ! -f "$env_file" ]; then
    (umask 077 && cat > "$env_file" <<ENV
COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-cairn}
CAIRN_API_PORT=${CAIRN_API_PORT:-8080}
CAIRN_NATS_PORT=${CAIRN_NATS_PORT:-4222}
POSTGRES_PASSWORD=$(secret)
CAIRN_ADMIN_PASSWORD=$(secret)
CAIRN_AGENT_TOKEN=agent:$(secret)
ENV
    )
    echo "wrote $env_file (new secrets)" >&2
  fi
  local socket=/var/run/docker.sock
  case "${DOCKER_HOST:-}" in unix://*) socket="${DOCKER_HOST#unix://}" ;; esac
  set_var DOCKER_SOCKET "$socket"
  set_var DOCKER_GID "$(stat -c %g "$socket")"
  while IFS='=' read -r name value; do
    set_var "$name" "$value"
  done < <("$repo/deploy/images/build.sh" services trial)
  "${compose[@]}" up -d
  local url="http://127.0.0.1:$(api_port)"
  for _ in $(seq 1 300); do
    if python3 -c "import urllib.request; urllib.request.urlopen('$url/api/v1/health')" 2>/dev/null; then
      echo "cairn is up: $url  (user admin, password: CAIRN_ADMIN_PASSWORD in $env_file)"
      return 0
    fi
    sleep 1
  done
  echo "the API did not answer at $url within 300 s; see: ${compose[*]} logs api" >&2
  return 1
}

down() {
  [ -f "$env_file" ] || { echo "no $env_file: nothing to take down" >&2; return 0; }
  # Trial containers of an agent that died without stopping them hold the agent's volumes.
  local id
  for id in $("${compose[@]}" ps -q); do
    docker ps -aq --filter "label=ai.cairn.agent-container=${id:0:12}" | xargs -r docker rm -f
  done
  "${compose[@]}" down -v --remove-orphans
}

join() {
  # shellcheck disable=SC1090
  . "$env_file"
  local master="${CAIRN_MASTER_HOST:-$(hostname -f)}"
  cat <<CMD
docker run -d --name cairn-agent --restart unless-stopped --gpus all \\
  -v /var/run/docker.sock:/var/run/docker.sock \\
  -v cairn-agent:/var/lib/cairn-agent -v /srv/cairn-checkpoints:/checkpoints \\
  -e CAIRN_API_URL=http://$master:$CAIRN_API_PORT -e CAIRN_NATS=nats://$master:$CAIRN_NATS_PORT \\
  -e CAIRN_AGENT_TOKEN=$CAIRN_AGENT_TOKEN -e CAIRN_CHECKPOINT_ROOT=/checkpoints \\
  -e CAIRN_DOCKER_SHARE_FROM=self -e CAIRN_AGENT_ID=\$(hostname) \\
  $CAIRN_SERVICES_IMAGE python -m services.agent --work-dir /var/lib/cairn-agent
CMD
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  join) join ;;
  compose) shift; "${compose[@]}" "$@" ;;
  *) echo "usage: $0 [up|down|join|compose ARGS...]" >&2; exit 2 ;;
esac
