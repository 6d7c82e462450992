#!/usr/bin/env bash
# Stop what .ci/cluster-up.sh started: SLURM daemons (by pid file), every process still inside a node
# namespace, the namespaces, veths and bridge, and the tagged /etc/hosts lines. Safe when nothing runs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${LDH_CLUSTER_DIR:-/tmp/ldh-cluster}
source "$HERE/cluster/names.sh"
LOG_PREFIX=cluster-down
source "$HERE/lib/slurm.sh"

bash "$HERE/cluster/slurm-down.sh" || true

for netns in /run/netns/"$NODE_PREFIX"[0-9]; do
  [ -e "$netns" ] || continue
  node=$(basename "$netns")
  # Whatever still runs on the node (a rank a failed test left, an orted) dies with it.
  pids=$(ip netns pids "$node" 2>/dev/null || true)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
  ip netns del "$node"
done
# The veths die with their namespace, but not at once everywhere (gVisor): remove the machine ends too.
for link in $(ip -o link show type veth 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^$VETH_PREFIX[0-9]\$" || true); do
  ip link del "$link" 2>/dev/null || true
done
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"

remove_tagged_lines /etc/hosts "$MARK"
rm -f "$DIR/env"
echo "cluster-down: stopped" >&2
