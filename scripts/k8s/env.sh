# Sourced by the scripts in scripts/k8s: where the test cluster lives and which ports,
# bridge and subnet it uses (its own: none of them is shared with another cluster on this
# machine). Override any of them in the environment.
K8S_DIR=${TOOLHOST_K8S_DIR:-/tmp/toolhost-k8s}
K8S_VERSION=v1.37.2
AGENT_SANDBOX_VERSION=v0.1.1
K8S_API_PORT=${TOOLHOST_K8S_API_PORT:-26443}
K8S_ETCD_PORT=${TOOLHOST_K8S_ETCD_PORT:-26379}  # peer +1, metrics +2
K8S_CM_PORT=26257
K8S_SCHED_PORT=26259
K8S_KUBELET_PORT=26250
K8S_KUBELET_HEALTHZ_PORT=26248
K8S_AS_METRICS_PORT=26280  # agent-sandbox controller; health probe +1
K8S_BRIDGE=${TOOLHOST_K8S_BRIDGE:-thk8s0}
K8S_POD_CIDR=${TOOLHOST_K8S_POD_CIDR:-10.247.0.0/24}
K8S_SERVICE_CIDR=10.97.0.0/16
K8S_NODE=toolhost-k8s-node
K8S_NAMESPACE=toolhost
# The node's address: the API server advertises it and kubelet serves on it (neither may
# be loopback). This machine's first global IPv4 address, unless one is given.
K8S_NODE_IP=${TOOLHOST_K8S_NODE_IP:-$(ip -4 -o addr show scope global 2>/dev/null | awk '{sub("/.*", "", $4); print $4; exit}')}
K8S_KUBECONFIG=$K8S_DIR/pki/admin.kubeconfig
K8S_BIN=$K8S_DIR/bin
K8S_DEBS=$K8S_DIR/debs/root
K8S_RUN=$K8S_DIR/run
K8S_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$K8S_DEBS/usr/bin:$K8S_DEBS/usr/sbin:$PATH
