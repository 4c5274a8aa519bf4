#!/usr/bin/env bash
# make cross: what differs per platform, for each GOOS/GOARCH of CROSS_TARGETS. Per target
# it type-checks with go vet (tests included) the packages that have a file some target
# leaves out (a _linux.go file, a //go:build windows one), and the packages outside the
# CLI that import one of them, then links the CLI once. A package with no platform files
# compiles the same everywhere: the CLI's link compiles those it imports for the target
# anyway, and go vet ./... checks them on this machine. So a Linux-only call outside a
# Linux-only file still fails here, not on a user's Mac, for the cost of one link per
# target instead of a build of every package and every command for each.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
read -r -a targets <<<"${CROSS_TARGETS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64}"

# The packages with a platform file: those with a file some target's constraints leave out.
declare -A platform=()
for t in "${targets[@]}"; do
	while read -r p; do
		[[ -n $p ]] && platform[$p]=1
	done < <(GOOS=${t%/*} GOARCH=${t#*/} $GO list -e -f '{{if .IgnoredGoFiles}}{{.ImportPath}}{{end}}' ./...)
done

for t in "${targets[@]}"; do
	export GOOS=${t%/*} GOARCH=${t#*/}
	declare -A cli=()
	while read -r p; do cli[$p]=1; done < <($GO list -deps ./cmd/toolhost)
	pkgs=()
	# Each package with Go files for this target: "path dep dep ...".
	while read -r p deps; do
		if [[ -n ${platform[$p]:-} ]]; then
			pkgs+=("$p")
			continue
		fi
		[[ -n ${cli[$p]:-} ]] && continue
		for d in $deps; do
			if [[ -n ${platform[$d]:-} ]]; then
				pkgs+=("$p")
				break
			fi
		done
	done < <($GO list -e -f '{{if or .GoFiles .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{join .Deps " "}}{{end}}' ./...)
	unset cli
	echo "GOOS=$GOOS GOARCH=$GOARCH: go vet (${#pkgs[@]} packages), go build ./cmd/toolhost"
	$GO vet "${pkgs[@]}"
	$GO build -o /dev/null ./cmd/toolhost
done
