// Package owner says whether a file or directory belongs to someone other than the user
// this process runs as. The host refuses to keep its compiled code, snapshots or other
// private state in a directory another user owns (and could swap or read), rather than
// taking it over.
package owner

import "io/fs"

// Other reports whether the file at path (fi its Stat) belongs to another user, and if
// so who, in words for a message ("uid 1001", "S-1-5-21-..."). A file whose owner cannot
// be read is reported as another's.
func Other(path string, fi fs.FileInfo) (who string, other bool) { return otherOwner(path, fi) }
