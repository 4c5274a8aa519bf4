package host

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// withCustomSection returns wasm with a custom section appended: the same code in
// different bytes.
func withCustomSection(wasm []byte, payload string) []byte {
	name := "toolhost-test"
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, payload...)
	out := append([]byte(nil), wasm...)
	out = append(out, 0) // custom section
	for n := len(body); ; {
		b := byte(n & 0x7f)
		n >>= 7
		if n == 0 {
			out = append(out, b)
			break
		}
		out = append(out, b|0x80)
	}
	return append(out, body...)
}

// A host made after another has loaded the same module instantiates the module the first
// compiled (nothing is decoded again), keeps serving after the first is closed, and acts
// for itself only: its host calls are audited to its own sink. Different bytes are
// never served by another module's code.
func TestHostsShareCompiledModules(t *testing.T) {
	ctx := context.Background()
	wasm, err := os.ReadFile(probePath(t))
	if err != nil {
		t.Fatal(err)
	}
	newHost := func(wasm []byte, sink audit.Sink) *Host {
		h, err := New(ctx, Config{DataDir: dataDir, Audit: sink,
			Plugins: []PluginSpec{{Path: "probe.wasm", Wasm: wasm, Grants: allGrants}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close(ctx) })
		rctx, cancel := context.WithTimeout(ctx, testenv.HangBound)
		defer cancel()
		if err := h.Ready(rctx); err != nil {
			t.Fatal(err)
		}
		return h
	}
	var rec1, rec2 audit.Recorder
	h1 := newHost(wasm, &rec1)
	h2 := newHost(wasm, &rec2)
	if h1.eng != h2.eng {
		t.Fatal("two hosts of one configuration got two runtimes")
	}
	if c1, c2 := h1.plugins[0].opt.compiled, h2.plugins[0].opt.compiled; c1 != c2 {
		t.Fatal("the second host compiled the module again")
	}
	other := newHost(withCustomSection(wasm, "x"), nil)
	if other.plugins[0].opt.compiled == h1.plugins[0].opt.compiled {
		t.Fatal("a module of other bytes got the first module's code")
	}

	h1.Close(ctx)
	sb := memsandbox.New()
	sb.Put("f.txt", "shared runtime\n")
	res, err := dispatch(t, h2.OpenSession(sb), "read", `{"path":"f.txt"}`)
	if err != nil || res.IsError || testenv.ResultText(res) != "shared runtime\n" {
		t.Fatalf("read on the second host after the first closed: %+v, %v", res, err)
	}
	if n := len(rec1.Records()); n != 0 {
		t.Errorf("the first host's audit got %d records of the second host's call", n)
	}
	var sawRead bool
	for _, r := range rec2.Records() {
		sawRead = sawRead || (r.Op == "read" && r.Path == "f.txt")
	}
	if !sawRead {
		t.Errorf("the second host's audit lacks its read: %+v", rec2.Records())
	}
	if res, err := dispatch(t, other.OpenSession(memsandbox.New()), "echo", `{"text":"other"}`); err != nil || testenv.ResultText(res) != "other" {
		t.Fatalf("echo on the host of other bytes: %+v, %v", res, err)
	}
}

// Closing a host ends its calls in flight, as closing its own runtime did, while another
// host on the same runtime keeps serving.
func TestCloseEndsCallsOnSharedRuntime(t *testing.T) {
	ctx := context.Background()
	h1 := newProbeHost(t, func(c *Config) { c.CallTimeout = time.Hour })
	h2 := newProbeHost(t, nil)
	if h1.eng != h2.eng {
		t.Fatal("two hosts of one configuration got two runtimes")
	}
	s1 := h1.OpenSession(memsandbox.New())
	if _, err := dispatch(t, s1, "echo", `{"text":"warm"}`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan error, 1)
	wg.Go(func() {
		_, err := dispatch(t, s1, "spin", `{}`)
		done <- err
	})
	// The spin holds its instance: wait until it is live and not idle.
	if !testenv.Eventually(func() bool {
		p := h1.plugins[0]
		p.pool.mu.Lock()
		defer p.pool.mu.Unlock()
		return len(p.pool.live) > len(p.pool.idle)
	}) {
		t.Fatal("the spinning call never took an instance")
	}
	h1.Close(ctx)
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("spin after Close: %v; want the call ended by Close", err)
		}
	case <-time.After(testenv.HangBound):
		t.Fatal("Close did not end the call in flight")
	}
	wg.Wait()
	if res, err := dispatch(t, h2.OpenSession(memsandbox.New()), "echo", `{"text":"still"}`); err != nil || testenv.ResultText(res) != "still" {
		t.Fatalf("echo on the other host: %+v, %v", res, err)
	}
}

// The process keeps at most maxIdleModules modules no host uses, the least recently used
// going first, and closes a runtime left with neither hosts nor modules.
func TestIdleModulesBounded(t *testing.T) {
	ctx := context.Background()
	// The smallest valid module: compiling it costs nothing.
	empty := []byte("\x00asm\x01\x00\x00\x00")
	cfg := Config{DataDir: t.TempDir(), MemoryLimitMiB: 3} // an engine of its own
	var first *sharedModule
	for i := range maxIdleModules + 3 {
		h, err := New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.compile(ctx, withCustomSection(empty, string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = h.held[0]
		}
		h.Close(ctx)
	}
	engines.mu.Lock()
	var idle int
	for _, e := range engines.m {
		for _, m := range e.mods {
			if m.users == 0 {
				idle++
			}
			if m == first {
				t.Error("the least recently used module was kept")
			}
		}
	}
	engines.mu.Unlock()
	if idle > maxIdleModules {
		t.Fatalf("%d idle modules kept, want at most %d", idle, maxIdleModules)
	}

	// A runtime with no hosts and no modules is closed.
	cfg = Config{DataDir: t.TempDir(), MemoryLimitMiB: 5}
	h, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := h.eng.key
	h.Close(ctx)
	engines.mu.Lock()
	_, kept := engines.m[key]
	engines.mu.Unlock()
	if kept {
		t.Fatal("a runtime with neither hosts nor modules was kept")
	}
}
