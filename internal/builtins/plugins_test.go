package builtins_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/wasmbuild"
)

// TestEmbeddedModulesAreCurrent fails when a committed module in internal/builtins/wasm is not the
// build of the sources as they are: run `make plugins` and commit the result. The sources
// are compared always (their digest is in wasm/manifest.json); the bytes too when this
// toolchain is the one that built them, since another Go release compiles other bytes.
func TestEmbeddedModulesAreCurrent(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	m, err := wasmbuild.ReadManifest("wasm")
	if err != nil {
		t.Fatalf("reading the manifest of the built-in plugins: %v (run make plugins)", err)
	}
	sameToolchain := m.Go == wasmbuild.Toolchain()
	if !sameToolchain {
		t.Logf("the modules were built with %s, this is %s: comparing their sources, not their bytes", m.Go, wasmbuild.Toolchain())
	}
	if len(m.Plugins) != len(builtins.Builtins()) {
		t.Errorf("the manifest lists %d plugins, there are %d built-ins (run make plugins)", len(m.Plugins), len(builtins.Builtins()))
	}
	for _, b := range builtins.Builtins() {
		t.Run(b.Name, func(t *testing.T) {
			rec, ok := m.Plugins[b.Name]
			if !ok {
				t.Fatalf("the manifest has no entry for %s (run make plugins)", b.Name)
			}
			src, err := wasmbuild.SourceDigest(root, "plugins/"+b.Name)
			if err != nil {
				t.Fatal(err)
			}
			if src != rec.Sources {
				files, _ := wasmbuild.Sources(root, "plugins/"+b.Name)
				t.Errorf("internal/builtins/wasm/%s is stale: its sources changed since it was built (run make plugins and commit internal/builtins/wasm); the sources: %s",
					b.File, strings.Join(files, " "))
			}
			embedded, err := builtins.Wasm(b.File)
			if err != nil {
				t.Fatal(err)
			}
			if d := wasmbuild.Digest(embedded); d != rec.Wasm {
				t.Errorf("internal/builtins/wasm/%s is not the module the manifest records (%s, want %s): run make plugins", b.File, d, rec.Wasm)
			}
			if !sameToolchain {
				return
			}
			out := filepath.Join(t.TempDir(), b.File)
			var stderr bytes.Buffer
			if err := wasmbuild.Build("", root, "plugins/"+b.Name, out, &stderr); err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			built, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(built, embedded) {
				t.Errorf("internal/builtins/wasm/%s differs from a fresh build with %s (%d bytes, fresh %d): run make plugins", b.File, m.Go, len(embedded), len(built))
			}
		})
	}
}

func TestLookup(t *testing.T) {
	var files, optIn []string
	for _, b := range builtins.Builtins() {
		files = append(files, b.File)
		if b.OptIn {
			optIn = append(optIn, b.File)
		}
		wasm, err := builtins.Wasm(b.File)
		if err != nil || !bytes.HasPrefix(wasm, []byte("\x00asm")) {
			t.Errorf("Wasm(%s): %d bytes, %v; want a module", b.File, len(wasm), err)
		}
	}
	if !slices.Equal(files, []string{"bash.wasm", "editfile.wasm", "grepglob.wasm", "screenshot.wasm", "webfetch.wasm"}) {
		t.Errorf("built-ins %v", files)
	}
	if !slices.Equal(optIn, []string{"webfetch.wasm"}) {
		t.Errorf("opt-in built-ins %v, want webfetch.wasm only (it reaches the web)", optIn)
	}
	if _, err := builtins.Wasm("manifest.json"); err == nil {
		t.Error("Wasm serves a file that is not a built-in module")
	}
	if _, ok := builtins.Lookup("wordcount.wasm"); ok {
		t.Error("Lookup found a plugin that is not built in")
	}
}

// TestSeedsAreCurrent fails when wasm/seeds.json is not what the host's first load of each
// built-in records under the default configuration and each of its SeedEnvs: run `make
// plugins`. A stale seed
// would not be unsafe (the host checks every module against its seed before it serves),
// but the built-in would fail its calls.
func TestSeedsAreCurrent(t *testing.T) {
	for _, b := range builtins.Builtins() {
		t.Run(b.Name, func(t *testing.T) {
			wasm, err := builtins.Wasm(b.File)
			if err != nil {
				t.Fatal(err)
			}
			want, err := host.MakeSeeds(context.Background(), host.Config{}, host.PluginSpec{Path: b.File, Wasm: wasm, Grants: b.Grants}, b.SeedEnvs)
			if err != nil {
				t.Fatal(err)
			}
			var got []host.Seed
			if err := json.Unmarshal(builtins.Seeds(b.File), &got); err != nil {
				t.Fatalf("the seed of %s: %v (run make plugins)", b.File, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("internal/builtins/wasm/%s holds a stale seed of %s: run make plugins and commit internal/builtins/wasm", builtins.SeedsFile, b.File)
			}
		})
	}
}
