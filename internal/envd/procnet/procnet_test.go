package procnet

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseTCPTable(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 333 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 0 1 0000000000000000 100 0 0 10 0
`
	got, err := ParseTCPTable([]byte(tcp), false)
	if err != nil {
		t.Fatal(err)
	}
	want := []Socket{
		{Addr: netip.MustParseAddr("127.0.0.1"), Port: 8080, Inode: 111},
		{Addr: netip.MustParseAddr("0.0.0.0"), Port: 22, Inode: 222},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tcp: got %+v, want %+v", got, want)
	}
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1FBB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 444 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1FBC 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 555 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1FBD 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 666 1 0000000000000000 100 0 0 10 0
`
	got, err = ParseTCPTable([]byte(tcp6), true)
	if err != nil {
		t.Fatal(err)
	}
	want = []Socket{
		{Addr: netip.MustParseAddr("::"), Port: 8123, Inode: 444, V6: true},
		{Addr: netip.MustParseAddr("::1"), Port: 8124, Inode: 555, V6: true},
		{Addr: netip.MustParseAddr("::ffff:127.0.0.1"), Port: 8125, Inode: 666, V6: true},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tcp6: got %+v, want %+v", got, want)
	}
	if _, err := ParseTCPTable([]byte("h\n 0: 0100007F:XYZ 00000000:0000 0A 0 0 0 0 0 1\n"), false); err == nil {
		t.Fatal("bad port accepted")
	}
}

func TestScanTCPTable(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0C38 00000000:0000 0A 00000000:00000003 00:00000000 00000000  1000        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:D431 0100007F:0C38 01 00000000:00000000 00:00000000 00000000  1000        0 333 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:D432 0100007F:0C38 01 00000000:00000000 00:00000000 00000000  1000        0 444 1 0000000000000000 20 4 30 10 -1
`
	var rows []Row
	if err := ScanTCPTable(strings.NewReader(tcp), func(r Row) bool { rows = append(rows, r); return len(rows) < 2 }); err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	want := []Row{
		{Local: netip.AddrPortFrom(lo, 3128), Remote: netip.AddrPortFrom(netip.IPv4Unspecified(), 0), State: "0A", RxQueue: 3, Inode: 111},
		{Local: netip.AddrPortFrom(lo, 0xD431), Remote: netip.AddrPortFrom(lo, 3128), State: "01", Inode: 333},
	}
	if !slices.Equal(rows, want) {
		t.Fatalf("got %+v, want %+v (and no row after fn said stop)", rows, want)
	}
	if !rows[0].Listen() || rows[1].Listen() {
		t.Error("Listen")
	}
	// A line past the bound is an error, not a line held in memory whole.
	long := "h\n 0: 0100007F:0C38 00000000:0000 0A 0:0 0 0 0 0 1 " + strings.Repeat("x", 2*maxTCPLine) + "\n"
	if err := ScanTCPTable(strings.NewReader(long), func(Row) bool { return true }); err == nil {
		t.Error("a line past the bound was read")
	}
	if err := ScanTCPTable(strings.NewReader("h\n 0: 0100007F:0C38 00000000:0000 0A 0:zz 0 0 0 0 1\n"), func(Row) bool { return true }); err == nil {
		t.Error("a bad rx_queue was read")
	}
}
