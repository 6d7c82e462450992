#!/usr/bin/env bash
# Stop the emulated cluster's SLURM (cancel jobs, then each daemon by its pid file). Safe when nothing runs.
set -euo pipefail

DIR=${LDH_CLUSTER_DIR:-/tmp/ldh-cluster}
export SLURM_CONF=$DIR/slurm/slurm.conf
LOG_PREFIX="cluster slurm-down"
source "$(dirname "${BASH_SOURCE[0]}")/../lib/slurm.sh"

if [ -f "$DIR/slurm/slurmctld.pid" ] && [ -f "$SLURM_CONF" ]; then
  cancel_jobs
fi
stop_daemons "$DIR"/slurm/slurmd-*.pid "$DIR/slurm/slurmctld.pid" "$DIR/munge/munged.pid"
