// Package deploytest checks what operators deploy toolhost with: the Kubernetes manifests
// of deploy/kubernetes. Its tests apply them with kubectl (--dry-run=client, against a
// stand-in API server on loopback that only answers discovery), decode each object
// strictly into Kubernetes' own Go types, and load the ConfigMap's toolhost.yaml with the
// Deployment's environment through the CLI's own loader (internal/config: the file, the
// TOOLHOST_ variables, Validate), then check that the two agree (ports, probes, the
// secret files' paths and modes, the grace period).
//
// It lives under cli because the CLI's loader is internal to it, and in a
// package of its own so that its tests do not build the CLI as cli's do.
package deploytest
