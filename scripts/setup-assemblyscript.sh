#!/usr/bin/env bash
# setup-assemblyscript.sh installs the AssemblyScript compiler (npm package assemblyscript,
# at the version pinned in pdk/assemblyscript/package-lock.json) that builds the
# AssemblyScript plugin kit's example for its test, and does nothing else:
#
#   scripts/setup-assemblyscript.sh [--dir DIR]
#
# The compiler goes to $TOOLHOST_ASC_DIR if set, else ~/.cache/toolhost/assemblyscript/<version>,
# which is where the test looks. How it installs: scripts/lib/npm-pinned.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/lib/npm-pinned.sh"
npm_pinned setup-assemblyscript assemblyscript "$here/pdk/assemblyscript" TOOLHOST_ASC_DIR assemblyscript "$@"
