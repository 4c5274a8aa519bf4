// Package pods is a third-party sandbox provider: it registers "pods" with keys of its
// own through the root package alone (a module outside toolhost's cannot import its
// internal packages). It makes no sandbox: Create says which namespace it was given, so a
// tool call shows that the call reached it with its configuration.
package pods

import (
	"context"
	"fmt"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/core/sandbox"
)

// Section is the provider's configuration: the pods.* keys.
type Section struct {
	Namespace string `key:"namespace"`
}

func init() {
	toolhost.RegisterProvider(toolhost.ProviderModule[Section]{
		Name:   "pods",
		Prefix: "pods.",
		Keys: []toolhost.ModuleKey{{Name: "pods.namespace", Flag: "pods-namespace",
			Usage: "namespace of the sandbox pods", Doc: "The namespace the sandbox pods run in."}},
		Config: func() *Section { return &Section{Namespace: "default"} },
		Validate: func(cfg *Section, _ toolhost.ModuleSettings) error {
			if cfg.Namespace == "" {
				return fmt.Errorf("config: pods.namespace: must not be empty")
			}
			return nil
		},
		New: func(_ context.Context, cfg *Section, _ toolhost.ModuleEnv) (sandbox.Provider, error) {
			return provider{namespace: cfg.Namespace}, nil
		},
		Doctor: func(_ context.Context, cfg *Section, _ toolhost.ModuleEnv, alone bool) []toolhost.Check {
			return []toolhost.Check{{Name: "pods", OK: true, Needed: alone, Detail: "namespace " + cfg.Namespace}}
		},
	})
}

type provider struct{ namespace string }

func (p provider) Create(context.Context, sandbox.CreateOptions) (sandbox.Sandbox, error) {
	return nil, fmt.Errorf("pods: no cluster serves namespace %q here", p.namespace)
}
