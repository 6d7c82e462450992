#!/usr/bin/env bash
# Stop what .ci/slurm-up.sh started (by pid file only), restore /etc/slurm/slurm.conf and /etc/hosts.
# Safe to run when nothing is running. Logs stay in $LDH_SLURM_DIR/log for post-mortems.
set -euo pipefail

DIR=${LDH_SLURM_DIR:-/tmp/ldh-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# ldh-slurm"
LOG_PREFIX=slurm-down
source "$(dirname "${BASH_SOURCE[0]}")/lib/slurm.sh"

# Cancel jobs first: slurmstepd (and the user tasks) outlive slurmd if their job is still running.
if grep -qF "$MARK" "$CONF" 2>/dev/null && [ -f "$DIR/slurmctld.pid" ]; then
  cancel_jobs
fi

stop_daemons "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munged.pid"
rm -f "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munged.pid" "$DIR/env"

# Put back what up changed; a conf without our marker is someone else's and stays.
if grep -qF "$MARK" "$CONF" 2>/dev/null; then
  rm -f "$CONF"
fi
if [ -f "$CONF.ldh-orig" ] && [ ! -e "$CONF" ]; then
  mv "$CONF.ldh-orig" "$CONF"
fi
remove_tagged_lines /etc/hosts "$MARK"
echo "slurm-down: stopped" >&2
