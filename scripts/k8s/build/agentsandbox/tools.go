//go:build tools

// Package tools names the agent-sandbox controller scripts/k8s/build.sh builds (go install
// @v0.1.1 fails: the module proxy answers 403 for the version list it consults).
package tools

import _ "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"
