//go:build linux

package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/snapshot"
	dirstore "github.com/toolhost/toolhost/internal/store/dir"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
)

// tree reads every regular file and symlink under dir: relative path -> content (or
// "-> target").
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			m[rel] = "-> " + target
			return err
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			m[rel] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func sameTree(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d files, want %d: %v", what, len(got), len(want), keys(got))
	}
	for name, body := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("%s: %s missing", what, name)
		} else if g != body {
			t.Errorf("%s: %s differs (%d bytes, want %d)", what, name, len(g), len(body))
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

var snapshotKeyRE = regexp.MustCompile(`projects/[^/\s]+/snapshots/\d{8}T\d{6}Z-\d{3}-[0-9a-f]{6}\.(tar\.gz|snap)`)

// TestSnapshotRoundTrip: save a workspace, list it, restore it into a new directory and
// into one that holds other files, which are moved aside, not lost.
func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	project := "snap-roundtrip"
	ws := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	files := map[string]string{
		"README.md":          "# project\n",
		"src/main.go":        "package main\n\nfunc main() {}\n",
		"src/deep/a/b/c.txt": "deep\n",
		"data/big.bin":       string(big),
		"empty.txt":          "",
	}
	writeTree(t, ws, files)
	writeTree(t, ws, map[string]string{"node_modules/left/out.js": "excluded\n", ".git/HEAD": "ref\n"})
	if err := os.Symlink("src/main.go", filepath.Join(ws, "main-link")); err != nil {
		t.Fatal(err)
	}
	want := tree(t, ws)
	delete(want, filepath.Join("node_modules", "left", "out.js"))
	delete(want, filepath.Join(".git", "HEAD"))

	r := runCLI(t, nil, "snapshot", "save", "--project", project, "--workspace", ws)
	if r.code != 0 {
		t.Fatalf("save:\n%s", r)
	}
	key := snapshotKeyRE.FindString(r.stdout)
	if key == "" || !strings.HasPrefix(r.stdout, "saved "+key) {
		t.Fatalf("save printed no key:\n%s", r)
	}
	// Not a terminal: one summary line of the transfer on stderr, no \r.
	if !strings.Contains(r.stderr, "transfer: pack ") || !strings.Contains(r.stderr, "upload ") || strings.Contains(r.stderr, "\r") {
		t.Errorf("save: stderr should be one summary line:\n%s", r)
	}

	// A second save with a change: the list shows both, newest first.
	writeTree(t, ws, map[string]string{"README.md": "# project, changed\n"})
	want["README.md"] = "# project, changed\n"
	r = runCLI(t, nil, "snapshot", "save", "--project", project, "-w", ws)
	if r.code != 0 {
		t.Fatalf("second save:\n%s", r)
	}
	key2 := snapshotKeyRE.FindString(r.stdout)
	r = runCLI(t, nil, "snapshot", "list", "--project", project)
	if r.code != 0 {
		t.Fatalf("list:\n%s", r)
	}
	listed := snapshotKeyRE.FindAllString(r.stdout, -1)
	if len(listed) != 2 || listed[0] != key2 || listed[1] != key || key2 <= key {
		t.Errorf("list = %v, want [%s %s] (newest first)\n%s", listed, key2, key, r)
	}

	// Into a directory that does not exist yet.
	fresh := filepath.Join(t.TempDir(), "restored")
	r = runCLI(t, nil, "snapshot", "restore", "--project", project, "--workspace", fresh)
	if r.code != 0 || !strings.Contains(r.stdout, "restored "+key2) || strings.Contains(r.stdout, "moved to") {
		t.Fatalf("restore into a new dir:\n%s", r)
	}
	sameTree(t, "restored into a new dir", tree(t, fresh), want)

	// Into a directory with files of its own: they move to the backup the output names.
	busy := filepath.Join(t.TempDir(), "busy")
	mine := map[string]string{"notes.txt": "mine, not in the snapshot\n", "README.md": "my own readme\n"}
	writeTree(t, busy, mine)
	r = runCLI(t, nil, "snapshot", "restore", "--project", project, "--workspace", busy)
	if r.code != 0 {
		t.Fatalf("restore into a non-empty dir:\n%s", r)
	}
	m := regexp.MustCompile(`moved to (\S+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("restore into a non-empty dir does not say where the old files went:\n%s", r)
	}
	sameTree(t, "restored over a non-empty dir", tree(t, busy), want)
	sameTree(t, "the backup of the non-empty dir", tree(t, m[1]), mine)
}

func TestSnapshotErrors(t *testing.T) {
	t.Parallel()
	// A project without snapshots: nothing listed, said on stderr, exit 0.
	r := runCLI(t, nil, "snapshot", "list", "--project", "never-saved")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "never-saved has no snapshots") {
		t.Errorf("list of an unknown project:\n%s", r)
	}
	ws := t.TempDir()
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad project id", []string{"snapshot", "list", "--project", "../etc"}, 2, "project"},
		{"bad project id on save", []string{"snapshot", "save", "--project", "a/b", "-w", ws}, 2, "invalid project id"},
		{"restore without a snapshot", []string{"snapshot", "restore", "--project", "never-saved", "-w", filepath.Join(ws, "out")}, 1, "has no snapshot"},
		{"restore without --workspace", []string{"snapshot", "restore", "--project", "x"}, 2, "--workspace DIR is required"},
		{"restore onto a file", []string{"snapshot", "restore", "--project", "x", "-w", writeFileIn(t, ws, "f.txt")}, 2, "not a directory"},
		{"save of a missing dir", []string{"snapshot", "save", "-w", filepath.Join(ws, "nope")}, 2, "--workspace"},
		{"no subcommand", []string{"snapshot"}, 2, "needs a subcommand"},
		{"unknown subcommand", []string{"snapshot", "frobnicate"}, 2, "snapshot save, snapshot list, snapshot restore, snapshot delete, snapshot prune"},
		{"bad store kind", []string{"snapshot", "list", "--store", "gcs"}, 2, "store.kind"},
		{"s3 without bucket", []string{"snapshot", "list", "--store", "s3"}, 2, "store.s3.bucket"},
		{"screenshot kind", []string{"screenshot", "list", "--kind", "all"}, 2, "--kind must be agent or auto"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			oneLineError(t, runCLI(t, nil, tc.args...), tc.code, tc.want)
		})
	}
	// A failed restore creates nothing.
	if _, err := os.Stat(filepath.Join(ws, "out")); !os.IsNotExist(err) {
		t.Errorf("a failed restore left %s behind (%v)", filepath.Join(ws, "out"), err)
	}
	r = runCLI(t, nil, "screenshot", "list", "--project", "never-shot")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "never-shot has no stored screenshots") {
		t.Errorf("screenshot list of an unknown project:\n%s", r)
	}
}

func writeFileIn(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCallTakeScreenshot: take_screenshot through `toolhost call` runs in a session with
// the recorder attached: with nothing listening it says so (no browser needed for that),
// and with screenshots off it says that.
func TestCallTakeScreenshot(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	ws := t.TempDir()
	r := runCLI(t, nil, "call", "take_screenshot", `{"port": 8765}`, "--workspace", ws)
	if r.code != 0 {
		t.Fatalf("call take_screenshot:\n%s", r)
	}
	res := decodeResult(t, r)
	if !res.IsError || !strings.Contains(res.Content[0].Text, "8765") || !strings.Contains(res.Content[0].Text, "listens") {
		t.Errorf("take_screenshot of a closed port: %+v", res)
	}
	r = runCLI(t, nil, "call", "take_screenshot", `{"port": 8765}`, "--workspace", ws, "--screenshots=false")
	if r.code != 0 {
		t.Fatalf("call take_screenshot, screenshots off:\n%s", r)
	}
	if res := decodeResult(t, r); !res.IsError || !strings.Contains(res.Content[0].Text, "no browser configured") {
		t.Errorf("take_screenshot with screenshots off: %+v", res)
	}
}

// TestCallWithSnapshot: `call --workspace DIR` acts on DIR as it is, even when the
// project has a snapshot (nothing is restored into it).
func TestCallWithSnapshot(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	project := "call-with-snapshot"
	saved := t.TempDir()
	writeTree(t, saved, map[string]string{"from-snapshot.txt": "old\n"})
	if r := runCLI(t, nil, "snapshot", "save", "--project", project, "-w", saved); r.code != 0 {
		t.Fatal(r)
	}
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{"here.txt": "here\n"})
	r := runCLI(t, nil, "call", "bash", `{"command":"ls"}`, "--workspace", ws, "--project", project)
	if r.code != 0 {
		t.Fatal(r)
	}
	text := decodeResult(t, r).Content[0].Text
	if !strings.Contains(text, "here.txt") || strings.Contains(text, "from-snapshot.txt") {
		t.Errorf("call saw %q, want the workspace as it is", text)
	}
	if _, err := os.Stat(filepath.Join(ws, "from-snapshot.txt")); err == nil {
		t.Error("the snapshot was restored into the call's workspace")
	}
}

// TestSnapshotS3: the same round trip against a real S3-compatible server on loopback,
// with credentials from the AWS SDK's standard chain (the environment here).
func TestSnapshotS3(t *testing.T) {
	t.Parallel()
	srv, err := s3test.Start(t.TempDir())
	if err != nil {
		t.Fatalf("starting the S3 server: %v", err)
	}
	defer srv.Close()
	bucket, err := srv.NewBucket(t.Context(), "cli")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{
		"AWS_ACCESS_KEY_ID=" + s3test.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey,
		"AWS_REGION=" + s3test.Region,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_EC2_METADATA_DISABLED=true",
		"TOOLHOST_STORE_KIND=s3",
		"TOOLHOST_STORE_S3_BUCKET=" + bucket,
		"TOOLHOST_STORE_S3_ENDPOINT=" + srv.Endpoint,
		"TOOLHOST_STORE_S3_PATH_STYLE=true",
	}
	ws := t.TempDir()
	files := map[string]string{"a.txt": "over S3\n", "dir/b.txt": strings.Repeat("b", 100000)}
	writeTree(t, ws, files)
	r := runCLI(t, env, "snapshot", "save", "--project", "s3-project", "-w", ws)
	if r.code != 0 || !strings.Contains(r.stdout, "store: s3://"+bucket) {
		t.Fatalf("save to S3:\n%s", r)
	}
	key := snapshotKeyRE.FindString(r.stdout)
	if _, err := os.Stat(srv.ObjectPath(bucket, key)); err != nil {
		t.Errorf("the snapshot is not in the bucket: %v", err)
	}
	r = runCLI(t, env, "snapshot", "list", "--project", "s3-project")
	if r.code != 0 || !strings.Contains(r.stdout, key) {
		t.Errorf("list from S3:\n%s", r)
	}
	out := filepath.Join(t.TempDir(), "out")
	r = runCLI(t, env, "snapshot", "restore", "--project", "s3-project", "-w", out)
	if r.code != 0 {
		t.Fatalf("restore from S3:\n%s", r)
	}
	sameTree(t, "restored from S3", tree(t, out), files)
	// when_required checksums work against it too.
	r = runCLI(t, append(env, "TOOLHOST_STORE_S3_CHECKSUMS=when_required"), "snapshot", "list", "--project", "s3-project")
	if r.code != 0 || !strings.Contains(r.stdout, key) {
		t.Errorf("list with when_required checksums:\n%s", r)
	}
	// A bucket that does not exist: one line, exit 1, that says how to fix it...
	r = runCLI(t, append(env, "TOOLHOST_STORE_S3_BUCKET=no-such-bucket"), "snapshot", "list", "--project", "s3-project")
	oneLineError(t, r, 1, "no-such-bucket")
	if !strings.Contains(r.stderr, "store.s3.create_bucket: true") {
		t.Errorf("the missing bucket's error has no hint:\n%s", r)
	}
	// ...which works.
	r = runCLI(t, append(env, "TOOLHOST_STORE_S3_BUCKET=made-by-toolhost", "TOOLHOST_STORE_S3_CREATE_BUCKET=true"),
		"snapshot", "save", "--project", "s3-project", "-w", ws)
	if r.code != 0 || !strings.Contains(r.stdout, "store: s3://made-by-toolhost") {
		t.Errorf("save with store.s3.create_bucket:\n%s", r)
	} else if _, err := os.Stat(srv.ObjectPath("made-by-toolhost", snapshotKeyRE.FindString(r.stdout))); err != nil {
		t.Errorf("the snapshot is not in the bucket toolhost made: %v", err)
	}
}

// TestSnapshotS3Down: a save to an S3 endpoint where nothing listens fails with one line
// that names the bucket, the endpoint and the cause, after the store's few attempts, and
// the transfer line says the upload stored nothing.
func TestSnapshotS3Down(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	env := []string{
		"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey,
		"AWS_REGION=" + s3test.Region, "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_EC2_METADATA_DISABLED=true",
		"TOOLHOST_STORE_KIND=s3", "TOOLHOST_STORE_S3_BUCKET=down", "TOOLHOST_STORE_S3_ENDPOINT=" + endpoint,
		"TOOLHOST_STORE_S3_PATH_STYLE=true",
	}
	ws := t.TempDir()
	writeTree(t, ws, map[string]string{"a.txt": "never stored\n"})
	r := runCLI(t, env, "snapshot", "save", "--project", "down", "-w", ws)
	// One warning per failed attempt but the last, the transfer line, the error line.
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if r.code != 1 || r.stdout != "" || len(lines) < 3 {
		t.Fatalf("save to a store that is down: want exit 1, a line per retry, a transfer line and an error line\n%s", r)
	}
	n := len(lines)
	for _, l := range lines[:n-2] {
		if !strings.Contains(l, "attempt failed, retrying") || !strings.Contains(l, "cannot reach the store") {
			t.Errorf("not a retry line: %q", l)
		}
	}
	if !strings.HasPrefix(lines[n-2], "transfer: pack ") || !strings.Contains(lines[n-2], fmt.Sprintf("upload failed after %d attempts, nothing stored", n-1)) {
		t.Errorf("transfer line %q (after %d retry lines)", lines[n-2], n-2)
	}
	for _, want := range []string{"toolhost snapshot save: snapshot save failed: project down: ", "bucket down", endpoint,
		"cannot reach the store (connection refused)", fmt.Sprintf("(%d attempts in ", n-1)} {
		if !strings.Contains(lines[n-1], want) {
			t.Errorf("error line %q lacks %q", lines[n-1], want)
		}
	}
}

// TestSnapshotManagement: what a user does with a project's snapshots besides saving and
// restoring the newest: restore one by key, see a refused snapshot skipped, delete one,
// prune, and what a save says when nothing changed or when it left entries out. The
// project's snapshots are tar.gz ones, as older versions stored them (a damaged archive is
// refused by its SHA-256); TestCheckpoints does the chunked format's.
func TestSnapshotManagement(t *testing.T) {
	t.Parallel()
	project := "snap-manage"
	storeDir := t.TempDir()
	env := []string{"TOOLHOST_STORE_DIR=" + storeDir}
	cli := func(args ...string) runResult {
		t.Helper()
		return runCLI(t, env, append(args, "--project", project)...)
	}
	ws := t.TempDir()
	var keys []string
	states := []string{"state A\n", "state B\n", "state C\n"}
	for i, body := range states {
		writeTree(t, ws, map[string]string{"state.txt": body})
		keys = append(keys, putOldSnapshot(t, storeDir, project, time.Now().Add(time.Duration(i-3)*time.Hour), ws))
	}
	// The same state again: the newest snapshot holds it, nothing is uploaded.
	r := cli("snapshot", "save", "-w", ws)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "unchanged: "+keys[2]) || !strings.Contains(r.stderr, "upload none (unchanged") {
		t.Errorf("a save of an unchanged workspace:\n%s", r)
	}
	if !strings.HasPrefix(r.stderr, "transfer: pack ") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("a save's stderr should be the one transfer line:\n%s", r)
	}

	// Restore by key: that snapshot, not the newest.
	out := filepath.Join(t.TempDir(), "a")
	r = cli("snapshot", "restore", "--key", keys[0], "-w", out)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "restored "+keys[0]) || !strings.Contains(r.stderr, "transfer: download ") {
		t.Fatalf("restore --key:\n%s", r)
	}
	sameTree(t, "restored by key", tree(t, out), map[string]string{"state.txt": states[0]})
	other := strings.Replace(keys[0], "/"+project+"/", "/another/", 1)
	missing := keys[0][:len(keys[0])-len("abcdef.tar.gz")] + "000000.tar.gz"
	for _, tc := range []struct {
		name, key string
		code      int
		want      string
	}{
		{"not a key", "latest", 2, "is not a snapshot key of project " + project},
		{"another project's key", other, 2, "is not a snapshot key of project " + project},
		{"a key nothing is stored under", missing, 1, "no such snapshot"},
	} {
		oneLineError(t, cli("snapshot", "restore", "--key", tc.key, "-w", filepath.Join(t.TempDir(), "x")), tc.code, tc.want)
	}

	// The newest snapshot is damaged in the store (same size, other bytes): a restore
	// skips it, says why, and restores the one before; by key it fails.
	data := filepath.Join(storeDir, "data", keys[2])
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, bytes.Repeat([]byte{0}, len(b)), 0o644); err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(t.TempDir(), "b")
	r = cli("snapshot", "restore", "-w", out)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "restored "+keys[1]) ||
		!strings.Contains(r.stderr, "skipped "+keys[2]+": its SHA-256 does not match") {
		t.Fatalf("restore past a damaged snapshot:\n%s", r)
	}
	sameTree(t, "restored past a damaged snapshot", tree(t, out), map[string]string{"state.txt": states[1]})
	r = cli("snapshot", "restore", "--key", keys[2], "-w", filepath.Join(t.TempDir(), "c"))
	if r.code != 1 || !strings.Contains(r.stderr, "no snapshot of the project restores") || !strings.Contains(r.stderr, "SHA-256") {
		t.Errorf("restore --key of the damaged snapshot:\n%s", r)
	}

	// Delete one by key; the others stay.
	r = cli("snapshot", "delete", keys[1])
	if r.code != 0 || r.stdout != "deleted "+keys[1]+"\n" {
		t.Fatalf("delete:\n%s", r)
	}
	r = cli("snapshot", "list")
	if listed := snapshotKeyRE.FindAllString(r.stdout, -1); len(listed) != 2 || listed[0] != keys[2] || listed[1] != keys[0] {
		t.Errorf("list after delete = %v, want [%s %s]", listed, keys[2], keys[0])
	}
	oneLineError(t, cli("snapshot", "delete", keys[1]), 1, "no such snapshot")
	oneLineError(t, cli("snapshot", "delete", "../../etc/passwd"), 2, "is not a snapshot key")
	oneLineError(t, cli("snapshot", "delete"), 2, "missing argument")

	// Prune to the newest one.
	oneLineError(t, cli("snapshot", "prune"), 2, "--keep N is required")
	oneLineError(t, cli("snapshot", "prune", "--keep", "0"), 2, "keep at least 1")
	r = cli("snapshot", "prune", "--keep", "1")
	if r.code != 0 || r.stdout != "deleted "+keys[0]+"\npruned 1 snapshot; kept the newest 1\n" {
		t.Fatalf("prune --keep 1:\n%s", r)
	}
	r = cli("snapshot", "list")
	if listed := snapshotKeyRE.FindAllString(r.stdout, -1); len(listed) != 1 || listed[0] != keys[2] {
		t.Errorf("list after prune = %v, want [%s]", listed, keys[2])
	}
	if r = cli("snapshot", "prune", "--keep", "3"); r.code != 0 || r.stdout != "pruned 0 snapshots; kept the newest 3\n" {
		t.Errorf("prune with nothing to prune:\n%s", r)
	}

	// An entry a snapshot cannot hold (a FIFO) is left out, named, and the rest saved.
	if err := syscall.Mkfifo(filepath.Join(ws, "pipe\nname"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = cli("snapshot", "save", "-w", ws)
	if r.code != 0 || !strings.Contains(r.stdout, "left out 1 entry that a snapshot cannot hold") ||
		!strings.Contains(r.stdout, `  "pipe\nname": `) {
		t.Errorf("a save with a FIFO in the workspace:\n%s", r)
	}
}

// TestPrintable: what a terminal would act on never reaches it from an error or a reason.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain text: ünïcode ok": "plain text: ünïcode ok",
		"entry \"a\x1b[2J\" bad": `entry "a\x1b[2J" bad`,
		"bell\a and \u202e rtl":  `bell\a and \u202e rtl`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCheckpoints: the chunked format's commands as a user runs them: diff, verify (of a
// snapshot and of a live workspace), export, rewind and its undo, fork, a diff across
// projects, merge and gc.
func TestCheckpoints(t *testing.T) {
	t.Parallel()
	env := []string{"TOOLHOST_STORE_DIR=" + t.TempDir()}
	cli := func(project string, args ...string) runResult {
		t.Helper()
		return runCLI(t, env, append(args, "--project", project)...)
	}
	ws := t.TempDir()
	var keys []string
	for i, body := range []string{"one\ntwo\nthree\n", "one\nTWO\nthree\n", "one\nTWO\nthree\nfour\n"} {
		writeTree(t, ws, map[string]string{"notes.txt": body, "same.txt": "kept\n"})
		r := cli("shop", "snapshot", "save", "-w", ws)
		key := snapshotKeyRE.FindString(r.stdout)
		if r.code != 0 || !strings.HasSuffix(key, ".snap") {
			t.Fatalf("save %d:\n%s", i, r)
		}
		keys = append(keys, key)
	}
	short := func(k string) string { return strings.TrimSuffix(filepath.Base(k), ".snap") }

	r := cli("shop", "snapshot", "diff", short(keys[0]))
	if r.code != 0 || !strings.Contains(r.stdout, "changed  notes.txt (content)") || !strings.Contains(r.stdout, "-two\n+TWO\n") ||
		!strings.Contains(r.stdout, "+four\n") || strings.Contains(r.stdout, "same.txt") {
		t.Fatalf("diff:\n%s", r)
	}
	if r = cli("shop", "snapshot", "verify"); r.code != 0 || !strings.HasPrefix(r.stdout, "verified "+keys[2]) {
		t.Fatalf("verify:\n%s", r)
	}
	if r = cli("shop", "snapshot", "verify", "-w", ws); r.code != 0 || !strings.Contains(r.stdout, "holds exactly") {
		t.Fatalf("verify of the live workspace:\n%s", r)
	}
	writeTree(t, ws, map[string]string{"new.txt": "x\n"})
	if r = cli("shop", "snapshot", "verify", "-w", ws); r.code != 0 || !strings.Contains(r.stdout, "added    new.txt") {
		t.Fatalf("verify of a changed workspace:\n%s", r)
	}
	exp := filepath.Join(t.TempDir(), "shop.tar.gz")
	if r = cli("shop", "snapshot", "export", "-o", exp); r.code != 0 {
		t.Fatalf("export:\n%s", r)
	}
	if out, err := exec.Command("tar", "tzf", exp).CombinedOutput(); err != nil || !strings.Contains(string(out), "\nnotes.txt\n") {
		t.Fatalf("tar reads the export: %v\n%s", err, out)
	}
	// The export imported into another project is that project's snapshot, of the same
	// tree.
	if r = cli("shop-imp", "snapshot", "import", exp); r.code != 0 || !strings.HasPrefix(r.stdout, "imported "+exp+" as projects/shop-imp/snapshots/") {
		t.Fatalf("import:\n%s", r)
	}
	exported, imported := filepath.Join(t.TempDir(), "e"), filepath.Join(t.TempDir(), "i")
	if r = cli("shop", "snapshot", "restore", "-w", exported); r.code != 0 {
		t.Fatalf("restore:\n%s", r)
	}
	if r = cli("shop-imp", "snapshot", "restore", "-w", imported); r.code != 0 {
		t.Fatalf("restore of the import:\n%s", r)
	}
	sameTree(t, "the imported export", tree(t, imported), tree(t, exported))
	oneLineError(t, cli("shop-imp", "snapshot", "import", filepath.Join(t.TempDir(), "none.tar.gz")), 1, "no such file")

	// Rewind to the first, then undo.
	r = cli("shop", "snapshot", "rewind", short(keys[0]))
	if r.code != 0 || !strings.Contains(r.stdout, "undo: toolhost snapshot rewind --project shop "+short(keys[2])) {
		t.Fatalf("rewind:\n%s", r)
	}
	restored := func(project string) string {
		out := filepath.Join(t.TempDir(), "r")
		if r := cli(project, "snapshot", "restore", "-w", out); r.code != 0 {
			t.Fatalf("restore %s:\n%s", project, r)
		}
		b, _ := os.ReadFile(filepath.Join(out, "notes.txt"))
		return string(b)
	}
	if got := restored("shop"); got != "one\ntwo\nthree\n" {
		t.Fatalf("after the rewind: %q", got)
	}
	if r = cli("shop", "snapshot", "rewind", short(keys[2])); r.code != 0 {
		t.Fatalf("undo:\n%s", r)
	}
	if got := restored("shop"); got != "one\nTWO\nthree\nfour\n" {
		t.Fatalf("after the undo: %q", got)
	}

	// Fork, change the fork, compare across projects, merge back.
	if r = cli("shop", "snapshot", "fork", "--to", "shop-x"); r.code != 0 || !strings.Contains(r.stdout, "into project shop-x") {
		t.Fatalf("fork:\n%s", r)
	}
	fws := filepath.Join(t.TempDir(), "fork")
	if r = cli("shop-x", "snapshot", "restore", "-w", fws); r.code != 0 {
		t.Fatalf("restore the fork:\n%s", r)
	}
	writeTree(t, fws, map[string]string{"notes.txt": "zero\none\nTWO\nthree\nfour\n"})
	if r = cli("shop-x", "snapshot", "save", "-w", fws); r.code != 0 {
		t.Fatalf("save the fork:\n%s", r)
	}
	if r = runCLI(t, env, "snapshot", "diff", "shop:", "shop-x:"); r.code != 0 || !strings.Contains(r.stdout, "+zero\n") {
		t.Fatalf("diff across projects:\n%s", r)
	}
	if r = cli("shop-x", "snapshot", "merge"); r.code != 0 || !strings.Contains(r.stdout, "took     notes.txt") {
		t.Fatalf("merge:\n%s", r)
	}
	if got := restored("shop"); got != "zero\none\nTWO\nthree\nfour\n" {
		t.Fatalf("after the merge: %q", got)
	}
	if r = cli("shop", "snapshot", "gc"); r.code != 0 || !strings.Contains(r.stdout, "manifests") {
		t.Fatalf("gc:\n%s", r)
	}
}

// TestCallAfterADamagedSnapshot is issue 29 as it was found: one pack of the project's
// newest snapshot rots. The next `toolhost call` wakes in the snapshot before it, says on
// stderr that the damaged one was set aside, and answers; the calls after it save and see
// their work (each exited 1 without its result, "read the snapshot saved over", until
// someone deleted the snapshot by hand). snapshot verify lists the quarantine; release
// refuses a snapshot still damaged; delete takes it away.
func TestCallAfterADamagedSnapshot(t *testing.T) {
	requireBwrap(t)
	t.Parallel()
	project := "damaged"
	call := func(tool, input string) runResult {
		t.Helper()
		r := runCLI(t, nil, "call", tool, input, "--project", project)
		if r.code != 0 {
			t.Fatalf("call %s %s:\n%s", tool, input, r)
		}
		return r
	}
	packDir := filepath.Join(testStore(t), "data", "chunks", "packs")
	packs := func() map[string]bool {
		out := map[string]bool{}
		filepath.WalkDir(packDir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				out[p] = true
			}
			return nil
		})
		return out
	}
	call("write_file", `{"path":"one.txt","content":"one\n"}`)
	before := packs()
	call("write_file", `{"path":"two.txt","content":"two\n"}`)
	rotted := 0
	for p := range packs() {
		if before[p] {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		rotted++
	}
	if rotted == 0 {
		t.Fatal("the second call stored no pack")
	}

	r := call("bash", `{"command":"ls"}`)
	if text := decodeResult(t, r).Content[0].Text; !strings.Contains(text, "one.txt") || strings.Contains(text, "two.txt") {
		t.Errorf("the call after the damage sees %q; want the first call's workspace", text)
	}
	if !strings.Contains(r.stderr, "set aside in quarantine") {
		t.Errorf("the call does not say the damaged snapshot was set aside:\n%s", r)
	}
	call("write_file", `{"path":"work.txt","content":"work\n"}`)
	r = call("bash", `{"command":"cat work.txt one.txt"}`)
	if text := decodeResult(t, r).Content[0].Text; !strings.Contains(text, "work\none\n") {
		t.Errorf("the work of the call after the damage is lost: %q", text)
	}

	r = runCLI(t, nil, "snapshot", "verify", "--project", project)
	if r.code != 0 || !strings.Contains(r.stdout, "1 snapshot set aside as damaged") || !strings.Contains(r.stdout, ": damaged-pack: ") {
		t.Fatalf("verify does not list the quarantine:\n%s", r)
	}
	r = runCLI(t, nil, "snapshot", "verify", "--project", project, "--format", "json")
	var v struct {
		Quarantined []struct{ Key, Snapshot, Reason, Why string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || len(v.Quarantined) != 1 || v.Quarantined[0].Why == "" {
		t.Fatalf("verify --format json: %v\n%s", err, r)
	}
	q := v.Quarantined[0].Key
	if r = runCLI(t, nil, "snapshot", "release", "--project", project, q); r.code != 1 || !strings.Contains(r.stderr, "still does not verify") {
		t.Errorf("release of a snapshot still damaged:\n%s", r)
	}
	if r = runCLI(t, nil, "snapshot", "delete", "--project", project, q); r.code != 0 {
		t.Fatalf("delete of the quarantined snapshot:\n%s", r)
	}
	if r = runCLI(t, nil, "snapshot", "verify", "--project", project); r.code != 0 || strings.Contains(r.stdout, "set aside") {
		t.Errorf("verify after the delete:\n%s", r)
	}
}

// putOldSnapshot stores dir as a tar.gz snapshot of the project in the directory store at
// storeDir, taken at at, as versions before chunked became the only storage format did
// (one archive, its SHA-256 and content digest in its metadata), and returns its key.
func putOldSnapshot(t *testing.T, storeDir, project string, at time.Time, dir string) string {
	t.Helper()
	ctx := context.Background()
	var arc bytes.Buffer
	if _, err := archive.Pack(ctx, &arc, dir, archive.PackOptions{}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(arc.Bytes())
	md := map[string]string{snapshot.MetaSHA256: hex.EncodeToString(sum[:])}
	d, err := chunked.TarTreeDigest(bytes.NewReader(arc.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	md[snapshot.MetaTree] = d.String()
	st, err := dirstore.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := snapshot.Key(project, at, snapshot.NewNonce())
	if _, err := st.Put(ctx, key, bytes.NewReader(arc.Bytes()), store.PutOptions{Size: int64(arc.Len()), Metadata: md, IfNotExists: true}); err != nil {
		t.Fatal(err)
	}
	return key
}
