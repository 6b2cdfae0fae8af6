#!/usr/bin/env bash
# The lab cluster in one command, on a host with a running Docker engine:
#
#   deploy/compose/quickstart.sh [up]   builds the images (only what changed), makes the secrets
#                                       on first use, starts the cluster, waits until the API
#                                       answers, says where the admin's password is
#   deploy/compose/quickstart.sh down   stops it and removes containers, network and volumes
#   deploy/compose/quickstart.sh join   prints how an agent on another host joins
#   deploy/compose/quickstart.sh compose ARGS...   docker compose on this cluster's project
#
# .env (mode 600) holds no secret: the project name, the API port, the image tags, the Docker
# socket the agents use, the secrets directory and, only when NATS is published for agents on
# other hosts, CAIRN_NATS_PORT. The secrets are files under CAIRN_SECRETS_DIR (default
# deploy/compose/secrets, mode 0700), made once by `python -m services.compose_secrets` in a
# throwaway container of the services image, and kept across runs (after `down`, delete that
# directory and .env to start over with new ones). An .env from before (which held the
# PostgreSQL and admin passwords) has them moved into the secrets directory at the next `up`.
#
# Variables read at `up`: COMPOSE_PROJECT_NAME, CAIRN_API_PORT (first run), CAIRN_SECRETS_DIR,
# CAIRN_NATS_PORT (publish NATS on that host port), DOCKER_HOST, PYTHON (for the image build).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
env_file="$here/.env"
if docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
else
  compose_cmd=(docker-compose)
fi

env_value() {  # env_value NAME: NAME's value in .env (empty when unset)
  [ -f "$env_file" ] || return 0
  grep -E "^$1=" "$env_file" | tail -n 1 | cut -d= -f2- || true
}

edit_env() {  # edit_env NAME=VALUE... -NAME...: sets or removes variables of .env
  python3 - "$env_file" "$@" <<'PY'
import os, sys
path, *changes = sys.argv[1:]
lines = open(path).read().splitlines() if os.path.exists(path) else []
for change in changes:
    name, _, value = change.lstrip("-").partition("=")
    lines = [l for l in lines if not l.startswith(name + "=")]
    if not change.startswith("-"):
        lines.append(f"{name}={value}")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as fh:
    fh.write("\n".join(lines) + "\n")
PY
}

compose() {
  local files=(-f "$here/docker-compose.yml")
  if [ -n "$(env_value CAIRN_NATS_PORT)" ]; then
    files+=(-f "$here/docker-compose.nats-port.yml")
  fi
  "${compose_cmd[@]}" --project-directory "$here" "${files[@]}" --env-file "$env_file" "$@"
}

secrets_dir() { env_value CAIRN_SECRETS_DIR; }

make_secrets() {  # fills the secrets directory (only what is missing) in a throwaway container
  local dir image legacy=() input=/dev/null
  dir="$(secrets_dir)"
  image="$(env_value CAIRN_SERVICES_IMAGE)"
  (umask 077 && mkdir -p "$dir")
  chmod 700 "$dir"
  if [ -n "$(env_value POSTGRES_PASSWORD)" ]; then  # an .env of an older lab cluster
    legacy=(--import-legacy)
    input="$(mktemp)"
    python3 - "$env_file" > "$input" <<'PY'
import json, sys
pairs = (l.partition("=") for l in open(sys.argv[1]).read().splitlines())
print(json.dumps({k: v for k, _, v in pairs if k in ("POSTGRES_PASSWORD", "CAIRN_ADMIN_PASSWORD")}))
PY
  fi
  docker run --rm -i --network none --user 0:0 --cap-drop ALL \
    --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER \
    --security-opt no-new-privileges -v "$dir:/secrets" "$image" \
    python -m services.compose_secrets /secrets --operator "$(id -u):$(id -g)" "${legacy[@]}" \
    < "$input"
  if [ ${#legacy[@]} -gt 0 ]; then
    rm -f "$input"
    # The old shared agent token and the Docker group are no longer used, and NATS is published
    # again only when asked (CAIRN_NATS_PORT).
    edit_env -POSTGRES_PASSWORD -CAIRN_ADMIN_PASSWORD -CAIRN_AGENT_TOKEN -DOCKER_GID \
      -CAIRN_NATS_PORT
    echo "moved the secrets of $env_file into $dir" >&2
  fi
}

up() {
  if [ ! -f "$env_file" ]; then
    edit_env "COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-cairn}" \
      "CAIRN_API_PORT=${CAIRN_API_PORT:-8080}"
    echo "wrote $env_file" >&2
  fi
  local dir="${CAIRN_SECRETS_DIR:-$(secrets_dir)}"
  dir="${dir:-$here/secrets}"
  (umask 077 && mkdir -p "$dir")
  edit_env "CAIRN_SECRETS_DIR=$(cd "$dir" && pwd)"
  local socket=/var/run/docker.sock
  case "${DOCKER_HOST:-}" in unix://*) socket="${DOCKER_HOST#unix://}" ;; esac
  edit_env "DOCKER_SOCKET=$socket"
  local images=()
  while IFS= read -r line; do images+=("$line"); done < <("$repo/deploy/images/build.sh" services trial)
  edit_env "${images[@]}"
  make_secrets
  if [ -n "${CAIRN_NATS_PORT:-}" ]; then
    edit_env "CAIRN_NATS_PORT=$CAIRN_NATS_PORT"
  fi
  compose up -d
  local url="http://127.0.0.1:$(env_value CAIRN_API_PORT)"
  for _ in $(seq 1 300); do
    if python3 -c "import urllib.request; urllib.request.urlopen('$url/api/v1/health')" 2>/dev/null; then
      echo "cairn is up: $url  (user admin, password in $(secrets_dir)/admin.password)"
      echo "Prometheus: $url/metrics with the bearer token in $(secrets_dir)/metrics.token (docs/operations.md)"
      return 0
    fi
    sleep 1
  done
  echo "the API did not answer at $url within 300 s; see: $0 compose logs api" >&2
  return 1
}

down() {
  [ -f "$env_file" ] || { echo "no $env_file: nothing to take down" >&2; return 0; }
  # Trial containers of an agent that died without stopping them hold the agent's volumes.
  local id
  for id in $(compose ps -q); do
    docker ps -aq --filter "label=ai.cairn.agent-container=${id:0:12}" | xargs -r docker rm -f
  done
  compose down -v --remove-orphans
}

join() {
  local port master dir
  port="$(env_value CAIRN_NATS_PORT)"
  dir="$(secrets_dir)"
  if [ -z "$port" ]; then
    echo "NATS is reached only inside the compose network; to let agents on other hosts reach" >&2
    echo "it, publish it: CAIRN_NATS_PORT=4222 $0 up" >&2
    return 1
  fi
  master="${CAIRN_MASTER_HOST:-$(hostname -f)}"
  cat <<CMD
# On the GPU host, as root: put the join token (from $dir/join.token on this host) in
# /etc/cairn/join.token, mode 0600, and this cluster's $here/cluster.yaml in
# /etc/cairn/cluster.yaml; e.g. from this host:
#   ssh GPU_HOST 'install -d -m 755 /etc/cairn && install -m 600 /dev/stdin /etc/cairn/join.token' < $dir/join.token
#   ssh GPU_HOST 'install -m 644 /dev/stdin /etc/cairn/cluster.yaml' < $here/cluster.yaml
# then start the agent there (it joins once and keeps its own credential in its volume):
docker run -d --name cairn-agent --restart unless-stopped --gpus all \\
  --user 0:0 --cap-drop ALL --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER \\
  --security-opt no-new-privileges \\
  -v /var/run/docker.sock:/var/run/docker.sock \\
  -v cairn-agent:/var/lib/cairn-agent -v /srv/cairn-checkpoints:/checkpoints \\
  -v /etc/cairn/join.token:/run/secrets/cairn/join.token:ro \\
  -v /etc/cairn/cluster.yaml:/etc/cairn/cluster.yaml:ro \\
  -e CAIRN_API_URL=http://$master:$(env_value CAIRN_API_PORT) -e CAIRN_NATS=nats://$master:$port \\
  -e CAIRN_JOIN_TOKEN_FILE=/run/secrets/cairn/join.token -e CAIRN_CHECKPOINT_ROOT=/checkpoints \\
  -e CAIRN_CLUSTER_CONFIG=/etc/cairn/cluster.yaml -e CAIRN_DOCKER_SHARE_FROM=self \\
  -e CAIRN_AGENT_ID=\$(hostname) \\
  $(env_value CAIRN_SERVICES_IMAGE) python -m services.agent --work-dir /var/lib/cairn-agent
CMD
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  join) join ;;
  compose) shift; compose "$@" ;;
  *) echo "usage: $0 [up|down|join|compose ARGS...]" >&2; exit 2 ;;
esac
