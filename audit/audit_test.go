package audit

import (
	"bytes"
	"context"
	"encoding/json"
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

func TestAppendJSONIsEncodingJSON(t *testing.T) {
	for _, r := range []Record{sample, {Plugin: "p", Cap: "tool", Op: "call", Decision: Allow}} {
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
