#!/usr/bin/env bash
# Start SLURM on the emulated cluster (called by .ci/cluster-up.sh --slurm once the nodes exist): a private
# munged, slurmctld on the machine at the bridge address, one slurmd per node namespace with the node's name.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${LDH_CLUSTER_DIR:-/tmp/ldh-cluster}
NODES=${LDH_CLUSTER_NODES:-2}
TIMEOUT=${LDH_SLURM_TIMEOUT:-30}
source "$HERE/names.sh"
LOG_PREFIX="cluster slurm-up"
source "$HERE/../lib/slurm.sh"
HOST=$(hostname -s)  # slurmctld refuses to start unless SlurmctldHost is this machine's short host name
export SLURM_CONF=$DIR/slurm/slurm.conf

require_commands munged slurmctld slurmd sinfo srun
logs() { dump_logs "$DIR"/munge/munged.log "$DIR"/slurm/log/*.log; }

rm -rf "$DIR/slurm" "$DIR/munge"
mkdir -p "$DIR/slurm/state" "$DIR/slurm/log" "$DIR/munge"

# The machine's munge key (shared with .ci/slurm-up.sh), our own munged on a private socket.
start_munged "$DIR/munge" || { logs; exit 1; }

node_lines=""
for i in $(seq 0 $((NODES - 1))); do
  node_lines+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=4 State=UNKNOWN"$'\n'
done
sed -e "s|@HOST@|$HOST|g" -e "s|@DIR@|$DIR|g" -e "s|@BRIDGE_ADDR@|$BRIDGE_ADDR|g" -e "s|@NODES_COUNT@|$NODES|g" \
    -e "s|@CTLD_PORT@|$SLURMCTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
    -e "/@NODE_LINES@/{r /dev/stdin" -e "d}" "$HERE/slurm.conf.in" > "$SLURM_CONF" <<< "$node_lines"

slurmctld || { logs; exit 1; }
for i in $(seq 0 $((NODES - 1))); do
  # -N: this slurmd is that node, whatever the host name; inside its namespace the host name matches anyway.
  "$HERE/../cluster-exec.sh" "$(node_name "$i")" slurmd -N "$(node_name "$i")" || { logs; exit 1; }
done

wait_nodes_ready "$NODES" "$TIMEOUT" || { logs; exit 1; }
echo "cluster slurm-up: $NODES slurmd ready (SLURM_CONF=$SLURM_CONF)" >&2
