package sessionstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/storekeys"
)

func newStore(t *testing.T) store.Store {
	t.Helper()
	st, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func good() Record {
	return Record{
		Project: "shop", Session: "s-1f2e", Provider: "e2b,local", SandboxID: "abcdefghij0123456789",
		Cwd: "/home/user/web",
		Processes: []Process{{ID: "bg-1a2b", Plugin: "bash", Argv: []string{"bash", "-c", "python3 -m http.server 8000\necho ok"},
			Cwd: "/home/user", PID: 42, Log: "/tmp/toolhost/bg-1a2b.log"}},
		Terminals: []Terminal{{ID: "term-9", Plugin: "bash", Argv: []string{"python3"}, Cols: 120, Rows: 40}},
		State:     map[string]map[string][]byte{"editfile": {"seen/0a1b": []byte("9f8e")}, "bash": {"shell/cwd": []byte("/home/user/web")}},
		Epoch:     7, Instance: "i-0123abcd", WrittenAt: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC),
	}
}

// TestRoundTrip: a record written is read back as it was; none is none; a delete removes it.
func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	if _, ok, err := Read(ctx, st, "shop", "s-1f2e"); ok || err != nil {
		t.Fatalf("no record: ok %v, err %v", ok, err)
	}
	want := good()
	if err := Write(ctx, st, want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := Read(ctx, st, "shop", "s-1f2e")
	if err != nil || !ok {
		t.Fatalf("Read: %v %v", ok, err)
	}
	want.V = Version
	if !Same(got, want) || !got.WrittenAt.Equal(want.WrittenAt) {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	other := good()
	other.Session = "s-2"
	if err := Write(ctx, st, other); err != nil {
		t.Fatal(err)
	}
	recs, bad, err := List(ctx, st, "shop")
	if err != nil || len(bad) != 0 || len(recs) != 2 || recs[0].Session != "s-1f2e" || recs[1].Session != "s-2" {
		t.Errorf("List: %+v %v %v", recs, bad, err)
	}
	if err := Delete(ctx, st, "shop", "s-1f2e"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := Read(ctx, st, "shop", "s-1f2e"); ok || err != nil {
		t.Errorf("after Delete: ok %v, err %v", ok, err)
	}
	if recs, _, _ := List(ctx, st, "shop"); len(recs) != 1 || recs[0].Session != "s-2" {
		t.Errorf("List after Delete: %+v", recs)
	}
}

// TestHostileRecords: a record in the store is data anyone with the store may have written:
// one too large, of another version or project, or with any field out of its bounds is
// refused with ErrInvalid, never half taken.
func TestHostileRecords(t *testing.T) {
	ctx := context.Background()
	put := func(t *testing.T, st store.Store, b []byte) {
		t.Helper()
		if _, err := st.Put(ctx, storekeys.SessionState("shop", "s-1f2e"), bytes.NewReader(b), store.PutOptions{Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
	}
	encode := func(r Record) []byte {
		r.V = Version
		b, _ := json.Marshal(r)
		return b
	}
	long := strings.Repeat("a", 5000)
	cases := map[string][]byte{
		"not JSON":                []byte("{\"v\":1,"),
		"too large":               append(encode(good())[:1], append(bytes.Repeat([]byte(" "), MaxBytes), encode(good())[1:]...)...),
		"version":                 []byte(strings.Replace(string(encode(good())), `"v":1`, `"v":2`, 1)),
		"another project":         encode(func() Record { r := good(); r.Project = "other"; return r }()),
		"sandbox id with a slash": encode(func() Record { r := good(); r.SandboxID = "../../x"; return r }()),
		"no sandbox":              encode(func() Record { r := good(); r.SandboxID = ""; return r }()),
		"session":                 encode(func() Record { r := good(); r.Session = "a b"; return r }()),
		"instance":                encode(func() Record { r := good(); r.Instance = "\x1b[31m"; return r }()),
		"no time":                 encode(func() Record { r := good(); r.WrittenAt = time.Time{}; return r }()),
		"cwd with a newline":      encode(func() Record { r := good(); r.Cwd = "/home/user\nrm -rf /"; return r }()),
		"cwd too long":            encode(func() Record { r := good(); r.Cwd = "/" + long; return r }()),
		"pid":                     encode(func() Record { r := good(); r.Processes[0].PID = -1; return r }()),
		"relative log":            encode(func() Record { r := good(); r.Processes[0].Log = "../etc/passwd"; return r }()),
		"unclean log":             encode(func() Record { r := good(); r.Processes[0].Log = "/tmp/../etc/passwd"; return r }()),
		"empty argv":              encode(func() Record { r := good(); r.Processes[0].Argv = nil; return r }()),
		"NUL in argv":             encode(func() Record { r := good(); r.Processes[0].Argv = []string{"sh", "a\x00b"}; return r }()),
		"huge argv":               encode(func() Record { r := good(); r.Processes[0].Argv = []string{"sh", strings.Repeat(long, 4)}; return r }()),
		"process id":              encode(func() Record { r := good(); r.Processes[0].ID = "-x"; return r }()),
		"plugin":                  encode(func() Record { r := good(); r.Processes[0].Plugin = "../bash"; return r }()),
		"twice the same id":       encode(func() Record { r := good(); r.Terminals[0].ID = r.Processes[0].ID; return r }()),
		"too many processes": encode(func() Record {
			r := good()
			for i := range MaxProcesses {
				p := r.Processes[0]
				p.ID = "bg-" + strings.Repeat("x", i+1)
				r.Processes = append(r.Processes, p)
			}
			return r
		}()),
		"state of a plugin named a path": encode(func() Record { r := good(); r.State["../bash"] = map[string][]byte{"k": []byte("v")}; return r }()),
		"state key with a space":         encode(func() Record { r := good(); r.State["bash"]["a b"] = []byte("v"); return r }()),
		"state value empty":              encode(func() Record { r := good(); r.State["bash"]["k"] = nil; return r }()),
		"state over its bound": encode(func() Record {
			r := good()
			r.State["big"] = map[string][]byte{"a": bytes.Repeat([]byte("x"), MaxStateBytes/2), "b": bytes.Repeat([]byte("x"), MaxStateBytes/2)}
			return r
		}()),
		"terminal size": encode(func() Record { r := good(); r.Terminals[0].Cols = 1 << 20; return r }()),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			st := newStore(t)
			put(t, st, b)
			rec, ok, err := Read(ctx, st, "shop", "s-1f2e")
			if !errors.Is(err, ErrInvalid) || ok {
				t.Errorf("Read: %+v ok %v err %v, want ErrInvalid", rec, ok, err)
			}
			if recs, bad, err := List(ctx, st, "shop"); len(recs) != 0 || len(bad) != 1 || !errors.Is(bad[0], ErrInvalid) || err != nil {
				t.Errorf("List: %+v %v %v, want the record left out as invalid", recs, bad, err)
			}
		})
	}
	// Fields this version does not know are left alone: a newer writer may add some.
	st := newStore(t)
	b := encode(good())
	put(t, st, append([]byte(`{"later_field":{"x":1},`), b[1:]...))
	if _, ok, err := Read(ctx, st, "shop", "s-1f2e"); !ok || err != nil {
		t.Errorf("a record with an unknown field: ok %v err %v", ok, err)
	}
	// A key that is no session's, and a session id that could leave the folder.
	if _, err := st.Put(ctx, storekeys.SessionStates("shop")+"x/y.json", bytes.NewReader([]byte("{}")), store.PutOptions{Size: 2}); err != nil {
		t.Fatal(err)
	}
	if recs, bad, err := List(ctx, st, "shop"); len(recs) != 1 || len(bad) != 1 || err != nil {
		t.Errorf("List with a stray key: %d records, %v, %v", len(recs), bad, err)
	}
	if _, _, err := Read(ctx, st, "shop", "../../lease/x"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Read of a session id with a slash: %v, want ErrInvalid", err)
	}
	// A writer never writes what a reader would refuse.
	r := good()
	r.Processes[0].Log = "relative.log"
	if err := Write(ctx, st, r); !errors.Is(err, ErrInvalid) {
		t.Errorf("Write of an invalid record: %v, want ErrInvalid", err)
	}
}
