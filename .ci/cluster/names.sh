# Names and addresses of the emulated cluster, shared by cluster-up.sh, cluster-down.sh and cluster/slurm-up.sh.
# Keep in step with tests/cluster.py.
MARK="# ldh-cluster"
BRIDGE=ldh-br0
BRIDGE_ADDR=198.18.0.254
SLURMCTLD_PORT=6917
SLURMD_PORT=6918
node_name() { echo "ldh-n$1"; }
node_addr() { echo "198.18.0.$(($1 + 1))"; }
veth_name() { echo "ldh-v$1"; }
