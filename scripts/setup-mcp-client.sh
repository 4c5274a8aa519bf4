#!/usr/bin/env bash
# setup-mcp-client.sh installs the official MCP TypeScript SDK (npm package
# @modelcontextprotocol/sdk, at the version pinned in
# mcpserve/testdata/npmclient/package-lock.json) for the test that drives toolhost's MCP
# server with its client, and does nothing else:
#
#   scripts/setup-mcp-client.sh [--dir DIR]
#
# The SDK goes to $TOOLHOST_MCP_CLIENT_DIR if set, else ~/.cache/toolhost/mcp-client/<version>,
# which is where the test looks. npm ci installs exactly the lock file's packages, checked
# against their integrity hashes; it reaches the npm registry only when the SDK is missing
# (after that, the tests run offline). Node >= 20 and npm are needed (the machine's, or
# Debian's nodejs and npm packages). Prints one line when it installs; silent when the SDK
# is there already.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
src="$here/mcpserve/testdata/npmclient"
version=$(sed -n 's/.*"@modelcontextprotocol\/sdk": "\([0-9][0-9.]*\)".*/\1/p' "$src/package.json" | head -1)
[ -n "$version" ] || { echo "setup-mcp-client: no pinned @modelcontextprotocol/sdk version in $src/package.json" >&2; exit 1; }
dir=${TOOLHOST_MCP_CLIENT_DIR:-${HOME:?HOME is not set}/.cache/toolhost/mcp-client/$version}

while (($#)); do
	case "$1" in
	--dir) dir=${2:?--dir needs a value}; shift 2 ;;
	--dir=*) dir=${1#*=}; shift ;;
	-h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "setup-mcp-client.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done

say() { echo "setup-mcp-client: $*" >&2; }

for tool in node npm; do
	command -v "$tool" >/dev/null 2>&1 || { say "$tool not found: install Node.js >= 20 with npm (Debian: apt-get install nodejs npm)"; exit 1; }
done
major=$(node -p 'process.versions.node.split(".")[0]')
if ((major < 20)); then
	say "node $(node --version) is too old: the MCP SDK $version needs node >= 20 here"
	exit 1
fi

installed() {
	[ -f "$dir/node_modules/@modelcontextprotocol/sdk/package.json" ] &&
		grep -q "\"version\": \"$version\"" "$dir/node_modules/@modelcontextprotocol/sdk/package.json" &&
		cmp -s "$src/package-lock.json" "$dir/package-lock.json"
}
if installed; then
	exit 0
fi

mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$(dirname "$dir")/.install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp "$src/package.json" "$src/package-lock.json" "$tmp/"
(cd "$tmp" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
[ -f "$tmp/node_modules/@modelcontextprotocol/sdk/package.json" ] || { say "npm ci did not install @modelcontextprotocol/sdk"; exit 1; }
rm -rf "$dir.old"
[ -e "$dir" ] && mv "$dir" "$dir.old"
mv "$tmp" "$dir"
rm -rf "$dir.old"
trap - EXIT
say "installed @modelcontextprotocol/sdk $version (npm) in $dir"
