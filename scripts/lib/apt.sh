# apt.sh: apt_get, apt-get that waits for the package manager's locks instead of failing.
# Sourced by setup.sh and setup-browser.sh. Another apt-get or dpkg (an unattended upgrade,
# a second setup run) holds /var/lib/dpkg/lock-frontend or /var/lib/apt/lists/lock for a
# while; apt-get fails at once on either ("Could not get lock"). apt honours
# DPkg::Lock::Timeout for the dpkg locks only, so a lists lock (apt-get update) is waited
# for here: retried every 2 s, up to APT_LOCK_WAIT seconds (default 300) in all.
#
#   apt_get ARGS...   runs "${sudo[@]}" apt-get -y -q ARGS (sudo: an array the caller sets,
#                     empty as root), stdin from /dev/null; its output goes where the
#                     caller sends it.

apt_get() {
	local wait=${APT_LOCK_WAIT:-300} start=$SECONDS out rc
	out=$(mktemp)
	while :; do
		rc=0
		DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get -y -q -o Dpkg::Use-Pty=0 \
			-o DPkg::Lock::Timeout="$wait" "$@" </dev/null >"$out" 2>&1 || rc=$?
		cat "$out"
		if ((rc == 0)); then
			rm -f "$out"
			return 0
		fi
		if grep -qE 'Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock directory' "$out" &&
			((SECONDS - start < wait)); then
			echo "apt: another package manager holds the lock; waiting (up to ${wait}s in all)" >&2
			sleep 2
			continue
		fi
		rm -f "$out"
		return "$rc"
	done
}
