package pluginreg

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// blobStore is the registry's blob store, whose blobs a test can swap (a registry that
// serves other bytes than a digest names).
type blobStore struct {
	mu       sync.Mutex
	m        map[string][]byte
	tampered map[string][]byte
}

func (b *blobStore) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.tampered[h.String()]; ok {
		return int64(len(t)), nil
	}
	v, ok := b.m[h.String()]
	if !ok {
		return 0, registry.ErrNotFound
	}
	return int64(len(v)), nil
}

func (b *blobStore) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.tampered[h.String()]
	if !ok {
		v, ok = b.m[h.String()]
	}
	if !ok {
		return nil, registry.ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(v)), nil
}

func (b *blobStore) Put(_ context.Context, _ string, h v1.Hash, rc io.ReadCloser) error {
	defer rc.Close()
	v, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.m[h.String()] = v
	b.mu.Unlock()
	return nil
}

func (b *blobStore) tamper(digest string, v []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if v == nil {
		delete(b.tampered, digest)
		return
	}
	b.tampered[digest] = v
}

// testRegistry is go-containerregistry's registry on loopback, with the referrers API.
type testRegistry struct {
	host  string // 127.0.0.1:port
	blobs *blobStore
	slow  atomic.Bool // manifests answer only when the client gives up (at most 10 s)
}

func startRegistry(t testing.TB) *testRegistry {
	r := &testRegistry{blobs: &blobStore{m: map[string][]byte{}, tampered: map[string][]byte{}}}
	h := registry.New(registry.WithReferrersSupport(true), registry.WithBlobHandler(r.blobs),
		registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.slow.Load() && strings.Contains(req.URL.Path, "/manifests/") {
			select {
			case <-req.Context().Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func wasmOf(t testing.TB, pkg string) []byte {
	t.Helper()
	p, err := testplugins.Build(pkg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func push(t testing.TB, ref string, wasm []byte, key *ecdsa.PrivateKey) string {
	t.Helper()
	ctx := context.Background()
	meta, err := Describe(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Push(ctx, ref, wasm, meta, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if key != nil {
		sd, err := Sign(ctx, ref, key, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if sd != d {
			t.Fatalf("signed %s, pushed %s", sd, d)
		}
	}
	return d
}

func newKey(t testing.TB) (*ecdsa.PrivateKey, string) {
	t.Helper()
	priv, pub, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := ParsePrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "key.pub")
	if err := os.WriteFile(f, pub, 0o600); err != nil {
		t.Fatal(err)
	}
	return k, f
}

// files snapshots the config and the lock, to check a failure left them as they were.
func files(t *testing.T, in *Installer) string {
	t.Helper()
	var out string
	for _, f := range []string{in.ConfigFile, LockPath(in.ConfigFile)} {
		b, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		out += f + ":\n" + string(b) + "\n"
	}
	return out
}

func newInstaller(t *testing.T, keyFiles ...string) *Installer {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "toolhost.yaml")
	if err := os.WriteFile(cfg, []byte("# the operator's own comment\nlog_level: info\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := ReadPublicKeys(keyFiles)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	return &Installer{ConfigFile: cfg, DataDir: filepath.Join(dir, "data"), Current: toolhost.DefaultConfig().Plugins,
		Keys: keys, Options: Options{Timeout: 30 * time.Second}, Out: &out}
}

// current re-reads the plugins of in's configuration, as the next command would.
func (in *Installer) reload(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(in.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	var ps []toolhost.Plugin
	for _, block := range strings.Split(string(b), "\n  - ")[1:] {
		p := toolhost.Plugin{}
		for _, line := range strings.Split(block, "\n") {
			line = strings.TrimSpace(strings.TrimPrefix(line, "- "))
			if v, ok := strings.CutPrefix(line, "path: "); ok {
				p.Path = v
			}
			if v, ok := strings.CutPrefix(line, "grants: ["); ok {
				for _, g := range strings.Split(strings.TrimSuffix(v, "]"), ", ") {
					p.Grants = append(p.Grants, abi.Capability(g))
				}
			}
		}
		ps = append(ps, p)
	}
	in.Current = ps
}

func mustFail(t *testing.T, in *Installer, want error, err error, before string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
	if after := files(t, in); after != before {
		t.Fatalf("a failure changed the files:\nbefore %s\nafter %s", before, after)
	}
}

func TestPublishInstallUpgrade(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t)
	key, pub := newKey(t)
	wc1, wc2 := wasmOf(t, "internal/pluginreg/testdata/wc1"), wasmOf(t, "internal/pluginreg/testdata/wc2")
	ref1, ref2 := reg.host+"/team/wc:0.1.0", reg.host+"/team/wc:0.2.0"
	d1 := push(t, ref1, wc1, key)
	push(t, ref2, wc2, key)
	in := newInstaller(t, pub)

	// The artifact is the Wasm OCI layout: other tools read the module.
	a, err := Pull(ctx, ref1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Wasm, wc1) || a.Digest != d1 || a.Meta.Manifest.Name != "wc" || !strings.Contains(string(a.Manifest), `"mediaType":"application/vnd.wasm.config.v0+json"`) {
		t.Fatalf("pulled %s %s %+v\n%s", a.Digest, a.WasmDigest, a.Meta.Manifest, a.Manifest)
	}

	// Without the grant it needs: refused, nothing written.
	before := files(t, in)
	_, err = in.Add(ctx, ref1, Entry{})
	mustFail(t, in, ErrGrants, err, before)
	if !strings.Contains(err.Error(), "--grant sandbox_files") {
		t.Errorf("the refusal does not say what to pass: %v", err)
	}

	grants, err := ParseGrants([]string{"sandbox_files.read=**"})
	if err != nil {
		t.Fatal(err)
	}
	lp, err := in.Add(ctx, ref1, grants)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := os.ReadFile(in.ConfigFile)
	for _, want := range []string{"# the operator's own comment", "path: editfile.wasm", "programs: [pdfinfo, pdftotext, pdftoppm]", "path: " + lp.Path, "sandbox_files:", "read: ['**']"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("the config does not have %q:\n%s", want, cfg)
		}
	}
	if lp.Digest != d1 || lp.Signer != KeyID(&key.PublicKey) || lp.Wasm != Digest(wc1) {
		t.Fatalf("locked %+v", lp)
	}
	in.reload(t)
	lock, err := ReadLock(LockPath(in.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Check([]string{lp.Path}, ""); err != nil {
		t.Fatal(err)
	}
	if problems, err := in.Verify(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("verify: %v %v", problems, err)
	}
	// Installed already: add refuses.
	before = files(t, in)
	_, err = in.Add(ctx, ref1, grants)
	mustFail(t, in, ErrExists, err, before)

	t.Run("tampered blob", func(t *testing.T) {
		evil := append(bytes.Clone(wc1), 0)
		reg.blobs.tamper(Digest(wc1), evil[:len(wc1)-1])
		reg.blobs.tamper(Digest(wc1), append(bytes.Clone(wc1[:len(wc1)-1]), wc1[len(wc1)-1]^1))
		defer reg.blobs.tamper(Digest(wc1), nil)
		_, err := Pull(ctx, ref1, Options{})
		if !errors.Is(err, ErrDigest) || !strings.Contains(err.Error(), Digest(wc1)) {
			t.Fatalf("pull of a tampered blob: %v", err)
		}
		problems, err := in.Verify(ctx)
		if err != nil || len(problems) != 1 || !strings.Contains(problems[0], Digest(wc1)) {
			t.Fatalf("verify of a tampered blob: %v %v", problems, err)
		}
		// A layer larger than its descriptor says.
		reg.blobs.tamper(Digest(wc1), append(bytes.Clone(wc1), 'x'))
		if _, err := Pull(ctx, ref1, Options{}); !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrDigest) {
			t.Fatalf("pull of a blob longer than its descriptor: %v", err)
		}
	})

	t.Run("tampered module and lock", func(t *testing.T) {
		orig, _ := os.ReadFile(lp.Path)
		os.WriteFile(lp.Path, append(bytes.Clone(orig), 0), 0o600)
		err := lock.Check([]string{lp.Path}, "")
		if !errors.Is(err, ErrLockDiffers) || !strings.Contains(err.Error(), lp.Wasm) || !strings.Contains(err.Error(), Digest(append(bytes.Clone(orig), 0))) {
			t.Fatalf("a changed module: %v", err)
		}
		os.WriteFile(lp.Path, orig, 0o600)
		lb, _ := os.ReadFile(LockPath(in.ConfigFile))
		bad := strings.Replace(string(lb), lp.Wasm, Digest([]byte("other")), 1)
		os.WriteFile(LockPath(in.ConfigFile), []byte(bad), 0o600)
		defer os.WriteFile(LockPath(in.ConfigFile), lb, 0o600)
		l2, err := ReadLock(LockPath(in.ConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := l2.Check([]string{lp.Path}, ""); !errors.Is(err, ErrLockDiffers) || !strings.Contains(err.Error(), Digest([]byte("other"))) {
			t.Fatalf("a changed lock: %v", err)
		}
		before := files(t, in)
		_, err = in.Upgrade(ctx, "wc", "0.2.0", true, Entry{})
		mustFail(t, in, ErrLockDiffers, err, before)
	})

	// The upgrade needs sandbox_exec: refused (the operator asked says no), then accepted
	// with the diff shown.
	before = files(t, in)
	var asked string
	in.Confirm = func(q string) bool { asked = q; return false }
	changes, err := in.Upgrade(ctx, "wc", "0.2.0", false, Entry{})
	mustFail(t, in, ErrWidens, err, before)
	if !strings.Contains(asked, "sandbox_exec") {
		t.Errorf("the operator was asked %q", asked)
	}
	in.Confirm = nil
	var text []string
	for _, c := range changes {
		text = append(text, c.Text)
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{"needs grant sandbox_exec", "new host import toolhost_sandbox_exec.", "tool added: line_count", `tool word_count: input "mode" is now required`} {
		if !strings.Contains(all, want) {
			t.Errorf("the diff does not say %q:\n%s", want, all)
		}
	}
	extra, _ := ParseGrants([]string{"sandbox_exec=wc"})
	if _, err := in.Upgrade(ctx, "wc", "0.2.0", true, extra); err != nil {
		t.Fatal(err)
	}
	cfg, _ = os.ReadFile(in.ConfigFile)
	if !strings.Contains(string(cfg), "programs: [wc]") || !strings.Contains(string(cfg), "sandbox_exec") || strings.Contains(string(cfg), lp.Path) {
		t.Errorf("the upgraded config:\n%s", cfg)
	}
	lock, _ = ReadLock(LockPath(in.ConfigFile))
	if p, _ := lock.Find("wc"); p.Version != "0.2.0" || p.Wasm != Digest(wc2) {
		t.Errorf("the lock after the upgrade: %+v", p)
	}
}

func TestRefusals(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t)
	key, pub := newKey(t)
	other, _ := newKey(t)
	wc1 := wasmOf(t, "internal/pluginreg/testdata/wc1")
	grants, _ := ParseGrants([]string{"sandbox_files"})

	t.Run("another key", func(t *testing.T) {
		in := newInstaller(t, pub)
		push(t, reg.host+"/other/wc:1", wc1, other)
		before := files(t, in)
		_, err := in.Add(ctx, reg.host+"/other/wc:1", grants)
		mustFail(t, in, ErrUntrusted, err, before)
	})
	t.Run("unsigned", func(t *testing.T) {
		in := newInstaller(t, pub)
		push(t, reg.host+"/unsigned/wc:1", wc1, nil)
		before := files(t, in)
		_, err := in.Add(ctx, reg.host+"/unsigned/wc:1", grants)
		mustFail(t, in, ErrUnsigned, err, before)
		in.AllowUnsigned = []string{"registry.example"}
		_, err = in.Add(ctx, reg.host+"/unsigned/wc:1", grants)
		mustFail(t, in, ErrUnsigned, err, before)
		in.AllowUnsigned = []string{reg.host}
		lp, err := in.Add(ctx, reg.host+"/unsigned/wc:1", grants)
		if err != nil || lp.Signer != Unsigned {
			t.Fatalf("unsigned from an allowed registry: %+v %v", lp, err)
		}
	})
	t.Run("a scope the configuration refuses", func(t *testing.T) {
		in := newInstaller(t, pub)
		in.Validate = func(ps []toolhost.Plugin) error {
			cfg := toolhost.DefaultConfig()
			cfg.Plugins = ps
			return cfg.Validate()
		}
		push(t, reg.host+"/scoped/wc:1", wc1, key)
		bad, err := ParseGrants([]string{"sandbox_files.read=/etc/**"})
		if err != nil {
			t.Fatal(err)
		}
		before := files(t, in)
		_, err = in.Add(ctx, reg.host+"/scoped/wc:1", bad)
		if err == nil || !strings.Contains(err.Error(), "absolute") {
			t.Fatalf("an absolute pattern: %v", err)
		}
		if after := files(t, in); after != before {
			t.Fatalf("a failure changed the files:\nbefore %s\nafter %s", before, after)
		}
	})
	t.Run("a description that lies", func(t *testing.T) {
		in := newInstaller(t, pub)
		meta, err := Describe(ctx, wc1)
		if err != nil {
			t.Fatal(err)
		}
		meta.Needs = []abi.Capability{}
		ref := reg.host + "/liar/wc:1"
		if _, err := Push(ctx, ref, wc1, meta, Options{}); err != nil {
			t.Fatal(err)
		}
		if _, err := Sign(ctx, ref, key, Options{}); err != nil {
			t.Fatal(err)
		}
		before := files(t, in)
		_, err = in.Add(ctx, ref, Entry{})
		mustFail(t, in, ErrMetaLies, err, before)
	})
	t.Run("bad references", func(t *testing.T) {
		in := newInstaller(t, pub)
		before := files(t, in)
		for _, ref := range []string{reg.host + "/../etc/wc:1", reg.host + "/a/./wc:1", reg.host + "/a//wc:1", "http://" + reg.host + "/wc:1",
			"wc:1", "team/wc:1", "../x:1", "./x/y:1", "-a.b/x:1", "a..b/x:1", ".:1/x", reg.host + "/a\\..\\b:1", "", reg.host + "/wc:../../x"} {
			_, err := in.Add(ctx, ref, grants)
			mustFail(t, in, ErrRef, err, before)
		}
	})
	t.Run("oversized layer", func(t *testing.T) {
		in := newInstaller(t, pub)
		push(t, reg.host+"/big/wc:1", wc1, key)
		in.Options.MaxBytes = int64(len(wc1)) - 1
		before := files(t, in)
		_, err := in.Add(ctx, reg.host+"/big/wc:1", grants)
		mustFail(t, in, ErrTooLarge, err, before)
		if _, err := Push(ctx, reg.host+"/big/wc:2", wc1, Meta{}, Options{MaxBytes: 10}); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("push over the bound: %v", err)
		}
	})
	t.Run("slow registry", func(t *testing.T) {
		in := newInstaller(t, pub)
		push(t, reg.host+"/slow/wc:1", wc1, key)
		reg.slow.Store(true)
		defer reg.slow.Store(false)
		in.Options.Timeout = 200 * time.Millisecond
		before := files(t, in)
		_, err := in.Add(ctx, reg.host+"/slow/wc:1", grants)
		mustFail(t, in, context.DeadlineExceeded, err, before)
	})
}

func TestEditConfigKeepsEntries(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c.yaml")
	os.WriteFile(f, []byte("plugins:\n  - path: bash.wasm  # the shell\n    grants: [sandbox_exec, log]\n    env: {A: b}\n"), 0o600)
	b, err := EditConfig(f, nil, "bash.wasm", Entry{Path: "/x/new.wasm", Grants: []abi.Capability{abi.CapSandboxExec}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"path: /x/new.wasm", "# the shell", "env: {A: b}", "grants: [sandbox_exec]"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("no %q in\n%s", want, b)
		}
	}
	if _, err := EditConfig(f, nil, "none.wasm", Entry{Path: "/x"}); err == nil {
		t.Error("replacing a plugin the config does not have succeeded")
	}
}

// TestLockStamps: a module checked once is not read again while its stamp holds, and any
// write to it (whatever times it sets back) makes the next check read it again and
// refuse it.
func TestLockStamps(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("stamps are trusted on Linux only")
	}
	dir := t.TempDir()
	mod := filepath.Join(dir, "m.wasm")
	orig := []byte("\x00asm\x01\x00\x00\x00 a module")
	os.WriteFile(mod, orig, 0o600)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(mod, old, old)
	lock := &Lock{Version: 1, Plugins: []LockedPlugin{{Name: "m", Path: mod, Wasm: Digest(orig)}}}
	stamps := filepath.Join(dir, "stamps")
	// A stamp is only taken of a file whose change time is a second old.
	time.Sleep(1100 * time.Millisecond)
	if err := lock.Check([]string{mod}, stamps); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(stamps); len(ents) != 1 {
		t.Fatalf("%d stamps after a check", len(ents))
	}
	// Same size, same modification time: only the change time tells.
	os.WriteFile(mod, append(bytes.Clone(orig[:len(orig)-1]), 'X'), 0o600)
	os.Chtimes(mod, old, old)
	if err := lock.Check([]string{mod}, stamps); !errors.Is(err, ErrLockDiffers) {
		t.Fatalf("a module written after its stamp: %v", err)
	}
}
