#!/usr/bin/env bash
# make cross: every package of the module and its tests, type-checked from source for each
# GOOS/GOARCH of CROSS_TARGETS (internal/crosscheck, on golang.org/x/tools/go/packages).
# A Linux-only call outside a Linux-only file (syscall.Mmap in a test Windows also builds)
# fails here, not on a user's Mac. Nothing is compiled: a build for another platform
# compiles the whole graph again (~940 packages for the CLI), which on a fresh machine
# with a cold cache cost minutes per target; a type-check from source costs about 20 s of
# CPU per target, cold or warm (docs/DEVELOPMENT.md, "Where make test's time goes").
# The vet analyzers run on this machine's platform only (go test -vet=all in make test).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
exec $GO run ./internal/crosscheck -targets "${CROSS_TARGETS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64}" ./...
