#!/usr/bin/env bash
# setup-mcp-client.sh installs the official MCP TypeScript SDK (npm package
# @modelcontextprotocol/sdk, at the version pinned in
# internal/mcpserve/testdata/npmclient/package-lock.json) for the test that drives toolhost's MCP
# server with its client, and does nothing else:
#
#   scripts/setup-mcp-client.sh [--dir DIR]
#
# The SDK goes to $TOOLHOST_MCP_CLIENT_DIR if set, else ~/.cache/toolhost/mcp-client/<version>,
# which is where the test looks. How it installs: scripts/lib/npm-pinned.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/lib/npm-pinned.sh"
npm_pinned setup-mcp-client @modelcontextprotocol/sdk "$here/internal/mcpserve/testdata/npmclient" TOOLHOST_MCP_CLIENT_DIR mcp-client "$@"
