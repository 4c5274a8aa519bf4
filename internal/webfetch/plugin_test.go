//go:build linux

package webfetch_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/audit"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
	"github.com/toolhost/toolhost/internal/testplugins"
	"github.com/toolhost/toolhost/policy"
)

// TestWebFetchTool: the built-in web_fetch plugin, built from plugins/webfetch, run by
// the real host, fetching from the test's own internet through the gateway.
func TestWebFetchTool(t *testing.T) {
	w := newWeb(t)
	path, err := testplugins.Build("plugins/webfetch")
	if err != nil {
		t.Fatal(err)
	}
	var recs audit.Recorder
	h, err := host.New(context.Background(), host.Config{
		DataDir: testplugins.DataDir(),
		// The call budget is a hang bound: a loaded machine stretches a call's work.
		Plugins: []host.PluginSpec{{Path: path, Grants: []abi.Capability{abi.CapWeb, abi.CapLog},
			Scope: policy.Scope{Web: scope}, CallTimeout: testHang}},
		Fetcher: w.f,
		Audit:   &recs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	s := h.OpenSession(memsandbox.New())
	call := func(input string) abi.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testHang)
		defer cancel()
		res, err := s.Dispatch(ctx, "web_fetch", json.RawMessage(input))
		if err != nil {
			t.Fatalf("web_fetch %s: host error %v", input, err)
		}
		return res
	}

	// An HTML page comes back as Markdown, its links absolute, its scripts gone.
	res := call(`{"url": "https://docs.test/"}`)
	text := testenv.ResultText(res)
	for _, want := range []string{"Fetched https://docs.test/ (HTTP 200, text/html", "# Getting started", "[the install guide](https://docs.test/guide/install)", "- one"} {
		if res.IsError || !strings.Contains(text, want) {
			t.Errorf("the page: is_error=%v, %q lacks %q", res.IsError, text, want)
		}
	}
	if strings.Contains(text, "alert") || strings.Contains(text, "<h1>") {
		t.Errorf("the Markdown kept HTML or a script: %q", text)
	}
	// raw: the HTML itself.
	if text := testenv.ResultText(call(`{"url": "http://docs.test/", "raw": true}`)); !strings.Contains(text, "<h1>Getting started</h1>") {
		t.Errorf("raw: %q", text)
	}
	// A long page is cut, and the next part is there at start_index.
	res = call(`{"url": "http://docs.test/big", "max_length": 1000}`)
	text = testenv.ResultText(res)
	if !strings.Contains(text, "call web_fetch again with start_index 1000") || strings.Count(text, "x") < 1000 {
		t.Errorf("a cut page: %q", text[:min(len(text), 300)])
	}
	if text := testenv.ResultText(call(`{"url": "http://docs.test/big", "max_length": 1000, "start_index": 1000}`)); !strings.Contains(text, "[characters 1000 to 2000 of") {
		t.Errorf("the next part: %q", text[:min(len(text), 300)])
	}
	// Refused: a domain the scope does not name, and a name that resolves to a private
	// address; the model reads the gateway's reason and never the service's answer.
	for _, c := range []struct{ url, want string }{
		{"http://other.test/", "other.test is not an allowed domain (allowed: docs.test, *.docs.test); ask the operator to add it to the web_fetch plugin's web.allow"},
		{"http://ten.docs.test/", "ten.docs.test resolves to 10.0.0.1, a private address"},
		{"http://docs.test/to-metadata", "169.254.169.254"},
	} {
		res := call(`{"url": "` + c.url + `"}`)
		text := testenv.ResultText(res)
		if !res.IsError || !strings.Contains(text, c.want) || strings.Contains(text, internalBody) {
			t.Errorf("%s: is_error=%v %q, want a refusal saying %q", c.url, res.IsError, text, c.want)
		}
	}
	// Not a URL the tool fetches.
	for _, in := range []string{`{"url": "file:///etc/passwd"}`, `{"url": "docs.test"}`, `{"url": "http://user:pw@docs.test/"}`} {
		if res := call(in); !res.IsError {
			t.Errorf("%s: %q", in, testenv.ResultText(res))
		}
	}
	// Every fetch is audited with its URL.
	if !slices.ContainsFunc(recs.Records(), func(r audit.Record) bool {
		return r.Cap == string(abi.CapWeb) && r.Op == abi.FnFetch && r.Key == "https://docs.test/" && r.Status == 0
	}) {
		t.Errorf("no audit record of the fetch of https://docs.test/: %+v", recs.Records())
	}
}
