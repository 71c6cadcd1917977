#!/usr/bin/env bash
# System packages the slow tests need: Slurm (munge, slurmctld, slurmd, client) and Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-install}" in
  install)
    if ! command -v chromium >/dev/null 2>&1; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
    bash slurm/dev-cluster.sh install
    ;;
  *) echo "usage: scripts/services.sh install" >&2; exit 2 ;;
esac
