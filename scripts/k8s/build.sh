#!/bin/bash
# Builds the test cluster's binaries into $K8S_DIR/bin: kube-apiserver,
# kube-controller-manager, kube-scheduler and kubelet from the Go module proxy (the wrapper
# module build/kube maps Kubernetes' staging modules to their published versions), and the
# agent-sandbox controller (build/agentsandbox). Go's build cache is reused: a warm run
# only relinks, and a run whose inputs did not change does nothing. A cold build takes
# about 8-10 minutes on 2 cores.
set -euo pipefail
. "$(dirname "$0")/env.sh"
mkdir -p "$K8S_BIN"
export CGO_ENABLED=0 GOFLAGS=${K8S_GOFLAGS:--p=2} GOTOOLCHAIN=local
V=$K8S_VERSION
MINOR=$(echo "$V" | cut -d. -f2)
# Stamped versions: unstamped binaries say v0.0.0-master+$Format:%H$, which kubectl cannot parse.
LD="-s -w -X k8s.io/component-base/version.gitVersion=$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/client-go/pkg/version.gitVersion=$V"
stamp=$( (go version; echo "$LD"; cat "$K8S_SCRIPTS"/build/*/go.sum "$K8S_SCRIPTS"/build/*/go.mod) | sha256sum | cut -d' ' -f1)
if [ -f "$K8S_BIN/.stamp" ] && [ "$(cat "$K8S_BIN/.stamp")" = "$stamp" ]; then
	echo "k8s build: binaries in $K8S_BIN are current"
	exit 0
fi
rm -f "$K8S_BIN/.stamp"
t0=$(date +%s)
cd "$K8S_SCRIPTS/build/kube"
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
	s=$(date +%s)
	go build -trimpath -ldflags="$LD" -o "$K8S_BIN/$c" "k8s.io/kubernetes/cmd/$c"
	echo "k8s build: $c in $(($(date +%s) - s))s"
done
cd "$K8S_SCRIPTS/build/agentsandbox"
s=$(date +%s)
go build -trimpath -ldflags="-s -w" -o "$K8S_BIN/agent-sandbox-controller" sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
echo "k8s build: agent-sandbox-controller in $(($(date +%s) - s))s"
echo "$stamp" > "$K8S_BIN/.stamp"
echo "k8s build: done in $(($(date +%s) - t0))s"
