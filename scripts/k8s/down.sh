#!/bin/bash
# Tears the test cluster of up.sh down, whatever state it is in: the controllers first (so
# nothing recreates pods), every container of the private containerd, then each process
# by the pid up.sh recorded (SIGTERM, SIGKILL after 10 s), the shims of that containerd,
# the mounts under $K8S_DIR and the network namespaces CNI pinned there, the bridge, the
# cgroups kubelet made, and the sysctls kubelet changed (restored to what they were). It
# then removes the cluster's state; the binaries, packages, images and PKI stay for the
# next up.sh (build.sh and image.sh reuse them). --keep-logs keeps run/*.log.
set -uo pipefail
. "$(dirname "$0")/env.sh"
[ -d "$K8S_DIR" ] || exit 0
A=$K8S_DIR/containerd/containerd.sock
pidof_() { cat "$K8S_RUN/$1.pid" 2>/dev/null; }
# ours: the process runs a binary of the cluster's (built under $K8S_DIR/bin, or extracted
# under $K8S_DIR/debs): a pid reused by another program is never signalled.
ours() { case $(readlink "/proc/$1/exe" 2>/dev/null) in "$K8S_DIR"/*) return 0 ;; esac; return 1; }
stop() { # name: graceful, then SIGKILL after 10 s; only the recorded pid, if it still runs that binary
	local p; p=$(pidof_ "$1") || return 0
	[ -n "$p" ] && [ -d "/proc/$p" ] || { rm -f "$K8S_RUN/$1.pid"; return 0; }
	ours "$p" || { rm -f "$K8S_RUN/$1.pid"; return 0; }
	kill "$p" 2>/dev/null
	for _ in $(seq 20); do [ -d "/proc/$p" ] || break; sleep 0.5; done
	[ -d "/proc/$p" ] && kill -9 "$p" 2>/dev/null
	for _ in $(seq 20); do [ -d "/proc/$p" ] || break; sleep 0.25; done
	rm -f "$K8S_RUN/$1.pid"
}
for n in agent-sandbox-controller kube-controller-manager kube-scheduler kubelet; do stop "$n"; done
if [ -S "$A" ] && [ -f "$K8S_RUN/containerd.pid" ]; then
	for c in $(ctr -a "$A" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$A" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1; done
	sleep 1
	for c in $(ctr -a "$A" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$A" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1; done
	for c in $(ctr -a "$A" -n k8s.io containers ls -q 2>/dev/null); do ctr -a "$A" -n k8s.io containers delete "$c" >/dev/null 2>&1; done
fi
for n in kube-apiserver etcd containerd; do stop "$n"; done
# Shims of this containerd outlive it (reparented to init): found by its socket in their
# command line, so another containerd's are never touched.
for d in /proc/[0-9]*; do
	grep -qa -- "$A" "$d/cmdline" 2>/dev/null && grep -qa containerd-shim "$d/cmdline" 2>/dev/null && kill -9 "${d#/proc/}" 2>/dev/null
done
sleep 0.5
# Mounts under the cluster's directory (pod volumes, overlay rootfs, netns pins), deepest first.
awk -v k="$K8S_DIR" 'index($2, k) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
ip link show "$K8S_BRIDGE" >/dev/null 2>&1 && ip link del "$K8S_BRIDGE"
# containerd 1.6 keeps shim sockets in /run/containerd/s whatever its config: remove ours
# (named by a hash of our state dir's tasks), then the directories if they are left empty.
rmdir /run/containerd/s /run/containerd 2>/dev/null
# kubelet's cgroups: the kubepods tree in each hierarchy (empty once the pods are gone).
for s in /sys/fs/cgroup/*/ /sys/fs/cgroup/unified/; do
	[ -d "$s/kubepods" ] && find "$s/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null
done
if [ -f "$K8S_RUN/sysctl.orig" ]; then
	while read -r kv; do sysctl -w "$kv" >/dev/null; done < "$K8S_RUN/sysctl.orig"
	rm -f "$K8S_RUN/sysctl.orig"
fi
rm -rf "$K8S_DIR/data" "$K8S_DIR/containerd" "$K8S_DIR/kubelet" "$K8S_DIR/cni" "$K8S_DIR/podlogs"
[ "${1:-}" = --keep-logs ] || rm -f "$K8S_RUN"/*.log
left=$(for d in /proc/[0-9]*; do ours "${d#/proc/}" && echo "${d#/proc/}"; done)
if [ -n "$left" ]; then
	echo "k8s down: processes of $K8S_DIR still run: $left" >&2
	exit 1
fi
echo "k8s down: the cluster of $K8S_DIR is gone"
