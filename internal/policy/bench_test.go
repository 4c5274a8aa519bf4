package policy

import (
	"testing"

	"github.com/toolhost/toolhost/abi"
)

// BenchmarkDecide is one decision on a file path of a scoped plugin: what each of its host
// calls pays before the link check.
func BenchmarkDecide(b *testing.B) {
	p, err := Compile(Scope{Files: &Files{Read: []string{"**", "!**/.env"}, Write: []string{"docs/**", "src/**"}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, op := range []string{OpReadVersioned, OpWriteVersioned} {
		b.Run(op, func(b *testing.B) {
			r := Request{Cap: abi.CapSandboxFiles, Op: op, Path: "src/pkg/a.go"}
			b.ReportAllocs()
			for b.Loop() {
				if !p.Decide("editfile", r).Allowed {
					b.Fatal("refused")
				}
			}
		})
	}
}
