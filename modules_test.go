//go:build linux

package toolhost

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/memsandbox"
)

// podSection is the configuration of a provider module a program adds (the test's
// stand-in for, say, a Kubernetes provider): keys of its own, a nested section and a
// secret.
type podSection struct {
	Namespace string        `key:"namespace"`
	Replicas  int           `key:"replicas"`
	Boot      time.Duration `key:"boot"`
	Token     Secret        `key:"token"`
	Labels    []string      `key:"labels"`
	Image     struct {
		Name string `key:"name"`
	} `key:"image"`
}

// podMade records what New was given.
var podMade struct {
	section *podSection
	env     ModuleEnv
}

func init() {
	RegisterProvider(ProviderModule[podSection]{
		Name:     "test-pod",
		Prefix:   "pod.",
		Sections: []ModuleSection{{Name: "pod", Doc: "A provider of pods, for the tests."}, {Name: "pod.image"}},
		Keys: []ModuleKey{
			{Name: "pod.namespace", Flag: "pod-namespace", Usage: "namespace", Doc: "The namespace."},
			{Name: "pod.replicas", Flag: "pod-replicas", Usage: "replicas", Doc: "How many."},
			{Name: "pod.boot", Flag: "pod-boot", Usage: "boot bound", Doc: "The boot bound."},
			{Name: "pod.token", Secret: true, Doc: "The token."},
			{Name: "pod.labels", Flag: "pod-labels", Usage: "labels", Doc: "Labels."},
			{Name: "pod.image.name", Flag: "pod-image", Usage: "image", Doc: "The image.", Aliases: []string{"pod.picture"}},
		},
		Config: func() *podSection {
			s := &podSection{Namespace: "default", Replicas: 1, Boot: time.Minute}
			s.Image.Name = "debian"
			return s
		},
		Validate: func(s *podSection, set ModuleSettings) error {
			if s.Replicas < 1 {
				return fmt.Errorf("config: pod.replicas: must be at least 1, got %d", s.Replicas)
			}
			return nil
		},
		New: func(_ context.Context, cfg *podSection, env ModuleEnv) (sandbox.Provider, error) {
			podMade.section, podMade.env = cfg, env
			return &memsandbox.Provider{}, nil
		},
	})
}

// TestProviderModule: a provider a program registers is a module like the built-ins: its
// keys join the table (after the sandbox section, its own section documented), Get and
// Set reach them, Validate runs its check, a Toolhost makes it with its section and the
// shared settings, and a copy of a Config does not share its section.
func TestProviderModule(t *testing.T) {
	var names []string
	for _, k := range ConfigKeys() {
		if k.Module == "test-pod" {
			names = append(names, k.Name)
			if k.Name == "pod.token" && (k.Flag != "" || k.Env != "TOOLHOST_POD_TOKEN" || k.Default != `""`) {
				t.Errorf("the secret key: %+v", k)
			}
			if k.Name == "pod.replicas" && k.Default != "1" {
				t.Errorf("pod.replicas default %q, want 1 (from the module's Config)", k.Default)
			}
		}
	}
	if got := strings.Join(names, " "); got != "pod.namespace pod.replicas pod.boot pod.token pod.labels pod.image.name" {
		t.Errorf("the module's keys in the table: %s", got)
	}
	found := false
	for _, s := range ConfigSections() {
		found = found || s.Name == "pod" && s.Doc != ""
	}
	if !found {
		t.Error("the module's section is not in ConfigSections")
	}

	cfg := testConfig(t)
	cfg.Sandbox.Provider = "test-pod"
	for k, v := range map[string]any{"sandbox.pool": 2, "pod.namespace": "ci", "pod.replicas": "3", "pod.boot": "90s", "pod.token": Secret("t0k3n-0123456789"), "pod.labels": "a, b", "pod.image.name": "alpine"} {
		if err := cfg.Set(k, v); err != nil {
			t.Fatalf("Set(%s): %v", k, err)
		}
	}
	if v, err := cfg.Get("pod.boot"); err != nil || v != 90*time.Second {
		t.Errorf("Get(pod.boot) = %v, %v", v, err)
	}
	if err := cfg.Set("pod.replicas", "many"); err == nil || !strings.Contains(err.Error(), "pod.replicas") {
		t.Errorf("Set of a bad number: %v", err)
	}
	if err := cfg.Set("pod.nope", 1); err == nil {
		t.Error("Set of an unknown key succeeded")
	}
	clone := cloneConfig(cfg)
	if err := clone.Set("pod.image.name", "changed"); err != nil {
		t.Fatal(err)
	}
	if v, _ := cfg.Get("pod.image.name"); v != "alpine" {
		t.Errorf("a copy's Set changed the original: %v", v)
	}

	bad := cloneConfig(cfg)
	if err := bad.Set("pod.replicas", 0); err != nil {
		t.Fatal(err)
	}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "pod.replicas") {
		t.Errorf("Validate with a bad module value: %v", err)
	}

	th := newToolhost(t, cfg)
	if _, err := th.Provider(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := podMade.section
	if s == nil || s.Namespace != "ci" || s.Replicas != 3 || s.Token != "t0k3n-0123456789" || strings.Join(s.Labels, ",") != "a,b" || s.Image.Name != "alpine" {
		t.Errorf("New was given %+v", s)
	}
	if podMade.env.Settings.TTL != cfg.Session.TTL || podMade.env.Settings.MemoryBytes != cfg.Sandbox.MemoryMiB<<20 || podMade.env.DataDir != cfg.DataDir ||
		podMade.env.Settings.Pool != 2 {
		t.Errorf("New was given the settings %+v", podMade.env.Settings)
	}
	if err := th.CheckWorkspace(t.TempDir()); err != nil {
		t.Errorf("CheckWorkspace: %v", err)
	}
}

// TestModuleHostPathsAreTrusted: a workspace that contains a path a module's key names
// (the local provider's run_dir here) is refused, like the data dir.
func TestModuleHostPathsAreTrusted(t *testing.T) {
	cfg := testConfig(t)
	ws := t.TempDir()
	if err := cfg.Set("sandbox.run_dir", ws+"/run"); err != nil {
		t.Fatal(err)
	}
	err := cfg.CheckWorkspace(ws, "")
	if err == nil || !strings.Contains(err.Error(), "sandbox.run_dir") {
		t.Fatalf("a workspace holding sandbox.run_dir: %v", err)
	}
	if errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatal("wrong error")
	}
}
