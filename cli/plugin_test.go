package cli

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/toolhost/toolhost/internal/pluginreg"
	"github.com/toolhost/toolhost/internal/testplugins"
)

// TestPluginFromRegistry: the README's plugin published to a registry on loopback,
// signed, added with its grant, loaded; a module that differs from toolhost.lock is
// refused at load, naming both digests.
func TestPluginFromRegistry(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(registry.New(registry.WithReferrersSupport(true), registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/team/wordcount:0.1.0"
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	os.MkdirAll(data, 0o700)
	if err := testplugins.LinkCache(data); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "signing.key")
	r := runCLI(t, nil, "plugin", "sign", "--generate-key", key)
	if r.code != 0 {
		t.Fatal(r)
	}
	cfg := filepath.Join(dir, "toolhost.yaml")
	os.WriteFile(cfg, []byte("data_dir: "+data+"\nregistry:\n  keys: ["+key+".pub]\n"), 0o600)

	if r := runCLI(t, nil, "plugin", "push", wordcountWasm, ref, "--config", cfg); r.code != 0 {
		t.Fatal(r)
	}
	if r := runCLI(t, nil, "plugin", "sign", ref, "--key", key); r.code != 0 {
		t.Fatal(r)
	}
	r = runCLI(t, nil, "plugin", "add", ref, "--config", cfg)
	if r.code != 1 || !strings.Contains(r.stderr, "--grant sandbox_files") {
		t.Fatalf("add without the grant:\n%s", r)
	}
	r = runCLI(t, nil, "plugin", "add", ref, "--grant", "sandbox_files", "--config", cfg)
	if r.code != 0 || !strings.Contains(r.stdout, "word_count") {
		t.Fatalf("add:\n%s", r)
	}
	r = runCLI(t, nil, "tools", "--config", cfg)
	if r.code != 0 || !strings.Contains(r.stdout, `"word_count"`) || !strings.Contains(r.stdout, `"read_file"`) {
		t.Fatalf("tools with the added plugin:\n%s", r)
	}
	if r := runCLI(t, nil, "plugin", "verify", "--config", cfg); r.code != 0 {
		t.Fatalf("verify:\n%s", r)
	}

	lock, err := pluginreg.ReadLock(pluginreg.LockPath(cfg))
	if err != nil || len(lock.Plugins) != 1 {
		t.Fatalf("lock: %+v %v", lock, err)
	}
	lp := lock.Plugins[0]
	orig, _ := os.ReadFile(lp.Path)
	changed := append(append([]byte(nil), orig...), 0)
	os.WriteFile(lp.Path, changed, 0o600)
	r = runCLI(t, nil, "tools", "--config", cfg)
	oneLineError(t, r, 1, lp.Wasm)
	if !strings.Contains(r.stderr, pluginreg.Digest(changed)) {
		t.Errorf("the refusal does not name the module's digest:\n%s", r)
	}
	r = runCLI(t, nil, "plugin", "verify", "--config", cfg)
	if r.code != 1 || !strings.Contains(r.stdout, pluginreg.Digest(changed)) {
		t.Errorf("verify of a changed module:\n%s", r)
	}
	os.WriteFile(lp.Path, orig, 0o600)
	if r := runCLI(t, nil, "tools", "--config", cfg); r.code != 0 {
		t.Fatal(r)
	}
	if r := runCLI(t, nil, "plugin", "add", "../x:1", "--config", cfg); r.code != 2 {
		t.Errorf("a bad reference:\n%s", r)
	}
}
