package toolhost

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// TestConfigKeys: the key table and Config are one: every field that holds a value has
// exactly one key, every key a field, variables and flags are unique, and the defaults are
// valid.
func TestConfigKeys(t *testing.T) {
	var leaves []string
	var walk func(typ reflect.Type, prefix string)
	walk = func(typ reflect.Type, prefix string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if !f.IsExported() {
				continue // Config.modules: walked below, module by module
			}
			name := f.Tag.Get("key")
			if name == "" {
				t.Errorf("field %s%s has no key tag", prefix, f.Name)
				continue
			}
			if f.Type.Kind() == reflect.Struct && (f.Type.PkgPath() == typ.PkgPath() || f.Type.Name() == "") {
				walk(f.Type, prefix+name+".")
				continue
			}
			leaves = append(leaves, prefix+name)
		}
	}
	walk(reflect.TypeFor[Config](), "")
	for _, m := range moduleRefs() {
		walk(reflect.TypeOf(m.config()).Elem(), m.prefix)
	}

	keys := ConfigKeys()
	byName, env, flags := map[string]bool{}, map[string]string{}, map[string]string{}
	for _, k := range keys {
		if byName[k.Name] {
			t.Errorf("key %s listed twice", k.Name)
		}
		byName[k.Name] = true
		if k.Doc == "" || (k.Flag != "" && k.Usage == "") {
			t.Errorf("key %s: no doc or usage", k.Name)
		}
		names := []struct{ env, flag string }{{k.Env, k.Flag}}
		for _, a := range k.Aliases {
			names = append(names, struct{ env, flag string }{a.Env, a.Flag})
		}
		// Only lists of records and mappings are the file's alone; a secret has a variable
		// and no flag.
		fileOnly := (k.Type.Kind() == reflect.Slice && k.Type.Elem().Kind() == reflect.Struct) || k.Type.Kind() == reflect.Map
		if k.Secret != (k.Type == reflect.TypeFor[Secret]()) || (k.Secret && (k.Env == "" || k.Flag != "")) {
			t.Errorf("key %s: a secret must be of type Secret, with a variable and no flag", k.Name)
		}
		for _, n := range names {
			if (n.env == "") != fileOnly || (n.flag == "" && !fileOnly && !k.Secret) {
				t.Errorf("key %s (%s) has variable %q and flag %q: every key has both but lists of records and mappings (neither) and secrets (no flag)", k.Name, k.Type, n.env, n.flag)
			}
			if prev, dup := env[n.env]; dup && n.env != "" {
				t.Errorf("variable %s sets both %s and %s", n.env, prev, k.Name)
			}
			if prev, dup := flags[n.flag]; dup && n.flag != "" {
				t.Errorf("flag --%s sets both %s and %s", n.flag, prev, k.Name)
			}
			env[n.env], flags[n.flag] = k.Name, k.Name
		}
		if k.Env != "" && k.Env != EnvPrefix+strings.ToUpper(strings.ReplaceAll(k.Name, ".", "_")) {
			t.Errorf("key %s: variable %s does not follow the rule", k.Name, k.Env)
		}
	}
	for _, l := range leaves {
		if !byName[l] {
			t.Errorf("Config field %s has no entry in the key table", l)
		}
	}
	if len(keys) != len(leaves) {
		t.Errorf("%d keys for %d fields", len(keys), len(leaves))
	}
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	if len(cfg.Plugins) != 4 || cfg.Sandbox.Provider != "local" || cfg.DataDir == "" {
		t.Errorf("defaults: %d plugins, provider %q, data dir %q", len(cfg.Plugins), cfg.Sandbox.Provider, cfg.DataDir)
	}
}

// TestZeroIsNotDefault: a Config left zero is refused, naming a key, instead of silently
// taking defaults.
func TestZeroIsNotDefault(t *testing.T) {
	var c Config
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "config: ") {
		t.Fatalf("zero Config: %v, want a refusal naming a key", err)
	}
	c = DefaultConfig()
	c.Limits.PoolSize = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "limits.pool_size") {
		t.Fatalf("pool size 0: %v", err)
	}
	c = DefaultConfig()
	c.Session.LastCallMargin = c.Session.KeepaliveMargin
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "session.last_call_margin") {
		t.Fatalf("last call margin as long as the keepalive margin: %v", err)
	}
	c = DefaultConfig()
	c.Sandbox.Provider = "e2c"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "sandbox.provider") || !strings.Contains(err.Error(), "local") {
		t.Fatalf("unknown provider: %v", err)
	}
}

// TestLightImports: a program that imports the host or the local provider links no
// browser driver, and nothing of the test-only S3 server is in the module's requirements.
func TestLightImports(t *testing.T) {
	for _, pkg := range []string{"./internal/host", "./internal/sandbox/local", "./core/sandbox", "./abi"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.Contains(dep, "playwright") || strings.Contains(dep, "internal/screenshot") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
	// Traces: the packages an embedder links use the OpenTelemetry API alone; the SDK, the
	// exporter and what it drags in (gRPC) are the CLI's (internal/telemetry).
	for _, pkg := range []string{".", "./internal/host", "./internal/mcpserve"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "go.opentelemetry.io/otel/sdk") || strings.Contains(dep, "otlp") || strings.HasPrefix(dep, "google.golang.org/grpc") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(gomod), "versity") {
		t.Error("go.mod requires the test-only S3 server (VersityGW): it belongs to internal/store/s3/s3test/gateway/go.mod")
	}
}
