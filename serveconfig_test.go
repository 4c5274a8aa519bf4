package toolhost

import (
	"strings"
	"testing"
)

// TestFleetConfig: serve.fleet.* and serve.drain refuse what a replica could not run with,
// naming the key.
func TestFleetConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		set  map[string]any
		bad  string // the key the error names; "" when valid
	}{
		{"not in a fleet", nil, ""},
		{"a replica", map[string]any{"serve.fleet.advertise": "http://10.1.2.3:8750", "serve.fleet.secret_file": "/etc/toolhost/fleet", "serve.fleet.peers": []string{"10.0.0.0/8"}}, ""},
		{"handoff", map[string]any{"serve.drain": "handoff"}, ""},
		{"drain unknown", map[string]any{"serve.drain": "kill"}, "serve.drain"},
		{"no secret", map[string]any{"serve.fleet.advertise": "http://10.1.2.3:8750"}, "serve.fleet.secret_file"},
		{"relative secret", map[string]any{"serve.fleet.advertise": "http://10.1.2.3:8750", "serve.fleet.secret_file": "fleet"}, "serve.fleet.secret_file"},
		{"not a URL", map[string]any{"serve.fleet.advertise": "10.1.2.3:8750", "serve.fleet.secret_file": "/s"}, "serve.fleet.advertise"},
		{"a path", map[string]any{"serve.fleet.advertise": "http://10.1.2.3:8750/mcp", "serve.fleet.secret_file": "/s"}, "serve.fleet.advertise"},
		{"credentials", map[string]any{"serve.fleet.advertise": "http://u:p@10.1.2.3:8750", "serve.fleet.secret_file": "/s"}, "serve.fleet.advertise"},
		{"a name", map[string]any{"serve.fleet.advertise": "http://replica-1:8750", "serve.fleet.secret_file": "/s"}, "serve.fleet.advertise"},
		{"unexpanded", map[string]any{"serve.fleet.advertise": "http://$(POD_IP):8750", "serve.fleet.secret_file": "/s"}, "serve.fleet.advertise"},
		{"no port", map[string]any{"serve.fleet.advertise": "http://10.1.2.3", "serve.fleet.secret_file": "/s"}, "serve.fleet.advertise"},
		{"peers not CIDRs", map[string]any{"serve.fleet.advertise": "http://10.1.2.3:8750", "serve.fleet.secret_file": "/s", "serve.fleet.peers": []string{"10.0.0.1"}}, "serve.fleet.peers"},
		{"secret without advertise", map[string]any{"serve.fleet.secret_file": "/s"}, "serve.fleet.advertise"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			for k, v := range c.set {
				if err := cfg.Set(k, v); err != nil {
					t.Fatalf("set %s: %v", k, err)
				}
			}
			err := cfg.Validate()
			switch {
			case c.bad == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.bad != "" && err == nil:
				t.Fatal("accepted")
			case c.bad != "" && !strings.Contains(err.Error(), c.bad):
				t.Fatalf("the error does not name %s: %v", c.bad, err)
			}
		})
	}
}
