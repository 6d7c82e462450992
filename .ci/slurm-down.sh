#!/usr/bin/env bash
# Stop what .ci/slurm-up.sh started (by pid file only), restore /etc/slurm/slurm.conf and /etc/hosts.
# Safe to run when nothing is running. Logs stay in $LDH_SLURM_DIR/log for post-mortems.
set -euo pipefail

DIR=${LDH_SLURM_DIR:-/tmp/ldh-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# ldh-slurm"

stop() {  # stop NAME...: TERM each pid in $DIR/NAME.pid that really is NAME, KILL what is left after 10 s
  local name pid pids=() i alive
  for name in "$@"; do
    pid=$(cat "$DIR/$name.pid" 2>/dev/null) || continue
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || continue  # stale pid file / reused pid
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  # Each daemon needs ~2 s to exit, so signal them together and wait once.
  for i in $(seq 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.2
  done
  echo "slurm-down: ${pids[*]} ignored SIGTERM, killing" >&2
  kill -9 "${pids[@]}" 2>/dev/null || true
}

# Cancel jobs first: slurmstepd (and the user tasks) outlive slurmd if their job is still running.
if grep -qF "$MARK" "$CONF" 2>/dev/null && [ -f "$DIR/slurmctld.pid" ]; then
  timeout 10 scancel --user=root 2>/dev/null || true
  for i in $(seq 50); do
    [ -z "$(timeout 5 squeue -h -t running,completing,pending -o %i 2>/dev/null)" ] && break
    sleep 0.2
  done
fi

stop slurmd slurmctld munged
rm -f "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munged.pid" "$DIR/env"

# Put back what up changed; a conf without our marker is someone else's and stays.
if grep -qF "$MARK" "$CONF" 2>/dev/null; then
  rm -f "$CONF"
fi
if [ -f "$CONF.ldh-orig" ] && [ ! -e "$CONF" ]; then
  mv "$CONF.ldh-orig" "$CONF"
fi
if grep -qF "$MARK" /etc/hosts; then
  # /etc/hosts is often a bind mount in containers: rewrite in place instead of sed -i's rename.
  hosts=$(grep -vF "$MARK" /etc/hosts)
  printf '%s\n' "$hosts" > /etc/hosts
fi
echo "slurm-down: stopped" >&2
