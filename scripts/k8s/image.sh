#!/bin/bash
# Builds the agent image reproducibly, with no registry: an OCI image archive
# ($K8S_DIR/images/agent.tar) whose one layer holds toolhost's own agent
# (./cmd/toolhost-agent, built static with -trimpath), bash, busybox's applets and a minimal
# python3 from Debian's packages (debs.sh). Every file has owner 0, mtime 0 and a sorted
# place, so the same sources and packages give the same digest. It prints the image's
# name by its manifest's digest and writes it to images/agent.ref (the digest to
# images/agent.digest); up.sh imports the archive into the test cluster's containerd.
# With PIN=1 it also writes the digest into the configuration's default
# (kubernetes.DefaultImage in internal/sandbox/kubernetes/image.go) and its docs; test.sh
# fails when the pin is not this build's.
#   scripts/k8s/image.sh [OUT.tar]      PIN=1 scripts/k8s/image.sh
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
# One layer, reproducible: sorted entries, owner 0 (the home directory 1000), mtime 0,
# compressed with gzip -n (no name, no time), so the same sources and packages give the
# same bytes, and the same digests in any registry the archive is copied to as it is
# (skopeo copy oci-archive:... keeps a compressed layer and the manifest).
tar --numeric-owner --sort=name --mtime=@0 --format=gnu -C "$R" -cf "$W/layer.tar" .
diff=$(sha256sum "$W/layer.tar" | cut -d' ' -f1)
gzip -n -6 "$W/layer.tar"
B=$W/oci/blobs/sha256
mkdir -p "$B"
blob() { # file: moved into the blobs by its digest; prints "digest size"
	local d; d=$(sha256sum "$1" | cut -d' ' -f1)
	local n; n=$(stat -c %s "$1")
	mv "$1" "$B/$d"; echo "$d $n"
}
read -r layer lsize < <(blob "$W/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":{"User":"1000:1000","Env":["PATH=/usr/local/bin:/usr/bin:/bin","HOME=/home/user"],"WorkingDir":"/home/user","Entrypoint":["/usr/local/bin/toolhost-agent","--listen","0.0.0.0:49983"],"ExposedPorts":{"49983/tcp":{}}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$diff" > "$W/config.json"
read -r cfg csize < <(blob "$W/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' "$cfg" "$csize" "$layer" "$lsize" > "$W/manifest.json"
read -r man msize < <(blob "$W/manifest.json")
NAME=toolhost.local/toolhost-agent
TAG=sha256-${man:0:16}
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s:%s","org.opencontainers.image.ref.name":"%s"}}]}' "$man" "$msize" "$NAME" "$TAG" "$TAG" > "$W/oci/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$W/oci/oci-layout"
tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 --format=gnu -C "$W/oci" -cf "$OUT" .
# Pods name it by its manifest's digest (kubernetes.image; up.sh imports it under NAME).
REF=$NAME@sha256:$man
if [ "${PIN:-}" = 1 ]; then
	# The configuration's default names this build: the pin, and the docs made from it.
	GO_FILE=$REPO/internal/sandbox/kubernetes/image.go
	sed -i "s|^const DefaultImage = \".*\"|const DefaultImage = \"$REF\"|" "$GO_FILE"
	(cd "$REPO" && go test ./cli/internal/config -update >/dev/null)
	echo "k8s image: pinned $REF in $GO_FILE (and the config docs)"
fi
echo "$REF" > "$IMG/agent.ref"
echo "sha256:$man" > "$IMG/agent.digest"
echo "k8s image: $OUT ($(stat -c %s "$OUT") bytes): $REF (config sha256:$cfg)"
