#!/usr/bin/env bash
# Installs Debian's Slurm (slurmctld, slurmd, the clients) and MUNGE for the Slurm test bed
# (tests/slurm, `make test-slurm`). Idempotent: exits 0 at once when sinfo, slurmctld, slurmd
# and munged are all present. The packages' own init scripts are kept from starting any daemon
# during the install (a temporary /usr/sbin/policy-rc.d that answers 101), so no munged or
# slurmd is left running with Debian's default configuration; the test bed starts its own,
# configured under a scratch directory. Exit 1, with the reason, when not root or apt fails.
#
#   deploy/slurm/install.sh
set -euo pipefail

missing=()
for cmd in sinfo slurmctld slurmd munged; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deploy/slurm/install.sh: ${missing[*]} missing and not root: cannot apt-get install" >&2
  exit 1
fi

# Debian's postinst scripts start munged and slurmd through invoke-rc.d, which asks
# policy-rc.d first: 101 forbids. Any policy-rc.d already here is set aside and put back.
policy=/usr/sbin/policy-rc.d
saved=""
if [ -e "$policy" ]; then
  saved="$(mktemp /usr/sbin/policy-rc.d.cairn-XXXXXX)"
  cp -p "$policy" "$saved"
fi
restore() {
  if [ -n "$saved" ]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi
}
trap restore EXIT
printf '#!/bin/sh\n# written by cairn deploy/slurm/install.sh for the install only\nexit 101\n' >"$policy"
chmod 0755 "$policy"

echo "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -q >&2; then
  echo "deploy/slurm/install.sh: apt-get update failed" >&2
  exit 1
fi
if ! apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >&2; then
  echo "deploy/slurm/install.sh: apt-get install of slurmctld slurmd slurm-client munge failed" >&2
  exit 1
fi
for cmd in sinfo slurmctld slurmd munged; do
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "deploy/slurm/install.sh: $cmd still missing after the install" >&2
    exit 1
  fi
done
