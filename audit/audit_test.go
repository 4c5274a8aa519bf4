package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

var sample = Record{
	Time: time.Date(2026, 11, 21, 10, 15, 0, 123456789, time.FixedZone("CET", 3600)), Sandbox: "sb-1",
	Plugin: "docs-writer", Tool: "write_file", Cap: "sandbox_files", Op: "write",
	Path: "src/<main>&\"q\".go\n\x01\u2028\xff", Argv: []string{"bash", "-c", "echo \\ hi"}, Env: []string{"LC_ALL"},
	Port: 8000, Key: "k", Decision: Deny, Why: "write: docs/**", Status: -1,
	Error: "policy: plugin docs-writer may not write src/main.go (allowed: docs/**)", IsError: true,
	Micros: 12, In: 5, Out: 7,
}

// egressSample is an egress connection's record: the destination, the address, the
// command and the injected header's name are fields of their own.
var egressSample = Record{
	Time: sample.Time, Sandbox: "sb-1", Cap: CapEgress, Op: "connect", Port: 443, Decision: Allow,
	Why: "allow registry.npmjs.org (preset registries)", Micros: 1200, In: 517, Out: 40960,
	Dest: "registry.npmjs.org", Addr: "2606:4700::6810:1823", Command: "cmd-7 npm install <x>", Injected: "Authorization",
}

func TestAppendJSONIsEncodingJSON(t *testing.T) {
	for _, r := range []Record{sample, egressSample, {Plugin: "p", Cap: "tool", Op: "call", Decision: Allow}} {
		got := AppendJSON(nil, &r)
		// encoding/json of the same record, with the time as the writer rounds it.
		want := r
		want.Time = r.Time.UTC().Truncate(time.Microsecond)
		var back Record
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("AppendJSON wrote invalid JSON: %v\n%s", err, got)
		}
		wantJSON, _ := json.Marshal(want)
		var wantBack Record
		json.Unmarshal(wantJSON, &wantBack)
		if !reflect.DeepEqual(back, wantBack) {
			t.Errorf("round trip differs:\n got %+v\nwant %+v", back, wantBack)
		}
		// Byte for byte but the time's format (encoding/json drops trailing zeros).
		stripTime := func(b []byte) string { _, rest, _ := strings.Cut(string(b), `",`); return rest }
		if stripTime(got) != stripTime(wantJSON) {
			t.Errorf("encoding differs from encoding/json:\n got %s\nwant %s", got, wantJSON)
		}
	}
}

func TestWriterFilterRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 250 {
				r := Record{Time: base.Add(time.Duration(i) * time.Second), Plugin: []string{"a", "b"}[g%2],
					Cap: "sandbox_files", Op: "read", Path: "f.txt", Decision: []string{Allow, Deny}[i%2]}
				w.Record(&r)
			}
		})
	}
	wg.Wait()
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.Record(&sample) // after Close: dropped, no panic
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("audit file mode: %v %v", st, err)
	}
	f, _ := os.Open(path)
	defer f.Close()
	count := map[string]int{}
	err = Read(f, Filter{Plugin: "a", Decision: Deny, Since: base.Add(100 * time.Second), Until: base.Add(200 * time.Second)},
		func(r *Record, line []byte) error {
			if !bytes.HasPrefix(line, []byte(`{"time":`)) {
				t.Errorf("line %q", line)
			}
			count[r.Plugin+" "+r.Decision]++
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	// Two goroutines of plugin a, 50 denials each in [100 s, 200 s).
	if len(count) != 1 || count["a deny"] != 100 {
		t.Errorf("filtered records %v, want 100 denials of a", count)
	}
	if err := Read(strings.NewReader("{}\nnot json\n"), Filter{}, func(*Record, []byte) error { return nil }); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a bad line: %v", err)
	}
}

// An egress record written to the audit file reads back whole: its destination, address,
// command and injected header's name are in the file, as fields of their own.
func TestEgressRecordReadBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	refused := Record{Time: sample.Time, Sandbox: "sb-1", Cap: CapEgress, Op: "http", Port: 80, Decision: Deny,
		Why: "no rule allows example.com", Error: "egress: example.com is not an allowed domain", Dest: "example.com", Command: "cmd-8 curl"}
	w.Record(&egressSample)
	w.Record(&refused)
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []Record
	var lines []string
	err = Read(f, Filter{Cap: CapEgress}, func(r *Record, line []byte) error {
		got = append(got, *r)
		lines = append(lines, string(line))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{egressSample, refused}
	if len(got) != len(want) {
		t.Fatalf("read %d egress records, want %d: %q", len(got), len(want), lines)
	}
	for i, r := range got {
		w := want[i]
		if r.Dest != w.Dest || r.Addr != w.Addr || r.Command != w.Command || r.Injected != w.Injected || r.Port != w.Port || r.Why != w.Why || r.Error != w.Error {
			t.Errorf("record %d read back as %+v; want %+v\nline %s", i, r, w, lines[i])
		}
	}
	if !strings.Contains(lines[0], `"dest":"registry.npmjs.org","addr":"2606:4700::6810:1823","command":"cmd-7 npm install \u003cx\u003e","injected":"Authorization"`) {
		t.Errorf("the line does not carry the fields: %s", lines[0])
	}
}

func TestCreateRefusesLinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, nil, 0o600)
	link := filepath.Join(dir, "audit.jsonl")
	os.Symlink(target, link)
	if w, err := Create(link); err == nil {
		w.Close(context.Background())
		t.Fatal("Create followed a symbolic link")
	}
}

func TestAppendTime(t *testing.T) {
	for _, tm := range []time.Time{sample.Time, time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)} {
		want := tm.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
		if got := string(appendTime(nil, tm.UTC())); got != want {
			t.Errorf("appendTime = %s, want %s", got, want)
		}
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendJSON(buf[:0], &sample)
	}
}

// A record as long as a model cares to make it (a 1 MB command) makes a line of bounded
// length, which says how much it left out.
func TestLinesAreCapped(t *testing.T) {
	long := strings.Repeat("é", 500_000) // 1 MB of two-byte characters
	r := sample
	r.Argv = []string{"bash", "-c", long, "tail"}
	r.Path = long
	r.Error = long
	line := AppendJSON(nil, &r)
	if max := 10*MaxField + 2*MaxList + 1024; len(line) > max {
		t.Fatalf("a line of %d bytes, over %d", len(line), max)
	}
	var back Record
	if err := json.Unmarshal(line, &back); err != nil {
		t.Fatalf("invalid JSON: %v", err)
	}
	kept := len(back.Path) + len(back.Error) + listLen(back.Argv)
	whole := len(r.Path) + len(r.Error) + listLen(r.Argv)
	if back.Cut == 0 || back.Cut != whole-kept {
		t.Errorf("cut %d, want %d (the bytes left out)", back.Cut, whole-kept)
	}
	if back.Argv[0] != "bash" || back.Argv[1] != "-c" || !strings.HasPrefix(long, back.Argv[2]) || len(back.Argv) != 3 {
		t.Errorf("argv kept %d words, the third %d bytes", len(back.Argv), len(back.Argv[2]))
	}
	if !strings.HasPrefix(r.Path, back.Path) || len(back.Path) > MaxField {
		t.Errorf("path cut to %d bytes", len(back.Path))
	}
	// Within the bounds, nothing changes and nothing is said.
	if c := Capped(&sample); c != &sample {
		t.Error("a record within the bounds was copied")
	}
}

// The file rotates at its size, keeping Keep old files, and no line is split or lost
// but those of the files rotated away.
func TestRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	w, err := CreateFile(path, FileOptions{MaxBytes: 4096, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		r := sample
		r.Micros = int64(i)
		w.Record(&r)
		if i%10 == 9 {
			time.Sleep(2 * flushDelay) // let batches reach the file (not a bound: any order passes)
		}
	}
	if err := w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var last int64 = -1
	for _, p := range []string{path + ".2", path + ".1", path} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(p), err)
		}
		if len(b) > 4096 {
			t.Errorf("%s holds %d bytes, over its bound of 4096", filepath.Base(p), len(b))
		}
		err = Read(bytes.NewReader(b), Filter{}, func(r *Record, _ []byte) error {
			if r.Micros <= last {
				return fmt.Errorf("record %d after %d", r.Micros, last)
			}
			last = r.Micros
			return nil
		})
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(p), err)
		}
	}
	if last != 299 {
		t.Errorf("the newest record is %d, want 299", last)
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("a third old file is kept: %v", err)
	}
}

// Two writers on one path, as two toolhost processes with one audit.file: one rotates,
// the other follows, and every line is in one of the files, whole.
func TestRotationSharedByTwoWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	var ws []*Writer
	for range 2 {
		w, err := CreateFile(path, FileOptions{MaxBytes: 8192, Keep: 1000})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	const each = 400
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			for n := range each {
				r := sample
				r.Plugin = fmt.Sprintf("w%d", i)
				r.Micros = int64(n)
				w.Record(&r)
				if n%20 == 19 {
					time.Sleep(flushDelay)
				}
			}
		})
	}
	wg.Wait()
	for _, w := range ws {
		if err := w.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(path + "*")
	if len(files) < 3 {
		t.Errorf("%d files: the audit did not rotate", len(files))
	}
	seen := map[string]int{}
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		err = Read(f, Filter{}, func(r *Record, _ []byte) error { seen[r.Plugin]++; return nil })
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(p), err)
		}
	}
	if seen["w0"] != each || seen["w1"] != each {
		t.Errorf("lines found: %v, want %d of each", seen, each)
	}
}
