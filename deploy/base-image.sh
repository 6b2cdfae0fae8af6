#!/usr/bin/env bash
# Builds cairn's base image from Debian's packages alone (no registry): mmdebstrap writes a
# minimal bookworm root filesystem as a tarball and `docker import` turns it into an image.
#
#   deploy/base-image.sh            # prints the image's tag, e.g. cairn-base:3f2a9c1d0b7e
#
# The tag is a digest of this script (suite, mirror, package list): the same inputs give the same
# tag, and an image already present under it is reused, not rebuilt.
set -euo pipefail

SUITE="${CAIRN_BASE_SUITE:-bookworm}"
MIRROR="${CAIRN_BASE_MIRROR:-http://deb.debian.org/debian}"
# Python 3.11 (bookworm's, what the torch wheel is built for), pip/venv for the cairn images,
# CA certificates and tini as PID 1 (signals and zombie reaping inside containers).
PACKAGES="python3,python3-venv,python3-pip,ca-certificates,tini,procps"

here="$(cd "$(dirname "$0")" && pwd)"
digest="$( { cat "$0"; echo "$SUITE $MIRROR $PACKAGES"; } | sha256sum | cut -c1-12)"
tag="cairn-base:${digest}"

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "building $tag with mmdebstrap ($SUITE, $PACKAGES)" >&2
mmdebstrap --variant=minbase --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  "$SUITE" "$work/rootfs.tar" "$MIRROR" >&2
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENTRYPOINT ["/usr/bin/tini", "--"]' \
  --change 'CMD ["/bin/bash"]' \
  "$work/rootfs.tar" "$tag" >&2
echo "$tag"
