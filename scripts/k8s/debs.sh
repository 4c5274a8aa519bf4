#!/bin/bash
# Debian's etcd-server, containerd, runc, busybox-static, CNI plugins and a minimal
# python3 (the agent image's), downloaded with apt-get and extracted (not installed) under
# $K8S_DIR/debs/root, so nothing on the machine changes. Runs once; needs apt-get update.
set -euo pipefail
. "$(dirname "$0")/env.sh"
[ -f "$K8S_DIR/debs/.done" ] && exit 0
mkdir -p "$K8S_DIR/debs/root"
cd "$K8S_DIR/debs"
# The cluster's parts, then what the agent image holds beside the agent: busybox's
# applets, bash (the bash tool runs it) and python3 (python3 -m http.server is what the
# conformance suite serves).
pkgs=(etcd-server containerd runc containernetworking-plugins busybox-static
	python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 zlib1g libexpat1 libssl3 libffi8 libbz2-1.0 liblzma5 libuuid1 media-types bash libtinfo6)
if ! apt-get download "${pkgs[@]}" >/dev/null 2>&1; then
	apt-get update >/dev/null
	apt-get download "${pkgs[@]}" >/dev/null
fi
for d in *.deb; do dpkg-deb -x "$d" root; done
touch .done
echo "k8s debs: $(ls *.deb | wc -l) packages extracted under $K8S_DIR/debs/root"
