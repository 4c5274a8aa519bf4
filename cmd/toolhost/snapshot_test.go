package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/core/store/s3/s3test"
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

var snapshotKeyRE = regexp.MustCompile(`projects/[^/\s]+/snapshots/\d{8}T\d{6}Z(_\d\d)?\.tar\.gz`)

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
		{"unknown subcommand", []string{"snapshot", "delete"}, 2, "snapshot save, snapshot list, snapshot restore"},
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
	// A bucket that does not exist: one line, exit 1.
	r = runCLI(t, append(env, "TOOLHOST_STORE_S3_BUCKET=no-such-bucket"), "snapshot", "list", "--project", "s3-project")
	oneLineError(t, r, 1, "no-such-bucket")
}
