package host

import (
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/policy"
)

// Every host function that acts in the session goes through the policy, which refuses
// an operation it has no class for: a host function added without a class in the
// policy's table fails here, before any plugin meets the refusal. The import list the
// loader accepts says the same.
func TestEveryHostFunctionHasAPolicyClass(t *testing.T) {
	for _, f := range hostFns {
		if _, ok := policy.ClassOf(f.cap, f.op); !ok {
			t.Errorf("host function %s.%s has no class in the policy's operation table (internal/policy classes)", f.cap.Module(), f.op)
		}
	}
	acting := map[string]bool{}
	for _, f := range hostFns {
		acting[f.cap.Module()+"."+f.op] = true
	}
	for module, fns := range hostFunctions {
		c, ok := abi.CapabilityOfModule(module)
		if !ok || c == abi.CapLog {
			continue // the core functions and log act on nothing of the session's
		}
		for _, fn := range fns {
			if !acting[module+"."+fn] {
				t.Errorf("%s.%s is importable but does not run through acting", module, fn)
			}
			if _, ok := policy.ClassOf(c, fn); !ok {
				t.Errorf("%s.%s is importable and has no class in the policy's operation table", module, fn)
			}
		}
	}
}
