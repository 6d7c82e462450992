#!/usr/bin/env bash
# Start a single-node SLURM cluster (munged + slurmctld + slurmd) as root, without systemd.
# Idempotent: if our daemons are already up it only re-checks the node and re-prints the env.
# Usage: bash .ci/slurm-up.sh            (state under $LDH_SLURM_DIR, default /tmp/ldh-slurm)
#        source "$LDH_SLURM_DIR/env"     (or eval the printed export lines)
set -euo pipefail

DIR=${LDH_SLURM_DIR:-/tmp/ldh-slurm}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)           # slurmd/slurmctld identify themselves by the short hostname
TIMEOUT=${LDH_SLURM_TIMEOUT:-30}
MARK="# ldh-slurm"
START=$SECONDS
LOG_PREFIX=slurm-up
source "$HERE/lib/slurm.sh"

[ "$(id -u)" = 0 ] || { echo "slurm-up: must run as root" >&2; exit 1; }
require_commands munged slurmctld slurmd sinfo srun

alive() {  # alive NAME: the pid file names a live process with that command name
  local pid
  pid=$(cat "$DIR/$1.pid" 2>/dev/null) || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}

logs() { dump_logs "$DIR"/munge/munged.log "$DIR"/log/*.log; }

wait_ready() {  # the node must have registered (idle, or busy with jobs when already up); fail loudly otherwise
  wait_nodes_ready 1 "$TIMEOUT" || { logs; exit 1; }
}

print_env() {
  cat > "$DIR/env" <<ENV
export LDH_SLURM_DIR=$DIR
export LDH_SLURM_NODE=$HOST
export SLURM_CONF=$CONF
ENV
  cat "$DIR/env"
}

if alive munged && alive slurmctld && alive slurmd && grep -qF "$MARK" "$CONF" 2>/dev/null; then
  wait_ready
  echo "slurm-up: already running" >&2
  print_env
  exit 0
fi

# Anything half-started from an earlier run is stopped first, so we always start clean.
bash "$HERE/slurm-down.sh" >/dev/null 2>&1 || true
rm -rf "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge"
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge"

# The controller's hostname must resolve; fresh containers do not always list it.
if ! getent hosts "$HOST" >/dev/null; then
  append_lines /etc/hosts "127.0.0.1 $HOST $MARK"$'\n'
fi

# Own munged on a private socket (AuthInfo in slurm.conf points there).
start_munged "$DIR/munge" || { logs; exit 1; }
ln -sf munge/munged.pid "$DIR/munged.pid"

# slurm.conf at the default path, so plain srun/sbatch work; keep a foreign one to restore on down.
mkdir -p /etc/slurm
if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
  mv "$CONF" "$CONF.ldh-orig"
fi
sed -e "s|@HOST@|$HOST|g" -e "s|@DIR@|$DIR|g" "$HERE/slurm/slurm.conf.in" > "$CONF"

# Both daemons fork into the background by themselves and write their pid files.
slurmctld || { logs; exit 1; }
slurmd || { logs; exit 1; }
wait_ready
echo "slurm-up: ready in $((SECONDS - START))s (logs in $DIR/log)" >&2
print_env
