#!/bin/bash
# Brings the test cluster up from the built binaries (build.sh) and the agent image
# (image.sh), everything under $K8S_DIR and on ports of its own (env.sh): a private
# containerd 1.6 (Debian's, extracted by debs.sh), etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, the agent-sandbox CRDs and controller,
# the agent image imported into containerd (no registry), and the namespace $K8S_NAMESPACE
# with the provider's Role (deploy/kubernetes-sandboxes) bound to the user "toolhost",
# whose kubeconfig is $K8S_DIR/pki/toolhost.kubeconfig. down.sh undoes all of it; so does
# a failure here. Every process is recorded by pid under $K8S_DIR/run.
#
# This host's quirks, kept here: kubelet refuses cgroup v1 unless failCgroupV1 is false;
# runc fails with "can't get final child's PID from pipe: EOF" where root may not lower
# oom_score_adj, which containerd's restrict_oom_score_adj avoids; there is no kube-proxy
# and no cluster DNS, so pods are reached by their IP on the bridge (no masquerade, so no
# iptables either).
set -euo pipefail
. "$(dirname "$0")/env.sh"
T0=$(date +%s%N)
t() { echo "k8s up: [$((($(date +%s%N) - T0) / 1000000)) ms] $*"; }
fail() { echo "k8s up: $*" >&2; exit 1; }
trap 'rc=$?; [ $rc = 0 ] || { echo "k8s up failed; tearing down (logs in $K8S_RUN)" >&2; tail -n 5 "$K8S_RUN"/*.log >&2 2>/dev/null || true; "$K8S_SCRIPTS/down.sh" --keep-logs >&2; }' EXIT
[ "$(id -u)" = 0 ] || fail "needs root (kubelet, containerd and runc manage cgroups, mounts and network namespaces)"
[ -n "$K8S_NODE_IP" ] || fail "no global IPv4 address found for the node; set TOOLHOST_K8S_NODE_IP"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet agent-sandbox-controller; do
	[ -x "$K8S_BIN/$b" ] || fail "$K8S_BIN/$b is missing: run scripts/k8s/build.sh first"
done
command -v kubectl >/dev/null || fail "kubectl is missing (make setup-test installs Debian's kubernetes-client)"
[ -f "$K8S_DIR/images/agent.tar" ] || fail "the agent image is missing: run scripts/k8s/image.sh first"
if [ -f "$K8S_RUN/kube-apiserver.pid" ] && kill -0 "$(cat "$K8S_RUN/kube-apiserver.pid")" 2>/dev/null; then
	fail "a cluster already runs from $K8S_DIR (scripts/k8s/down.sh stops it)"
fi
mkdir -p "$K8S_RUN" "$K8S_DIR/data" "$K8S_DIR/cni/net.d" "$K8S_DIR/podlogs"
start() { # name cmd...: started in its own session, pid recorded
	local n=$1; shift
	setsid "$@" >"$K8S_RUN/$n.log" 2>&1 < /dev/null &
	echo $! > "$K8S_RUN/$n.pid"
}
export KUBECONFIG=$K8S_KUBECONFIG

# --- PKI and kubeconfigs (openssl), once per directory
P=$K8S_DIR/pki
if [ ! -f "$P/toolhost.kubeconfig" ]; then
	rm -rf "$P"; mkdir -p "$P"
	(
	cd "$P"
	openssl genrsa -out ca.key 2048 2>/dev/null
	openssl req -x509 -new -nodes -key ca.key -subj "/CN=toolhost-k8s-test-ca" -days 30 -out ca.crt 2>/dev/null
	cert() { # name subject [san]
		openssl genrsa -out "$1.key" 2048 2>/dev/null
		openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
		if [ -n "${3:-}" ]; then printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" > "$1.ext"
		else printf 'extendedKeyUsage=clientAuth\n' > "$1.ext"; fi
		openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
	}
	cert apiserver "/CN=kube-apiserver" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost,IP:127.0.0.1,IP:${K8S_SERVICE_CIDR%.0.0/16}.0.1,IP:$K8S_NODE_IP"
	cert kubelet-serving "/CN=$K8S_NODE" "DNS:$K8S_NODE,IP:$K8S_NODE_IP,IP:127.0.0.1"
	cert admin "/O=system:masters/CN=kubernetes-admin"
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
	cert controller-manager "/CN=system:kube-controller-manager"
	cert scheduler "/CN=system:kube-scheduler"
	cert kubelet "/O=system:nodes/CN=system:node:$K8S_NODE"
	cert agent-sandbox "/CN=agent-sandbox-controller"
	cert toolhost "/CN=toolhost"
	openssl genrsa -out sa.key 2048 2>/dev/null
	openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
	for n in admin controller-manager scheduler kubelet agent-sandbox toolhost; do
		k="$n.kubeconfig"
		kubectl config --kubeconfig="$k" set-cluster test --server="https://127.0.0.1:$K8S_API_PORT" --certificate-authority=ca.crt --embed-certs >/dev/null
		kubectl config --kubeconfig="$k" set-credentials "$n" --client-certificate="$n.crt" --client-key="$n.key" --embed-certs >/dev/null
		kubectl config --kubeconfig="$k" set-context test --cluster=test --user="$n" --namespace="$K8S_NAMESPACE" >/dev/null
		kubectl config --kubeconfig="$k" use-context test >/dev/null
	done
	)
fi
t "pki"

# --- images: the pause image (busybox's sleep as the pod's first process) and the agent's
IMG=$K8S_DIR/images
if [ ! -f "$IMG/pause.tar" ]; then
	W=$(mktemp -d); mkdir -p "$W/r/bin"; cp "$K8S_DEBS/bin/busybox" "$W/r/bin/busybox"
	tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$W/r" -cf "$W/layer.tar" .
	d=$(sha256sum "$W/layer.tar" | cut -d' ' -f1); mkdir "$W/$d"; mv "$W/layer.tar" "$W/$d/"
	printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/bin/busybox","sleep","2147483647"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$d" > "$W/cfg.json"
	c=$(sha256sum "$W/cfg.json" | cut -d' ' -f1); mv "$W/cfg.json" "$W/$c.json"
	printf '[{"Config":"%s.json","RepoTags":["toolhost.local/pause:1"],"Layers":["%s/layer.tar"]}]' "$c" "$d" > "$W/manifest.json"
	tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$W" -cf "$IMG/pause.tar" manifest.json "$c.json" "$d"
	rm -rf "$W"
fi

# --- containerd, private: its own root, state, sockets and runc root
C=$K8S_DIR/containerd
mkdir -p "$C/root" "$C/state" "$C/opt"
cat > "$C/config.toml" <<EOM
version = 2
root = "$C/root"
state = "$C/state"
[grpc]
  address = "$C/containerd.sock"
[ttrpc]
  address = "$C/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "toolhost.local/pause:1"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$K8S_DEBS/usr/sbin/runc"
        SystemdCgroup = false
        Root = "$C/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$K8S_DEBS/usr/lib/cni"
    conf_dir = "$K8S_DIR/cni/net.d"
EOM
cat > "$K8S_DIR/cni/net.d/10-toolhost.conflist" <<EOM
{"cniVersion": "0.4.0", "name": "toolhost-k8s", "plugins": [{"type": "bridge", "bridge": "$K8S_BRIDGE",
 "isGateway": true, "ipMasq": false, "hairpinMode": true, "ipam": {"type": "host-local",
 "ranges": [[{"subnet": "$K8S_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$K8S_DIR/cni/ipam"}}]}
EOM
start containerd containerd --config "$C/config.toml"
for _ in $(seq 100); do ctr -a "$C/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
ctr -a "$C/containerd.sock" version >/dev/null || fail "containerd did not start"
for i in pause agent; do ctr -a "$C/containerd.sock" -n k8s.io images import --no-unpack=false "$IMG/$i.tar" >/dev/null; done
# Pods name the agent image by its digest (kubernetes.image's default pins it so), which
# the kubelet finds only under an image record of that name: containerd makes one for a
# pulled image, not for an imported one, so it is made here, from the tag image.sh gave.
AREF=$(cat "$IMG/agent.ref")
ctr -a "$C/containerd.sock" -n k8s.io images tag --force "${AREF%@*}:sha256-$(cut -c8-23 "$IMG/agent.digest")" "$AREF" >/dev/null
t "containerd; images imported: $(ctr -a "$C/containerd.sock" -n k8s.io images ls -q | tr '\n' ' ')"

# --- control plane
EP=$K8S_ETCD_PORT
start etcd "$K8S_DEBS/usr/bin/etcd" --data-dir "$K8S_DIR/data/etcd" \
	--listen-client-urls "http://127.0.0.1:$EP" --advertise-client-urls "http://127.0.0.1:$EP" \
	--listen-peer-urls "http://127.0.0.1:$((EP + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((EP + 1))" \
	--initial-cluster "default=http://127.0.0.1:$((EP + 1))" --listen-metrics-urls "http://127.0.0.1:$((EP + 2))"
start kube-apiserver "$K8S_BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$EP" \
	--bind-address=127.0.0.1 --secure-port="$K8S_API_PORT" --advertise-address="$K8S_NODE_IP" \
	--tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
	--kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP \
	--service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-cluster-ip-range="$K8S_SERVICE_CIDR" --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
	--allow-privileged=false --profiling=false
for _ in $(seq 240); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
kubectl get --raw /readyz >/dev/null || fail "kube-apiserver did not become ready"
t "kube-apiserver ready"
start kube-controller-manager "$K8S_BIN/kube-controller-manager" --kubeconfig="$P/controller-manager.kubeconfig" \
	--authentication-kubeconfig="$P/controller-manager.kubeconfig" --authorization-kubeconfig="$P/controller-manager.kubeconfig" \
	--bind-address=127.0.0.1 --secure-port="$K8S_CM_PORT" --leader-elect=false \
	--service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --use-service-account-credentials=true \
	--controllers=*,-nodeipam --profiling=false
start kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$P/scheduler.kubeconfig" \
	--authentication-kubeconfig="$P/scheduler.kubeconfig" --authorization-kubeconfig="$P/scheduler.kubeconfig" \
	--bind-address=127.0.0.1 --secure-port="$K8S_SCHED_PORT" --leader-elect=false --profiling=false

# --- kubelet; it rewrites these sysctls while it runs: keep the originals for down.sh
[ -f "$K8S_RUN/sysctl.orig" ] || sysctl kernel.panic kernel.panic_on_oops vm.overcommit_memory | sed 's/ //g' > "$K8S_RUN/sysctl.orig"
KL=$K8S_DIR/kubelet
mkdir -p "$KL/volume-plugins"
cat > "$KL/config.yaml" <<EOM
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$C/containerd.sock
address: $K8S_NODE_IP
port: $K8S_KUBELET_PORT
readOnlyPort: 0
healthzPort: $K8S_KUBELET_HEALTHZ_PORT
healthzBindAddress: 127.0.0.1
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: []
podLogsDir: $K8S_DIR/podlogs
volumePluginDir: $KL/volume-plugins
staticPodPath: ""
resolvConf: /etc/resolv.conf
failSwapOn: false
imageGCHighThresholdPercent: 100
evictionHard: {}
maxPods: 50
serializeImagePulls: false
EOM
start kubelet "$K8S_BIN/kubelet" --config="$KL/config.yaml" --kubeconfig="$P/kubelet.kubeconfig" --root-dir="$KL" \
	--hostname-override="$K8S_NODE" --node-ip="$K8S_NODE_IP"
for _ in $(seq 240); do kubectl get node "$K8S_NODE" >/dev/null 2>&1 && break; sleep 0.5; done
kubectl wait --for=condition=Ready "node/$K8S_NODE" --timeout=180s >/dev/null || fail "the node did not become Ready"
t "node Ready"

# --- agent-sandbox: CRDs, the controller's RBAC (its own user), the controller. k8s/crds/
# holds Sandbox's and the extensions' (SandboxClaim, SandboxTemplate, SandboxWarmPool, which
# sandbox.pool uses); --extensions runs their claim and warm-pool controllers.
AS=$(cd "$K8S_SCRIPTS/build/agentsandbox" && go list -m -f '{{.Dir}}' sigs.k8s.io/agent-sandbox)
kubectl apply -f "$AS/k8s/crds/" >/dev/null
# A CRD just made may have no status yet, which kubectl wait takes for an error: try again.
for i in $(seq 60); do
	kubectl wait --for=condition=Established crd --all --timeout=120s >/dev/null 2>&1 && break
	[ "$i" = 60 ] && fail "agent-sandbox's CRDs did not become Established"
	sleep 1
done
kubectl apply -f - >/dev/null <<EOM
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: toolhost-test-agent-sandbox-controller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: agent-sandbox-controller}]
EOM
start agent-sandbox-controller "$K8S_BIN/agent-sandbox-controller" --kubeconfig="$P/agent-sandbox.kubeconfig" \
	--metrics-bind-address="127.0.0.1:$K8S_AS_METRICS_PORT" --health-probe-bind-address="127.0.0.1:$((K8S_AS_METRICS_PORT + 1))" --extensions
t "agent-sandbox CRDs and controller"

# --- the namespace the provider works in, and its least-privilege Role for the user toolhost
kubectl create namespace "$K8S_NAMESPACE" >/dev/null
for _ in $(seq 120); do kubectl -n "$K8S_NAMESPACE" get sa default >/dev/null 2>&1 && break; sleep 0.5; done
kubectl -n "$K8S_NAMESPACE" apply -f "$K8S_SCRIPTS/../../deploy/kubernetes-sandboxes/role.yaml" >/dev/null
kubectl -n "$K8S_NAMESPACE" create rolebinding toolhost-sandboxes --role=toolhost-sandboxes --user=toolhost >/dev/null
# The NetworkPolicies of network none and egress: accepted and stored, but this cluster has
# no network plugin that enforces NetworkPolicy (the bridge plugin does not), which the
# egress test shows through doctor's probe.
kubectl -n "$K8S_NAMESPACE" apply -f "$K8S_SCRIPTS/../../deploy/kubernetes-sandboxes/networkpolicy.yaml" >/dev/null
kubectl -n "$K8S_NAMESPACE" apply -f "$K8S_SCRIPTS/../../deploy/kubernetes-sandboxes/networkpolicy-egress.yaml" >/dev/null
t "namespace $K8S_NAMESPACE, Role bound to user toolhost ($P/toolhost.kubeconfig), agent image $(cat "$IMG/agent.ref")"
