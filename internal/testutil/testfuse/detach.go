package testfuse

import "strings"

// detachFunc defines the sh function detach_foreign_fuse, which detaches (umount -l) every
// FUSE mount of the shell's mount namespace (a filesystem type fuse, fuse.*, fuseblk or
// fuseblk.* in mountinfo, whose escapes such as \040 it undoes) but those at its arguments,
// resolved as realpath -m does. It refuses (status 1) to run in its parent's namespace: it is
// meant for the start of a namespace made by unshare --mount --propagation private, whose
// unmounts reach no other namespace. umount -c leaves the paths as they are: resolving them
// would ask the mounts' servers, which may not answer.
const detachFunc = `detach_foreign_fuse() {
	if [ "$(readlink /proc/$$/ns/mnt)" = "$(readlink /proc/$PPID/ns/mnt)" ]; then
		echo "detach_foreign_fuse: not in a mount namespace of its own" >&2
		return 1
	fi
	for _keep in "$@"; do set -- "$@" "$(realpath -m -- "$_keep")"; shift; done
	_mountinfo=$(cat /proc/self/mountinfo)
	printf '%s\n' "$_mountinfo" | while read -r _ _ _ _ _mnt _rest; do
		case " ${_rest#* - }" in
		" fuse "* | " fuse."* | " fuseblk "* | " fuseblk."*) ;;
		*) continue ;;
		esac
		_mnt=$(printf '%s' "$_mnt" | sed 's/\\\([0-7][0-7][0-7]\)/\\0\1/g')
		_mnt=$(printf '%b.' "$_mnt")
		_mnt=${_mnt%.}
		for _keep in "$@"; do
			[ "$_mnt" != "$_keep" ] || continue 2
		done
		umount -l -c -- "$_mnt" 2>/dev/null || true
	done
}
`

// DetachScript returns sh code that detaches every FUSE mount of the shell's mount namespace
// but those at keep, to run first in each mount namespace a test makes with unshare --mount
// --propagation private: the namespace then holds no copy of another test's mount, which would
// keep that mount's FUSE connection alive after its unmount, and its server serving (a test
// waiting for the server would wait as long). A mount the namespace needs (a store its runtime
// reads) is kept; mounts made later in the namespace are its own. The code fails (status 1)
// when the shell is in its parent's mount namespace, detaching nothing.
func DetachScript(keep ...string) string {
	call := "detach_foreign_fuse"
	for _, k := range keep {
		call += " " + shellQuote(k)
	}
	return detachFunc + call + "\n"
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
