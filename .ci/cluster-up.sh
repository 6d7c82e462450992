#!/usr/bin/env bash
# Build an emulated cluster of N nodes on this machine, as root: one network namespace per node (ldh-n0, ldh-n1,
# ...), each joined by a veth pair to the bridge ldh-br0, its end named eth0 with address 198.18.0.(i+1)/24
# (198.18.0.0/15 is reserved for benchmarking and never routed out; the namespaces have no default route and
# nothing forwards or NATs them). Node names resolve through tagged lines in /etc/hosts; $LDH_CLUSTER_DIR/shared
# is the "shared filesystem" (every namespace shares the machine's mounts). Run commands on a node with
# .ci/cluster-exec.sh NODE CMD...; OpenMPI reaches nodes with --mca plm_rsh_agent .ci/cluster-rsh.
# With --slurm it also starts a SLURM of these nodes: slurmctld on the machine, one slurmd per node namespace;
# use it through SLURM_CONF=$LDH_CLUSTER_DIR/slurm/slurm.conf (see $LDH_CLUSTER_DIR/env).
# Usage: bash .ci/cluster-up.sh [--slurm]    (LDH_CLUSTER_NODES=2, LDH_CLUSTER_DIR=/tmp/ldh-cluster)
#        bash .ci/cluster-down.sh            stops everything, also what a crashed run left
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${LDH_CLUSTER_DIR:-/tmp/ldh-cluster}
NODES=${LDH_CLUSTER_NODES:-2}
TIMEOUT=${LDH_SLURM_TIMEOUT:-30}
SLURM=0
[ "${1:-}" = --slurm ] && SLURM=1
source "$HERE/cluster/names.sh"
LOG_PREFIX=cluster-up
source "$HERE/lib/slurm.sh"

[ "$(id -u)" = 0 ] || { echo "cluster-up: must run as root" >&2; exit 1; }
for cmd in ip nsenter unshare; do
  command -v "$cmd" >/dev/null || { echo "cluster-up: $cmd missing (apt-get install iproute2 util-linux)" >&2; exit 1; }
done
[ "$NODES" -ge 1 ] && [ "$NODES" -le 9 ] || { echo "cluster-up: LDH_CLUSTER_NODES must be 1..9" >&2; exit 1; }

# Leftovers of an earlier run (a killed test session) go first, so we always start clean.
bash "$HERE/cluster-down.sh" >/dev/null 2>&1 || true
mkdir -p "$DIR/shared"
chmod 0755 "$DIR"

ip link add "$BRIDGE" type bridge
ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
hosts=""
for i in $(seq 0 $((NODES - 1))); do
  node=$(node_name "$i") addr=$(node_addr "$i")
  ip netns add "$node"
  ip link add "$(veth_name "$i")" type veth peer name eth0 netns "$node"
  ip link set "$(veth_name "$i")" master "$BRIDGE" up
  ip -n "$node" addr add "$addr/24" dev eth0
  ip -n "$node" link set eth0 up
  ip -n "$node" link set lo up
  hosts+="$addr $node $MARK"$'\n'
done
append_lines /etc/hosts "$hosts"

# Every node must reach every other one before anything is started on them.
for i in $(seq 0 $((NODES - 1))); do
  for j in $(seq 0 $((NODES - 1))); do
    "$HERE/cluster-exec.sh" "$(node_name "$i")" python3 "$HERE/cluster/reach.py" "$(node_addr "$j")" \
      || { echo "cluster-up: $(node_name "$i") cannot reach $(node_name "$j")" >&2; exit 1; }
  done
done

cat > "$DIR/env" <<ENV
export LDH_CLUSTER_DIR=$DIR
export LDH_CLUSTER_NODES=$NODES
export LDH_CLUSTER_SHARED=$DIR/shared
ENV

if [ "$SLURM" = 1 ]; then
  bash "$HERE/cluster/slurm-up.sh"
  echo "export SLURM_CONF=$DIR/slurm/slurm.conf" >> "$DIR/env"
fi
echo "cluster-up: $NODES nodes ($(node_name 0)=$(node_addr 0) ...), bridge $BRIDGE=$BRIDGE_ADDR" >&2
cat "$DIR/env"
