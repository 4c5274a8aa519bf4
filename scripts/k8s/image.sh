#!/bin/bash
# Builds the agent image reproducibly, with no registry: a docker-archive tarball
# ($K8S_DIR/images/agent.tar) whose one layer holds toolhost's own agent
# (./cmd/toolhost-agent, built static with -trimpath), bash, busybox's applets and a minimal
# python3 from Debian's packages (debs.sh). Every file has owner 0, mtime 0 and a sorted
# place, so the same sources and packages give the same digest. It prints the image's
# name and its config digest and writes them to images/agent.ref and images/agent.digest;
# up.sh imports the tarball into the test cluster's containerd.
#   scripts/k8s/image.sh [OUT.tar]
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$K8S_SCRIPTS/debs.sh"
IMG=$K8S_DIR/images
mkdir -p "$IMG"
OUT=${1:-$IMG/agent.tar}
REPO=$(cd "$K8S_SCRIPTS/../.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
R=$W/root
mkdir -p "$R/bin" "$R/usr/bin" "$R/usr/local/bin" "$R/etc" "$R/home/user" "$R/tmp" "$R/lib64"
(cd "$REPO" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -buildvcs=false -ldflags="-s -w" -o "$R/usr/local/bin/toolhost-agent" ./cmd/toolhost-agent)
D=$K8S_DEBS
cp "$D/bin/busybox" "$R/bin/busybox"
cp "$D/bin/bash" "$R/bin/bash"
for a in $("$R/bin/busybox" --list); do [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"; done
cp "$D/usr/bin/python3.11" "$R/usr/bin/python3.11"
ln -s python3.11 "$R/usr/bin/python3"
mkdir -p "$R/usr/lib/x86_64-linux-gnu"
cp -a "$D/usr/lib/python3.11" "$R/usr/lib/"
cp -a "$D"/lib/x86_64-linux-gnu/. "$R/usr/lib/x86_64-linux-gnu/" 2>/dev/null || true
cp -a "$D"/usr/lib/x86_64-linux-gnu/. "$R/usr/lib/x86_64-linux-gnu/"
ln -s usr/lib "$R/lib"
ln -s /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$R/lib64/ld-linux-x86-64.so.2"
cp "$D/etc/mime.types" "$R/etc/mime.types"
find "$R" -name __pycache__ -prune -exec rm -rf {} +
printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\nuser:x:1000:\n' > "$R/etc/group"
chmod 1777 "$R/tmp"
chown 1000:1000 "$R/home/user"
# One layer, reproducible.
tar --numeric-owner --sort=name --mtime=@0 --format=gnu -C "$R" -cf "$W/layer.tar" .
diff=$(sha256sum "$W/layer.tar" | cut -d' ' -f1)
mkdir -p "$W/img/$diff"
mv "$W/layer.tar" "$W/img/$diff/layer.tar"
cfg=$(printf '{"architecture":"amd64","os":"linux","config":{"User":"1000:1000","Env":["PATH=/usr/local/bin:/usr/bin:/bin","HOME=/home/user"],"WorkingDir":"/home/user","Entrypoint":["/usr/local/bin/toolhost-agent","--listen","0.0.0.0:49983"],"ExposedPorts":{"49983/tcp":{}}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$diff")
printf '%s' "$cfg" > "$W/img/cfg.json"
c=$(sha256sum "$W/img/cfg.json" | cut -d' ' -f1)
mv "$W/img/cfg.json" "$W/img/$c.json"
REF=toolhost.local/toolhost-agent:sha256-${c:0:16}
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$c" "$REF" "$diff" > "$W/img/manifest.json"
tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$W/img" -cf "$OUT" manifest.json "$c.json" "$diff"
echo "$REF" > "$IMG/agent.ref"
echo "sha256:$c" > "$IMG/agent.digest"
echo "k8s image: $OUT ($(stat -c %s "$OUT") bytes): $REF, config digest sha256:$c"
