// Package moduletest checks that the CLI's loader serves a module a program registers as
// it serves the built-ins: its keys from a file, variables and flags, an older name, and
// a refusal naming the key. It is a package of its own so that the module it registers
// stays out of the other tests' key table (the example file is generated from it).
package moduletest

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/cli/internal/config"
	"github.com/toolhost/toolhost/core/sandbox"
)

type podSection struct {
	Namespace string            `key:"namespace"`
	Replicas  int               `key:"replicas"`
	Boot      time.Duration     `key:"boot"`
	Token     toolhost.Secret   `key:"token"`
	Labels    map[string]string `key:"labels"`
	Image     struct {
		Name string `key:"name"`
	} `key:"image"`
}

func init() {
	toolhost.RegisterProvider(toolhost.ProviderModule[podSection]{
		Name:   "test-pod",
		Prefix: "pod.",
		Keys: []toolhost.ModuleKey{
			{Name: "pod.namespace", Flag: "pod-namespace", Usage: "namespace", Doc: "The namespace."},
			{Name: "pod.replicas", Flag: "pod-replicas", Usage: "replicas", Doc: "How many."},
			{Name: "pod.boot", Flag: "pod-boot", Usage: "boot bound", Doc: "The boot bound."},
			{Name: "pod.token", Secret: true, Doc: "The token."},
			{Name: "pod.labels", FileOnly: true, Doc: "Labels."},
			{Name: "pod.image.name", Flag: "pod-image", Usage: "image", Doc: "The image.", Aliases: []string{"pod.picture"}},
		},
		Config: func() *podSection {
			s := &podSection{Namespace: "default", Replicas: 1, Boot: time.Minute}
			s.Image.Name = "debian"
			return s
		},
		New: func(context.Context, *podSection, toolhost.ModuleEnv) (sandbox.Provider, error) {
			return nil, nil
		},
	})
}

func load(t *testing.T, file string, env []string, args ...string) (*config.Loaded, error) {
	t.Helper()
	dir := t.TempDir()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	config.RegisterFlags(fs)
	if file != "" {
		p := filepath.Join(dir, "toolhost.yaml")
		if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", p)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return config.Load(config.Sources{Flags: fs, Environ: append(env, "TOOLHOST_DATA_DIR="+dir), ConfigHome: dir})
}

func TestModuleKeysLoad(t *testing.T) {
	l, err := load(t, `
pod:
  namespace: from-file
  replicas: 2
  labels:
    team: web
  picture: from-old-name
`, []string{"TOOLHOST_POD_BOOT=45s", "TOOLHOST_POD_TOKEN=tok-0123456789abcdef"}, "--pod-replicas", "5")
	if err != nil {
		t.Fatal(err)
	}
	s := l.Module("test-pod").(*podSection)
	if s.Namespace != "from-file" || s.Replicas != 5 || s.Boot != 45*time.Second || s.Token != "tok-0123456789abcdef" ||
		s.Labels["team"] != "web" || s.Image.Name != "from-old-name" {
		t.Errorf("loaded %+v", *s)
	}
	// Defaults stay where nothing was said.
	l, err = load(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := l.Module("test-pod").(*podSection); s.Namespace != "default" || s.Replicas != 1 || s.Image.Name != "debian" {
		t.Errorf("defaults %+v", *s)
	}
	for _, tc := range []struct {
		name, file string
		env        []string
		want       string
	}{
		{"an unknown key in its section", "pod:\n  replica: 2\n", nil, `unknown key "pod.replica"`},
		{"a bad duration", "", []string{"TOOLHOST_POD_BOOT=soon"}, "pod.boot"},
		{"a bad number", "pod:\n  replicas: many\n", nil, "pod.replicas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.file, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v, want one line with %q", err, tc.want)
			}
		})
	}
}
