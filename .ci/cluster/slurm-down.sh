#!/usr/bin/env bash
# Stop the emulated cluster's SLURM (cancel jobs, then each daemon by its pid file). Safe when nothing runs.
set -euo pipefail

DIR=${LDH_CLUSTER_DIR:-/tmp/ldh-cluster}
export SLURM_CONF=$DIR/slurm/slurm.conf

if [ -f "$DIR/slurm/slurmctld.pid" ] && [ -f "$SLURM_CONF" ]; then
  timeout 10 scancel --user=root 2>/dev/null || true
  for i in $(seq 50); do
    [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
    sleep 0.2
  done
fi

pids=()
for pidfile in "$DIR"/slurm/slurmd-*.pid "$DIR/slurm/slurmctld.pid" "$DIR/munge/munged.pid"; do
  pid=$(cat "$pidfile" 2>/dev/null) || continue
  name=$(basename "$pidfile" .pid)
  # Only a live process with the daemon's name: a stale pid file may name a reused pid.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${name%%-*}" ] || continue
  kill "$pid" 2>/dev/null && pids+=("$pid")
done
for i in $(seq 50); do
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && exit 0
  sleep 0.2
done
echo "cluster slurm-down: ${pids[*]} ignored SIGTERM, killing" >&2
kill -9 "${pids[@]}" 2>/dev/null || true
