#!/usr/bin/env bash
# setup-browser.sh installs what internal/screenshot needs and is missing, and does nothing else:
#
#   - a Chromium from Debian's packages (default chromium-headless-shell; see --package)
#   - the Playwright driver that playwright-go pins (npm playwright-core at exactly that
#     version), laid out as playwright-go expects: <dir>/package/cli.js and <dir>/node
#
#   scripts/setup-browser.sh [--package chromium-headless-shell|chromium] [--driver-dir DIR]
#
# The driver goes to $PLAYWRIGHT_DRIVER_PATH if set, else ~/.cache/ms-playwright-go/<version>,
# which is where playwright-go (and internal/screenshot) look by default. Playwright's own browser
# downloads are never used. The npm registry is used only when the driver is missing; apt-get
# update runs only when a package has no install candidate or an install fails on stale lists.
# Root or sudo for apt. Prints one line per thing installed; silent when all is present.
set -euo pipefail

# The driver version playwright-go v0.5200.1 pins (playwrightCliVersion in its run.go).
# Change together with the playwright-go version in go.mod.
PW_VERSION=1.52.0
pkg=${TOOLHOST_BROWSER_PACKAGE:-chromium-headless-shell}
driver_dir=${PLAYWRIGHT_DRIVER_PATH:-}

while (($#)); do
	case "$1" in
	--package) pkg=${2:?--package needs a value}; shift 2 ;;
	--package=*) pkg=${1#*=}; shift ;;
	--driver-dir) driver_dir=${2:?--driver-dir needs a value}; shift 2 ;;
	--driver-dir=*) driver_dir=${1#*=}; shift ;;
	-h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "setup-browser.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
case "$pkg" in
chromium | chromium-headless-shell) ;;
*) echo "setup-browser.sh: --package must be chromium or chromium-headless-shell, not $pkg" >&2; exit 2 ;;
esac
: "${driver_dir:=${HOME:?HOME is not set}/.cache/ms-playwright-go/$PW_VERSION}"

say() { echo "setup-browser: $*" >&2; }

# --- apt packages -------------------------------------------------------------------------
apt_missing=()
case "$pkg" in
chromium) [ -x /usr/lib/chromium/chromium ] || apt_missing+=(chromium) ;;
chromium-headless-shell) [ -x /usr/lib/chromium/chromium-headless-shell ] || apt_missing+=(chromium-headless-shell) ;;
esac
# The browser runs inside its own bubblewrap sandbox (internal/screenshot never runs it bare).
[ -x /usr/bin/bwrap ] || apt_missing+=(bubblewrap)
# Without Recommends, chromium-common brings no font; pages need one to render text.
if ((${#apt_missing[@]})) && ! fc-list 2>/dev/null | grep -q .; then
	apt_missing+=(fonts-liberation)
fi
if ! command -v node >/dev/null 2>&1 && [ -z "${PLAYWRIGHT_NODEJS_PATH:-}" ]; then
	apt_missing+=(nodejs)
fi
if ! command -v npm >/dev/null 2>&1 && [ ! -f "$driver_dir/package/package.json" ]; then
	apt_missing+=(npm)
fi

if ((${#apt_missing[@]})); then
	if ! command -v apt-get >/dev/null 2>&1; then
		say "apt-get not found: install ${apt_missing[*]} with your package manager"
		exit 1
	fi
	sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 || { say "not root and no sudo: install ${apt_missing[*]} as root"; exit 1; }
		sudo=(sudo)
	fi
	. "$(dirname "$0")/lib/apt.sh"
	apt_log=$(mktemp)
	trap 'rm -f "$apt_log"' EXIT
	run_apt() { # quiet unless it fails
		if ! apt_get "$@" >>"$apt_log" 2>&1; then
			return 1
		fi
	}
	need_update=false
	for p in "${apt_missing[@]}"; do
		grep -q 'Candidate: [^(]' <<<"$(apt-cache policy "$p" 2>/dev/null || true)" || need_update=true
	done
	if $need_update; then
		run_apt update || { cat "$apt_log" >&2; say "apt-get update failed"; exit 1; }
	fi
	if ! run_apt install --no-install-recommends "${apt_missing[@]}"; then
		# Lists that are present but stale point at files the mirror no longer has.
		if $need_update || ! run_apt update || ! run_apt install --no-install-recommends "${apt_missing[@]}"; then
			cat "$apt_log" >&2
			say "apt-get install ${apt_missing[*]} failed"
			exit 1
		fi
	fi
	rm -f "$apt_log"
	trap - EXIT
	for p in "${apt_missing[@]}"; do
		say "installed $p $(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true) (apt)"
	done
fi

# --- Playwright driver (npm playwright-core, offline layout) ------------------------------
node_bin=${PLAYWRIGHT_NODEJS_PATH:-$(command -v node)}
node_major=$("$node_bin" -p 'process.versions.node.split(".")[0]')
if ((node_major < 18)); then
	say "node $("$node_bin" --version) at $node_bin is too old: playwright-core $PW_VERSION needs node >= 18"
	exit 1
fi

have_version() {
	[ -f "$driver_dir/package/cli.js" ] &&
		grep -q "\"version\": \"$PW_VERSION\"" "$driver_dir/package/package.json" 2>/dev/null
}

if ! have_version; then
	mkdir -p "$driver_dir"
	tmp=$(mktemp -d "$driver_dir/.install.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	# npm pack verifies the tarball's integrity against the registry; the tarball unpacks to
	# package/, which is exactly the layout of the official driver zip minus node.
	(cd "$tmp" && npm pack --silent --no-fund --no-audit "playwright-core@$PW_VERSION" >/dev/null)
	tar -xzf "$tmp/playwright-core-$PW_VERSION.tgz" -C "$tmp"
	[ -f "$tmp/package/cli.js" ] || { say "playwright-core $PW_VERSION tarball has no package/cli.js"; exit 1; }
	rm -rf "$driver_dir/package.old"
	[ -e "$driver_dir/package" ] && mv "$driver_dir/package" "$driver_dir/package.old"
	mv "$tmp/package" "$driver_dir/package"
	rm -rf "$driver_dir/package.old" "$tmp"
	trap - EXIT
	say "installed playwright-core $PW_VERSION (npm) in $driver_dir/package"
fi

# playwright-go runs <dir>/node unless PLAYWRIGHT_NODEJS_PATH is set.
if [ "$(readlink "$driver_dir/node" 2>/dev/null || true)" != "$node_bin" ] && [ -z "${PLAYWRIGHT_NODEJS_PATH:-}" ]; then
	ln -sfn "$node_bin" "$driver_dir/node"
	say "linked $driver_dir/node -> $node_bin ($("$node_bin" --version))"
fi
