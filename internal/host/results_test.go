package host

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/memsandbox"
	"github.com/toolhost/toolhost/internal/testenv"
)

// TestResultForms holds the host to what ABI.md section 5 says of results: is_error and
// content may be left out, invalid UTF-8 becomes U+FFFD, other members are ignored, and a
// result that is not valid JSON, or has a block of an unknown type, is a plugin failure.
func TestResultForms(t *testing.T) {
	s := newProbeHost(t, nil).OpenSession(memsandbox.New())
	call := func(raw string) (string, bool, error) {
		t.Helper()
		res, err := dispatch(t, s, "raw", `{"b64":"`+base64.StdEncoding.EncodeToString([]byte(raw))+`"}`)
		return testenv.ResultText(res), res.IsError, err
	}
	for _, c := range []struct {
		raw, text string
		isErr     bool
	}{
		{`{}`, "", false},
		{`{"content":null}`, "", false},
		{`{"content":[]}`, "", false},
		{`{"content":[{"type":"text","text":"ok"}]}`, "ok", false},
		{`{"content":[{"type":"text","text":"no"}],"is_error":true,"extra":{"x":1}}`, "no", true},
		{"{\"content\":[{\"type\":\"text\",\"text\":\"a\xffb\"}]}", "a\uFFFDb", false},
		{"\x00thr1\x00t\x03\x00\x00\x00a\xffb", "a\uFFFDb", false},
	} {
		got, isErr, err := call(c.raw)
		if err != nil || got != c.text || isErr != c.isErr {
			t.Errorf("result %q: text %q, is_error %v, err %v; want %q, %v", c.raw, got, isErr, err, c.text, c.isErr)
		}
	}
	for _, raw := range []string{`not json`, `{"content":[{"type":"video"}]}`, `{"content":[{"type":"text","text":"x","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}`, "\x00thr1\x00q"} {
		if _, _, err := call(raw); !errors.Is(err, ErrPluginFailed) {
			t.Errorf("result %q: err %v, want a plugin failure", raw, err)
		}
	}
	// The instance that gave a bad result still serves.
	if got, _, err := call(`{"content":[{"type":"text","text":"still here"}]}`); err != nil || !strings.Contains(got, "still here") {
		t.Errorf("after bad results: %q, %v", got, err)
	}
}

// TestStructuredResults: a plugin's structured result is untrusted. It reaches the caller
// only from a tool that declares an output schema, only on a result that is not an error,
// and only when it matches the schema; a tool with a schema that gives none, or one that
// does not match, gets an error result that keeps its text and says why. Secrets are
// taken out of it as out of the text, whatever escapes the plugin wrote them with.
func TestStructuredResults(t *testing.T) {
	const secret = "s3cr3t-value-123"
	h := newProbeHost(t, func(c *Config) { c.Plugins[0].Secrets = map[string]string{"API_TOKEN": secret} })
	s := h.OpenSession(memsandbox.New())
	call := func(tool, raw string) abi.Result {
		t.Helper()
		res, err := dispatch(t, s, tool, `{"b64":"`+base64.StdEncoding.EncodeToString([]byte(raw))+`"}`)
		if err != nil {
			t.Fatalf("%s %q: %v", tool, raw, err)
		}
		return res
	}
	text := `{"type":"text","text":"the answer"}`
	for _, c := range []struct {
		tool, raw, want string // want: the structured result passed on, "" for none
		isErr           bool
	}{
		{"shaped", `{"content":[` + text + `],"structured_content":{"n":3,"s":"x"}}`, `{"n":3,"s":"x"}`, false},
		{"shaped", "\x00thr1\x00t\x0a\x00\x00\x00the answers\x07\x00\x00\x00{\"n\":4}", `{"n":4}`, false},
		// No schema: nothing says what it means, so it is dropped.
		{"raw", `{"content":[` + text + `],"structured_content":{"n":3}}`, "", false},
		// An error carries none.
		{"shaped", `{"content":[` + text + `],"is_error":true,"structured_content":{"n":3}}`, "", true},
		// Refused: over the maximum, a required member missing, a member the schema does
		// not have, not an object, not JSON, none at all.
		{"shaped", `{"content":[` + text + `],"structured_content":{"n":11}}`, "", true},
		{"shaped", `{"content":[` + text + `],"structured_content":{"s":"x"}}`, "", true},
		{"shaped", `{"content":[` + text + `],"structured_content":{"n":1,"cmd":"rm -rf /"}}`, "", true},
		{"shaped", `{"content":[` + text + `],"structured_content":[1]}`, "", true},
		{"shaped", "\x00thr1\x00t\x0a\x00\x00\x00the answers\x05\x00\x00\x00{\"n\":", "", true},
		{"shaped", `{"content":[` + text + `]}`, "", true},
	} {
		res := call(c.tool, c.raw)
		got := testenv.ResultText(res)
		if string(res.Structured) != c.want || res.IsError != c.isErr || !strings.Contains(got, "the answer") {
			t.Errorf("%s %q: structured %s, is_error %v, text %q; want %s, %v", c.tool, c.raw, res.Structured, res.IsError, got, c.want, c.isErr)
		}
		if c.isErr && !strings.Contains(c.raw, "is_error") && !strings.Contains(got, "structured result was left out") {
			t.Errorf("%s %q: the text does not say why the structure was left out: %q", c.tool, c.raw, got)
		}
	}
	res := call("shaped", `{"content":[`+text+`],"structured_content":{"n":1,"s":"token s3cr3t\u002dvalue-123 and `+secret+`"}}`)
	if strings.Contains(string(res.Structured), "value-123") || !strings.Contains(string(res.Structured), "[secret API_TOKEN] and [secret API_TOKEN]") {
		t.Errorf("the secret is in the structured result: %s", res.Structured)
	}
}
