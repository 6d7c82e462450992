# Names and addresses of the emulated cluster (from names.env, which tests/cluster.py reads too), for
# cluster-up.sh, cluster-down.sh and cluster/slurm-up.sh. Node i is $NODE_PREFIX$i at $NODE_SUBNET.(i+1).
source "$(dirname "${BASH_SOURCE[0]}")/names.env"
node_name() { echo "$NODE_PREFIX$1"; }
node_addr() { echo "$NODE_SUBNET.$(($1 + 1))"; }
veth_name() { echo "$VETH_PREFIX$1"; }
