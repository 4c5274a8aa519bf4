package host

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

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
