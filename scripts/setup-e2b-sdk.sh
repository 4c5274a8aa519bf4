#!/usr/bin/env bash
# setup-e2b-sdk.sh installs the official E2B JavaScript SDK (npm package e2b, at the
# version pinned in internal/sandbox/e2b/e2bfake/testdata/sdk/package-lock.json) for the test
# that drives the fake E2B with it, and does nothing else:
#
#   scripts/setup-e2b-sdk.sh [--dir DIR]
#
# The SDK goes to $TOOLHOST_E2B_SDK_DIR if set, else ~/.cache/toolhost/e2b-sdk/<version>,
# which is where the test looks. How it installs: scripts/lib/npm-pinned.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/lib/npm-pinned.sh"
npm_pinned setup-e2b-sdk e2b "$here/internal/sandbox/e2b/e2bfake/testdata/sdk" TOOLHOST_E2B_SDK_DIR e2b-sdk "$@"
