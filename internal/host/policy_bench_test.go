//go:build linux

package host_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/policy"
)

// compareModes makes, in each iteration, one call in each mode (a session each), the order
// turning, and times them: all see the same machine, whatever else it runs, and their
// medians compare. It reports the median of the first mode (µs-<mode>) and how much more
// the median of each other mode is (%more-<mode>).
func compareModes(b *testing.B, modes []string, sessions map[string]*host.Dispatcher, tool string, inputs []string) {
	ctx := context.Background()
	times := make([][]time.Duration, len(modes))
	i := 0
	for b.Loop() {
		in := json.RawMessage(inputs[i%len(inputs)])
		for k := range modes {
			m := (i + k) % len(modes)
			start := time.Now()
			res, err := sessions[modes[m]].Dispatch(ctx, tool, in)
			times[m] = append(times[m], time.Since(start))
			if err != nil || res.IsError {
				b.Fatal(res, err)
			}
		}
		i++
	}
	base := median(times[0])
	b.ReportMetric(float64(base.Nanoseconds())/1e3, "µs-"+modes[0])
	for m := 1; m < len(modes); m++ {
		b.ReportMetric(100*(float64(median(times[m]))/float64(base)-1), "%more-"+modes[m])
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkPolicyOverhead is BenchmarkHostOverhead's calls with no policy and no audit
// (off) against scoped grants (scopes), the audit written to a file (audit) and both (on),
// in one run: each iteration makes one call in each mode, and the median time of off
// (µs-off) is reported with how much more the median of each other mode is (%more-...). The scopes make every file call pay for its patterns and its link check (a Stat of
// each part of the path), and every call for its audit lines (one per host call, one per
// tool call).
func BenchmarkPolicyOverhead(b *testing.B) {
	scoped := func(spec *host.PluginSpec) {
		switch filepath.Base(spec.Path) {
		case "editfile.wasm":
			spec.Scope.Files = &policy.Files{Read: []string{"**", "!**/.env"}, Write: []string{"docs/**", "src/**"}}
		case "bash.wasm":
			spec.Scope.Exec = &policy.Exec{Programs: []string{"bash"}, MaxTimeout: time.Minute}
		case "grepglob.wasm":
			spec.Scope.Files = &policy.Files{Read: []string{"**", "!**/.env"}}
			spec.Scope.Exec = &policy.Exec{Programs: []string{"grep"}, Env: []string{"LC_ALL"}}
		}
	}
	modes := []string{"off", "scopes", "audit", "on"} // on: scopes and audit
	sessions := map[string]*host.Dispatcher{}
	for _, mode := range modes {
		specs := append([]host.PluginSpec(nil), builtinPlugins(b)...)
		cfg := host.Config{DataDir: e2eDataDir, Plugins: specs}
		if mode == "scopes" || mode == "on" {
			for i := range specs {
				scoped(&specs[i])
			}
		}
		if mode == "audit" || mode == "on" {
			w, err := audit.Create(filepath.Join(b.TempDir(), "audit.jsonl"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { w.Close(context.Background()) })
			cfg.Audit = w
		}
		h, err := host.New(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { h.Close(context.Background()) })
		sb := memsandbox.New()
		sb.Put("docs/f.txt", fourK)
		sb.Put("src/a.go", "package a\n")
		sessions[mode] = h.OpenSession(sb)
	}
	for _, c := range []struct {
		name, tool string
		inputs     []string // taken in turn
	}{
		{"read_file_4K", "read_file", []string{`{"path":"docs/f.txt"}`}},
		{"write_file_small", "write_file", []string{`{"path":"docs/out.txt","content":"hello\n"}`}},
		{"edit_file", "edit_file", []string{
			`{"path":"src/a.go","old_string":"package a","new_string":"package b"}`,
			`{"path":"src/a.go","old_string":"package b","new_string":"package a"}`}},
		{"bash_echo", "bash", []string{`{"command":"echo hi"}`}},
		{"glob", "glob", []string{`{"pattern":"**/*.go"}`}},
	} {
		b.Run("tool="+c.name, func(b *testing.B) { compareModes(b, modes, sessions, c.tool, c.inputs) })
	}
}

// BenchmarkPolicyLocalSandbox is what scoped paths cost in a real (local) sandbox, where
// the link check's look at each part of a path is a round trip to the sandbox's agent:
// read_file and edit_file of src/a.go (two parts) without a policy (off) and with every
// path scoped (scopes).
func BenchmarkPolicyLocalSandbox(b *testing.B) {
	prov := newProvider(b)
	modes := []string{"off", "scopes"}
	sessions := map[string]*host.Dispatcher{}
	for _, mode := range modes {
		specs := append([]host.PluginSpec(nil), builtinPlugins(b)...)
		if mode == "scopes" {
			for i := range specs {
				if filepath.Base(specs[i].Path) == "editfile.wasm" {
					specs[i].Scope.Files = &policy.Files{Read: []string{"**", "!**/.env"}, Write: []string{"src/**"}}
				}
			}
		}
		h, err := host.New(context.Background(), host.Config{DataDir: e2eDataDir, Plugins: specs})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { h.Close(context.Background()) })
		sb, ws := newSandbox(b, prov)
		os.MkdirAll(filepath.Join(ws, "src"), 0o777)
		os.Chmod(filepath.Join(ws, "src"), 0o777)
		os.WriteFile(filepath.Join(ws, "src", "a.go"), []byte("first line\n"+fourK), 0o666)
		os.Chmod(filepath.Join(ws, "src", "a.go"), 0o666)
		sessions[mode] = h.OpenSession(sb)
	}
	b.Run("tool=read_file_4K", func(b *testing.B) {
		compareModes(b, modes, sessions, "read_file", []string{`{"path":"src/a.go"}`})
	})
	b.Run("tool=edit_file", func(b *testing.B) {
		compareModes(b, modes, sessions, "edit_file", []string{
			`{"path":"src/a.go","old_string":"first line","new_string":"first LINE"}`,
			`{"path":"src/a.go","old_string":"first LINE","new_string":"first line"}`})
	})
}
