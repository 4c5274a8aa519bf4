#!/usr/bin/env bash
# setup.sh installs what toolhost needs and is missing, and does nothing else.
#
#   scripts/setup.sh          what `make run` needs: bubblewrap, e2fsprogs (mkfs.ext4 for
#                             the workspace volumes), Debian's python3 (the demo serves
#                             a page from the sandbox with python3 -m http.server) and
#                             poppler-utils (read_file reads PDFs with it in the sandbox)
#   scripts/setup.sh --test   also a C toolchain, which `go test -race` needs (cgo),
#                             clang for wasm32-wasi (clang, lld, wasi-libc and the
#                             wasm32 compiler runtime), which builds the C example plugin,
#                             Debian's rustc, cargo and wasm32 Rust standard library
#                             (the Rust plugin kit, pdk/rust),
#                             iproute2 (the egress tests' network namespaces), HAProxy
#                             (the fleet's balancer, deploy/haproxy) and kubectl (Debian's
#                             kubernetes-client, unless a kubectl is on PATH), which checks
#                             the manifests of deploy/kubernetes
#
# The browser for screenshots is scripts/setup-browser.sh's job (make run and make test run
# both).
#
# Packages come from apt (Debian/Ubuntu). `apt-get update` runs only when a package has no
# install candidate, or when an install fails on stale package lists. sudo is used only
# when not running as root. Safe to run again: when everything is present it only checks.
set -euo pipefail

want_test=false
for arg in "$@"; do
	case "$arg" in
	--test) want_test=true ;;
	-h | --help)
		sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "setup.sh: unknown argument $arg" >&2
		exit 2
		;;
	esac
done

say() { echo "setup: $*" >&2; }

if ! command -v go >/dev/null 2>&1; then
	say "Go is not installed. toolhost needs Go 1.26 or later: https://go.dev/dl/"
	exit 1
fi

missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# mkfs.ext4 makes the filesystem a private workspace lives on (its disk limit).
[ -x /usr/sbin/mkfs.ext4 ] || [ -x /sbin/mkfs.ext4 ] || missing+=(e2fsprogs)
# A sandbox sees the host's /usr only, so a python3 elsewhere (pyenv, /usr/local) does not count.
[ -x /usr/bin/python3 ] || missing+=(python3)
# read_file reads PDFs with poppler (pdfinfo, pdftotext, pdftoppm) inside the sandbox.
[ -x /usr/bin/pdftotext ] && [ -x /usr/bin/pdftoppm ] || missing+=(poppler-utils)
if $want_test; then
	# -race needs cgo, which needs a C compiler and the C library headers.
	command -v gcc >/dev/null 2>&1 || missing+=(gcc)
	[ -e /usr/include/stdio.h ] || missing+=(libc6-dev)
	# The C example plugin (examples/c-wordcount): clang, its WebAssembly linker, the WASI C
	# library, and the compiler runtime for wasm32, without which clang cannot link
	# (libclang_rt.builtins-wasm32.a). That last package is named after clang's major version.
	command -v clang >/dev/null 2>&1 || missing+=(clang)
	command -v wasm-ld >/dev/null 2>&1 || missing+=(lld)
	[ -e /usr/include/wasm32-wasi/stdio.h ] || missing+=(wasi-libc)
	# The Rust plugin kit (pdk/rust) and its example: Debian's rustc and cargo and the
	# standard library for wasm32-wasi (crates.io is not needed: the kit has no dependencies).
	# Debian's own, in /usr/bin, whatever rustup has put first on PATH.
	[ -x /usr/bin/rustc ] || missing+=(rustc)
	[ -x /usr/bin/cargo ] || missing+=(cargo)
	compgen -G "/usr/lib/rustlib/wasm32-wasi*/lib/libstd-*.rlib" >/dev/null || missing+=(libstd-rust-dev-wasm32)
	# The egress tests build their own internet in network namespaces with ip(8).
	command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
	# The fleet tests put HAProxy with deploy/haproxy/haproxy.cfg in front of the replicas.
	[ -x /usr/sbin/haproxy ] || missing+=(haproxy)
	# kubectl applies deploy/kubernetes/ with --dry-run=client in a test. Debian's package
	# ships /usr/bin/kubectl; another kubectl already on PATH (a newer one from Kubernetes'
	# own packages) does as well, and would conflict with it.
	command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
fi

if ((${#missing[@]})); then
	say "installing ${missing[*]}"
	if ! command -v apt-get >/dev/null 2>&1; then
		say "apt-get not found: install ${missing[*]} with your package manager"
		exit 1
	fi
	sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		if ! command -v sudo >/dev/null 2>&1; then
			say "not root and no sudo: install ${missing[*]} as root"
			exit 1
		fi
		sudo=(sudo)
	fi
	. "$(dirname "$0")/lib/apt.sh"

	# Update the package lists only if some package has no install candidate.
	need_update=false
	for p in "${missing[@]}"; do
		policy=$(apt-cache policy "$p" 2>/dev/null || true)
		if ! grep -q 'Candidate: [^(]' <<<"$policy"; then
			need_update=true
		fi
	done
	if $need_update; then
		say "apt-get update"
		apt_get update
	fi
	if ! apt_get install --no-install-recommends "${missing[@]}"; then
		# Lists that are present but stale point at files the mirror no longer has.
		$need_update && exit 1
		say "install failed; apt-get update and retry"
		apt_get update
		apt_get install --no-install-recommends "${missing[@]}"
	fi
fi

# The wasm32 compiler runtime, named after the clang that is now installed
# (libclang-rt-14-dev-wasm32 on Debian 12).
if $want_test && command -v clang >/dev/null 2>&1; then
	major=$(clang -dumpversion | cut -d. -f1)
	rt=libclang-rt-$major-dev-wasm32
	if ! compgen -G "/usr/lib/llvm-$major/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a" >/dev/null; then
		say "installing $rt"
		sudo=()
		[ "$(id -u)" -eq 0 ] || sudo=(sudo)
		. "$(dirname "$0")/lib/apt.sh"
		apt_get install --no-install-recommends "$rt"
	fi
fi

# bubblewrap may be installed yet unusable (no user namespaces in a locked-down container).
if ! bwrap --unshare-all --die-with-parent --ro-bind / / true </dev/null >/dev/null 2>&1; then
	say "warning: bwrap is installed but could not create a sandbox here:"
	bwrap --unshare-all --die-with-parent --ro-bind / / true </dev/null 2>&1 | sed 's/^/setup:   /' >&2 || true
	say "tools that need a sandbox will fail (user namespaces may be disabled)"
fi
