package screenshot

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// ssrfPaths are plugin-supplied paths that must never lead the browser anywhere but base.
var ssrfPaths = []string{
	"//evil.example/",
	"//evil.example",
	"///evil.example/",
	`\\host`,
	`\\host\share`,
	`/\evil.example/`,
	`/\/evil.example/`,
	"@host",
	"@evil.example/x",
	"evil.example/",
	"http://evil.example/",
	"https://evil.example/",
	"HTTP://evil.example/",
	"http:evil.example",
	"javascript:alert(1)",
	"data:text/html,hi",
	"file:///etc/passwd",
	"ws://evil.example/",
	"/\t/evil.example/",
	"/\n/evil.example/",
	"\t//evil.example/",
	" //evil.example/",
	"/ok\x00",
	"/ok\x7f",
	"/ok\r\n",
	" /x",
	"/x ",
	"?q=1",
	"#frag",
	"x",
	"../x",
	"/" + strings.Repeat("a", MaxPathLen),
	"/\xff\xfe",
}

func TestTargetRefusesSSRFPaths(t *testing.T) {
	base := mustURL(t, "http://127.0.0.1:8080")
	for _, p := range ssrfPaths {
		u, err := Target(base, p)
		if !errors.Is(err, ErrBadPath) {
			t.Errorf("Target(%q) = %v, %v; want ErrBadPath", p, u, err)
			continue
		}
		t.Logf("%q: %v", p, err)
	}
}

func TestTargetJoinsOnOrigin(t *testing.T) {
	for _, tc := range []struct{ base, path, want string }{
		{"http://127.0.0.1:8080", "", "http://127.0.0.1:8080/"},
		{"http://127.0.0.1:8080/", "/", "http://127.0.0.1:8080/"},
		{"http://127.0.0.1:8080", "/app/page?x=1&y=//evil.example#top", "http://127.0.0.1:8080/app/page?x=1&y=//evil.example#top"},
		{"http://127.0.0.1:8080", "/a/../../b", "http://127.0.0.1:8080/b"},
		{"http://127.0.0.1:8080", "/@evil.example", "http://127.0.0.1:8080/@evil.example"},
		{"http://127.0.0.1:8080", "/http://evil.example/", "http://127.0.0.1:8080/http://evil.example/"},
		{"http://127.0.0.1:8080", "/%2F%2Fevil.example", "http://127.0.0.1:8080/%2F%2Fevil.example"},
		{"http://127.0.0.1:8080", "/%5Cevil.example", "http://127.0.0.1:8080/%5Cevil.example"},
		{"http://127.0.0.1:8080", "/päge", "http://127.0.0.1:8080/p%C3%A4ge"},
		{"https://3000-abc.e2b.app", "/x", "https://3000-abc.e2b.app/x"},
		{"http://[::1]:9000", "/x", "http://[::1]:9000/x"},
	} {
		u, err := Target(mustURL(t, tc.base), tc.path)
		if err != nil {
			t.Errorf("Target(%q, %q): %v", tc.base, tc.path, err)
			continue
		}
		if u.String() != tc.want {
			t.Errorf("Target(%q, %q) = %q, want %q", tc.base, tc.path, u, tc.want)
		}
		if originOf(u) != originOf(mustURL(t, tc.base)) {
			t.Errorf("Target(%q, %q) = %q: off origin", tc.base, tc.path, u)
		}
	}
}

func TestTargetRefusesBadBase(t *testing.T) {
	for _, b := range []string{
		"", "127.0.0.1:8080", "ftp://127.0.0.1:21", "http://", "http://u:p@127.0.0.1:8080",
		"http://127.0.0.1:8080/app", "http://127.0.0.1:8080?x", "http://127.0.0.1:8080#f",
		"file:///etc", "javascript:alert(1)",
	} {
		u, _ := url.Parse(b)
		if _, err := Target(u, "/"); !errors.Is(err, ErrBadBase) {
			t.Errorf("Target(base %q) err = %v, want ErrBadBase", b, err)
		}
	}
	if _, err := Target(nil, "/"); !errors.Is(err, ErrBadBase) {
		t.Errorf("Target(nil) err = %v, want ErrBadBase", err)
	}
}

func TestSameOrigin(t *testing.T) {
	o := "http://127.0.0.1:8080"
	for raw, want := range map[string]bool{
		"http://127.0.0.1:8080/x":       true,
		"ws://127.0.0.1:8080/hmr":       true,
		"HTTP://127.0.0.1:8080":         true,
		"http://127.0.0.1:8081/":        false,
		"http://127.0.0.1/":             false,
		"https://127.0.0.1:8080/":       false,
		"http://localhost:8080/":        false,
		"http://u@127.0.0.1:8080/":      false,
		"http://169.254.169.254/latest": false,
		"data:text/plain,x":             false,
	} {
		if got := sameOrigin(raw, o); got != want {
			t.Errorf("sameOrigin(%q) = %v, want %v", raw, got, want)
		}
	}
	if got := originOf(mustURL(t, "https://Example.COM")); got != "https://example.com:443" {
		t.Errorf("originOf = %q", got)
	}
}
