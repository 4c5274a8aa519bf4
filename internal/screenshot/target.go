package screenshot

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"unicode/utf8"
)

// MaxPathLen bounds the plugin-supplied path given to [Target].
const MaxPathLen = 2048

// Target joins a plugin-supplied path to the preview origin the host got from the sandbox and
// returns the only kind of URL the capturer navigates to: one on base's origin.
//
// base must be an absolute http or https URL with a host and nothing else of note (no user
// info, query or fragment; its path must be empty or "/"): it is built by the host, never by
// a plugin. An invalid base is the host's bug and is reported with [ErrBadBase].
//
// path is what the plugin asked for. The empty string means "/". Otherwise it must start
// with a single "/" and may carry a query and a fragment. It is refused with [ErrBadPath]
// when it could name another origin or be read differently by the browser than here:
// a scheme ("http://…", "javascript:…"), a network path ("//host/…"), user info ("@host"),
// any backslash (browsers read "\" as "/" in http URLs, so "/\host" is "//host"), any
// control character or space at the ends (browsers strip tab and newline, so "/\t/host"
// is "//host"), invalid UTF-8, or more than MaxPathLen bytes. The joined URL's origin is
// then checked against base's once more.
func Target(base *url.URL, path string) (*url.URL, error) {
	origin, err := baseOrigin(base)
	if err != nil {
		return nil, err
	}
	if err := checkPath(path); err != nil {
		return nil, err
	}
	if path == "" {
		path = "/"
	}
	ref, err := url.Parse(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %q does not parse as a URL path: %w", ErrBadPath, path, err)
	}
	if ref.Scheme != "" || ref.Host != "" || ref.User != nil || ref.Opaque != "" {
		return nil, fmt.Errorf("%w: %q is not a path on the preview origin", ErrBadPath, path)
	}
	u := base.ResolveReference(ref)
	// What the browser gets is the string form; parse it back and compare origins, so that a
	// difference between the parsed and the serialised form cannot move the target.
	back, err := url.Parse(u.String())
	if err != nil || back.User != nil || originOf(back) != origin {
		return nil, fmt.Errorf("%w: %q leads off the preview origin %s", ErrBadPath, path, origin)
	}
	return back, nil
}

func checkPath(path string) error {
	if len(path) > MaxPathLen {
		return fmt.Errorf("%w: path is %d bytes; the limit is %d", ErrBadPath, len(path), MaxPathLen)
	}
	if path == "" {
		return nil
	}
	if !utf8.ValidString(path) {
		return fmt.Errorf("%w: path is not valid UTF-8", ErrBadPath)
	}
	for i := 0; i < len(path); i++ {
		if c := path[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: path %q contains a control character", ErrBadPath, path)
		}
	}
	if strings.ContainsRune(path, '\\') {
		return fmt.Errorf("%w: path %q contains a backslash, which browsers read as /", ErrBadPath, path)
	}
	if strings.TrimSpace(path) != path {
		return fmt.Errorf("%w: path %q starts or ends with white space", ErrBadPath, path)
	}
	if path[0] != '/' {
		return fmt.Errorf("%w: path %q must start with / (a path on the preview server, never a URL or host)", ErrBadPath, path)
	}
	if strings.HasPrefix(path, "//") {
		return fmt.Errorf("%w: path %q starts with //, which names another host", ErrBadPath, path)
	}
	return nil
}

// baseOrigin checks the host-built preview URL and returns its origin.
func baseOrigin(base *url.URL) (string, error) {
	if base == nil {
		return "", fmt.Errorf("%w: nil", ErrBadBase)
	}
	if base.Scheme != "http" && base.Scheme != "https" {
		return "", fmt.Errorf("%w: %q: scheme must be http or https", ErrBadBase, base.Redacted())
	}
	if base.Host == "" || base.Hostname() == "" || base.Opaque != "" {
		return "", fmt.Errorf("%w: %q has no host", ErrBadBase, base.Redacted())
	}
	if base.User != nil || base.RawQuery != "" || base.Fragment != "" || (base.Path != "" && base.Path != "/") {
		return "", fmt.Errorf("%w: %q must be scheme://host:port only", ErrBadBase, base.Redacted())
	}
	return originOf(base), nil
}

// originOf returns scheme://host:port in lower case with the default port made explicit, or
// "" for a URL that is not http(s) or has no host.
func originOf(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	switch scheme {
	case "http", "ws":
		scheme = "http"
		if port == "" {
			port = "80"
		}
	case "https", "wss":
		scheme = "https"
		if port == "" {
			port = "443"
		}
	default:
		return ""
	}
	host := strings.ToLower(u.Hostname())
	if host == "" {
		return ""
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// hostPort returns base's host:port with the default port made explicit.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// sameOrigin reports whether raw is an http(s) URL on origin.
func sameOrigin(raw, origin string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.User == nil && originOf(u) == origin
}
