# npm-pinned.sh: install one npm package at the version a lock file pins, for a test that
# drives toolhost with a vendor's own JavaScript client. Sourced by setup-e2b-sdk.sh and
# setup-mcp-client.sh, which name what to install; it defines one function:
#
#   npm_pinned TAG PACKAGE SRC DIR_VAR CACHE_NAME "$@"
#
# TAG prefixes its messages, PACKAGE is the npm package, SRC the directory with its
# package.json and package-lock.json, DIR_VAR the variable that overrides where it goes
# (else ~/.cache/toolhost/CACHE_NAME/<version>); the script's own arguments follow
# (--dir DIR, --help). npm ci installs exactly the lock file's packages, checked against
# their integrity hashes; it reaches the npm registry only when the package is missing
# (after that, the tests run offline). Node >= 20 and npm are needed. One line when it
# installs; silent when the package is there already.

npm_pinned() {
	local tag=$1 pkg=$2 src=$3 dirvar=$4 cache=$5
	shift 5
	local version dir
	version=$(sed -n "s|.*\"$pkg\": \"\([0-9][0-9.]*\)\".*|\1|p" "$src/package.json" | head -1)
	[ -n "$version" ] || { echo "$tag: no pinned $pkg version in $src/package.json" >&2; return 1; }
	dir=${!dirvar:-${HOME:?HOME is not set}/.cache/toolhost/$cache/$version}

	while (($#)); do
		case "$1" in
		--dir) dir=${2:?--dir needs a value}; shift 2 ;;
		--dir=*) dir=${1#*=}; shift ;;
		-h | --help) sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; return 0 ;;
		*) echo "$tag: unknown argument $1" >&2; return 2 ;;
		esac
	done

	local tool
	for tool in node npm; do
		command -v "$tool" >/dev/null 2>&1 || { echo "$tag: $tool not found: install Node.js >= 20 with npm (Debian: apt-get install nodejs npm)" >&2; return 1; }
	done
	local major
	major=$(node -p 'process.versions.node.split(".")[0]')
	if ((major < 20)); then
		echo "$tag: node $(node --version) is too old: $pkg $version needs node >= 20 here" >&2
		return 1
	fi

	local manifest="node_modules/$pkg/package.json"
	if [ -f "$dir/$manifest" ] && grep -q "\"version\": \"$version\"" "$dir/$manifest" &&
		cmp -s "$src/package-lock.json" "$dir/package-lock.json"; then
		return 0
	fi

	mkdir -p "$(dirname "$dir")"
	local tmp
	tmp=$(mktemp -d "$(dirname "$dir")/.install.XXXXXX")
	cp "$src/package.json" "$src/package-lock.json" "$tmp/"
	if ! (cd "$tmp" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null) ||
		[ ! -f "$tmp/$manifest" ]; then
		rm -rf "$tmp"
		echo "$tag: npm ci did not install $pkg" >&2
		return 1
	fi
	rm -rf "$dir.old"
	[ -e "$dir" ] && mv "$dir" "$dir.old"
	mv "$tmp" "$dir"
	rm -rf "$dir.old"
	echo "$tag: installed $pkg $version (npm) in $dir" >&2
}
