#!/bin/bash
# make test-k8s: builds the test cluster (build.sh, reusing Go's build cache), the agent
# image (image.sh), brings the cluster up (up.sh), runs the kubernetes provider's tests
# against it (-tags k8s: the sandbox conformance suite, the failures, the chain, doctor's
# check) and tears it all down (down.sh), whatever happened. Needs root; without it, or
# with SKIP_K8S=1, it says why and skips, which on CI (CI=true) is a failure.
#   scripts/k8s/test.sh [go test flags, e.g. -run TestConformance]
set -euo pipefail
. "$(dirname "$0")/env.sh"
skip() {
	if [ "${CI:-}" = true ]; then echo "test-k8s: CI=true, and the Kubernetes tests cannot run: $*" >&2; exit 1; fi
	echo "test-k8s: skipped: $*"; exit 0
}
[ "${SKIP_K8S:-}" = 1 ] && skip "SKIP_K8S=1"
[ "$(id -u)" = 0 ] || skip "needs root (kubelet, containerd and runc manage cgroups, mounts and network namespaces)"
command -v kubectl >/dev/null || skip "kubectl is missing (make setup-test installs Debian's kubernetes-client)"
T0=$(date +%s)
"$K8S_SCRIPTS/debs.sh"
"$K8S_SCRIPTS/build.sh"
"$K8S_SCRIPTS/image.sh" >/dev/null
# kubernetes.image's default pins the agent image by digest; the build is reproducible, so
# a build of this tree that differs means the pin is stale (the agent, the Go toolchain or
# a Debian package changed). Said now, failed at the end, after the tests ran.
PINNED=$(sed -n 's/^const DefaultImage = "\(.*\)"$/\1/p' "$K8S_SCRIPTS/../../internal/sandbox/kubernetes/image.go")
BUILT=$(cat "$K8S_DIR/images/agent.ref")
STALE=""
if [ "$PINNED" != "$BUILT" ]; then
	STALE="kubernetes.image's default is stale: it pins $PINNED, this tree builds $BUILT; run PIN=1 scripts/k8s/image.sh and commit internal/sandbox/kubernetes/image.go and the config docs"
	echo "test-k8s: $STALE" >&2
fi
T1=$(date +%s)
trap '"$K8S_SCRIPTS/down.sh"' EXIT
"$K8S_SCRIPTS/up.sh"
T2=$(date +%s)
cd "$K8S_SCRIPTS/../.."
export TOOLHOST_TEST_K8S_DIR=$K8S_DIR
# The node's address, which pods reach this host at (the egress relay listens there).
export TOOLHOST_TEST_K8S_NODE_IP=$K8S_NODE_IP
go test -tags k8s -count=1 -timeout "${TEST_TIMEOUT:-30m}" "$@" ./internal/sandbox/kubernetes/
go test -tags k8s -count=1 -timeout "${TEST_TIMEOUT:-30m}" -run '^TestKubernetesSeedFlow$' ./internal/session/
echo "test-k8s: build $((T1 - T0)) s, cluster up $((T2 - T1)) s, tests $(($(date +%s) - T2)) s"
# The digest covers the Go toolchain and Debian's packages as well as the agent: a machine
# with another Go patch release, or a day after a Debian security update, builds another
# one from the same tree. So a stale pin fails only when asked (K8S_PIN_STRICT=1, as a
# release does, on the machine that pins); else it is said, loudly, with the fix.
if [ -n "$STALE" ]; then
	if [ "${K8S_PIN_STRICT:-}" = 1 ]; then echo "test-k8s: FAIL: $STALE" >&2; exit 1; fi
	echo "test-k8s: WARNING: $STALE (with $(go version | cut -d' ' -f3); K8S_PIN_STRICT=1 makes this a failure)" >&2
	exit 0
fi
echo "test-k8s: the agent image this tree builds is the pinned default, $PINNED"
