#!/usr/bin/env bash
# Run a command on one node of the emulated cluster (.ci/cluster-up.sh): inside that node's network namespace,
# with that node's host name (a private UTS namespace). Everything else (files, users) is the machine's.
# Usage: .ci/cluster-exec.sh ldh-n1 python3 train.py ...
set -euo pipefail
node=${1:?usage: cluster-exec.sh NODE COMMAND...}
shift
[ -e "/run/netns/$node" ] || { echo "cluster-exec: no node $node (start it with .ci/cluster-up.sh)" >&2; exit 1; }
# nsenter, not `ip netns exec`: the latter mounts a fresh /sys, which hides the cgroup mounts slurmd needs.
exec nsenter --net="/run/netns/$node" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
