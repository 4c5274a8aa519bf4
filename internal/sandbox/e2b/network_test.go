package e2b

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
)

func TestCompileNetwork(t *testing.T) {
	// The default: the registries preset becomes allowOut, and everything else is denied.
	n, err := compileNetwork(sandbox.EgressPolicy{Preset: "registries"})
	if err != nil {
		t.Fatal(err)
	}
	if !n.internet || !slices.Contains(n.allowOut, "registry.npmjs.org") || !slices.Contains(n.allowOut, "files.pythonhosted.org") ||
		!slices.Equal(n.denyOut, []string{"0.0.0.0/0"}) {
		t.Errorf("registries: %+v", n)
	}
	// Nothing allowed: no internet at all.
	n, _ = compileNetwork(sandbox.EgressPolicy{Preset: "none"})
	if n.internet || n.allowOut != nil || n.denyOut != nil {
		t.Errorf("none: %+v", n)
	}
	// What E2B cannot do as the gateway does is left out (never widened) and said.
	n, err = compileNetwork(sandbox.EgressPolicy{Preset: "none",
		Allow: []string{"*.example.test", "git.example.test:22", "api.example.test:443", "198.51.100.0/24", "203.0.113.0/24:*"},
		Deny:  []string{"bad.example.test", "203.0.113.66"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"*.example.test", "api.example.test", "203.0.113.0/24"}
	if !slices.Equal(n.allowOut, want) {
		t.Errorf("allowOut %v; want %v", n.allowOut, want)
	}
	if !slices.Equal(n.denyOut, []string{"0.0.0.0/0", "203.0.113.66/32"}) {
		t.Errorf("denyOut %v", n.denyOut)
	}
	gaps := strings.Join(n.gaps, "\n")
	for _, w := range []string{
		"git.example.test:22 is left out: E2B matches names only on ports 80 and 443",
		"198.51.100.0/24 is left out: E2B allows a CIDR on every port",
		"api.example.test:443 is allowed on both 80 and 443",
		"the deny entry bad.example.test is not refused on E2B",
		"the deny entry 203.0.113.66/32 does not win on E2B",
		"a name that resolves to a private or metadata address is not refused there",
	} {
		if !strings.Contains(gaps, w) {
			t.Errorf("gaps do not say %q:\n%s", w, gaps)
		}
	}
	if _, err := compileNetwork(sandbox.EgressPolicy{Allow: []string{"not a name"}}); err == nil {
		t.Error("a bad entry compiled")
	}
}

// A command's stream cut short is a transport failure, known by its type (whatever its
// text says); an answer of envd is not, even inside a cut stream.
func TestTransportFailureStreamCut(t *testing.T) {
	cut := fmt.Errorf("exec sh: %w", &client.StreamCutError{Missing: "an end event"})
	if !transportFailure(cut) {
		t.Errorf("%v: not a transport failure", cut)
	}
	answered := fmt.Errorf("exec sh: %w", &client.StreamCutError{Missing: "end-of-stream", Err: &envd.Error{Status: 500, Code: envd.CodeInternal}})
	if transportFailure(answered) {
		t.Errorf("%v: an answer of envd taken for a transport failure", answered)
	}
}
