package mountinfo

import (
	"reflect"
	"testing"
)

// TestParse: every field of a line, octal escapes undone, optional fields skipped, and
// lines that are not the table's left out.
func TestParse(t *testing.T) {
	got := Parse([]byte(`27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
41 27 0:38 /run/user/1000 /home/a\040b/mnt rw,nosuid shared:9 master:2 - tmpfs my\040tmpfs rw,size=4k
not a line
42 27 0:39 / /x rw
`))
	want := []Mount{
		{ID: 27, Parent: 1, Dev: "254:0", Root: "/", Point: "/", Options: "rw,relatime", FSType: "ext4", Source: "/dev/vda", Super: "rw,discard"},
		{ID: 41, Parent: 27, Dev: "0:38", Root: "/run/user/1000", Point: "/home/a b/mnt", Options: "rw,nosuid", FSType: "tmpfs", Source: "my tmpfs", Super: "rw,size=4k"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse =\n%+v\nwant\n%+v", got, want)
	}
}
