package kubernetes

// DefaultImage is kubernetes.image's default: the agent image scripts/k8s/image.sh builds
// from this tree, named by its manifest's digest. The build is reproducible (the same
// sources, Go toolchain and Debian packages give the same digest), so this pin says which
// image this toolhost's agent protocol was tested with; make test-k8s fails when it is not
// the build's (PIN=1 scripts/k8s/image.sh writes it). The name is the one the test cluster
// imports it under: push the archive (skopeo copy oci-archive:...) to your registry and
// name it REGISTRY/toolhost-agent@sha256:... with the same digest.
const DefaultImage = "toolhost.local/toolhost-agent@sha256:a3e9ac7d4198951f04b898c15f238c9d91ab96bf57349475a5fa173a02ace348"
