#!/usr/bin/env bash
# Start SLURM on the emulated cluster (called by .ci/cluster-up.sh --slurm once the nodes exist): a private
# munged, slurmctld on the machine at the bridge address, one slurmd per node namespace with the node's name.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${LDH_CLUSTER_DIR:-/tmp/ldh-cluster}
NODES=${LDH_CLUSTER_NODES:-2}
TIMEOUT=${LDH_SLURM_TIMEOUT:-30}
source "$HERE/names.sh"
HOST=$(hostname -s)  # slurmctld refuses to start unless SlurmctldHost is this machine's short host name
export SLURM_CONF=$DIR/slurm/slurm.conf

for cmd in munged slurmctld slurmd sinfo srun; do
  command -v "$cmd" >/dev/null || { echo "cluster slurm-up: $cmd missing (apt-get install slurm-wlm munge)" >&2; exit 1; }
done

dump_logs() {
  for f in "$DIR"/munge/munged.log "$DIR"/slurm/log/*.log; do
    [ -f "$f" ] && { echo "===== $f"; tail -n 40 "$f"; }
  done >&2
}

rm -rf "$DIR/slurm" "$DIR/munge"
mkdir -p "$DIR/slurm/state" "$DIR/slurm/log" "$DIR/munge"

# The munge key of .ci/slurm-up.sh (created there or by the package), our own munged on a private socket.
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi
chown munge:munge "$DIR/munge"
runuser -u munge -- munged \
  --socket="$DIR/munge/munge.socket.2" --pid-file="$DIR/munge/munged.pid" \
  --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" || { dump_logs; exit 1; }

node_lines=""
for i in $(seq 0 $((NODES - 1))); do
  node_lines+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=4 State=UNKNOWN"$'\n'
done
sed -e "s|@HOST@|$HOST|g" -e "s|@DIR@|$DIR|g" -e "s|@BRIDGE_ADDR@|$BRIDGE_ADDR|g" -e "s|@NODES_COUNT@|$NODES|g" \
    -e "s|@CTLD_PORT@|$SLURMCTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
    -e "/@NODE_LINES@/{r /dev/stdin" -e "d}" "$HERE/slurm.conf.in" > "$SLURM_CONF" <<< "$node_lines"

slurmctld || { dump_logs; exit 1; }
for i in $(seq 0 $((NODES - 1))); do
  # -N: this slurmd is that node, whatever the host name; inside its namespace the host name matches anyway.
  "$HERE/../cluster-exec.sh" "$(node_name "$i")" slurmd -N "$(node_name "$i")" || { dump_logs; exit 1; }
done

deadline=$((SECONDS + TIMEOUT))
while true; do
  idle=$(timeout 5 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l || true)
  [ "$idle" = "$NODES" ] && break
  if [ $SECONDS -ge $deadline ]; then
    echo "cluster slurm-up: $NODES nodes not idle after ${TIMEOUT}s" >&2
    timeout 5 sinfo -N -l >&2 || true
    dump_logs
    exit 1
  fi
  sleep 0.5
done
echo "cluster slurm-up: $NODES slurmd idle (SLURM_CONF=$SLURM_CONF)" >&2
