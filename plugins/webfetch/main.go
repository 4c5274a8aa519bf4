// Command webfetch is the web_fetch tool: a page of the web, as Markdown a model reads.
//
// It is written as a third-party author would write it, with the kit and one capability,
// web: the host fetches through its egress gateway, within this plugin's own web scope
// (plugins[].web in the configuration), and never lets it reach an address the scope did
// not name. The page is hostile input: it is parsed here, in the plugin's memory and
// time, never by the host.
package main

import (
	"errors"
	"mime"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	htmltomarkdown "github.com/JohannesKaufmann/html-to-markdown/v2"
	"github.com/JohannesKaufmann/html-to-markdown/v2/converter"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

func main() {}

const description = `Fetches a web page (GET) and returns it as Markdown: documentation, changelogs, READMEs, API references, issue threads.

- url: an http or https URL. Only the domains this tool's policy allows can be fetched; a refused one is answered with the reason (the domain is not allowed, or it resolves to a private address). Redirects are followed (each is checked again).
- HTML comes back as Markdown (scripts, styles and navigation chrome dropped, links made absolute); plain text, Markdown, JSON and XML as they are. Binary files (images, archives, PDFs) are refused: download those with bash in the sandbox instead.
- max_length: how many characters to return (default 20000, from 100 to 200000). A longer page is cut, and the result says which start_index gives the next part.
- start_index: where to start, for the next part of a long page.
- raw: true returns the HTML itself instead of Markdown.
- The page is fetched from outside the sandbox: files in the sandbox are not reachable, and what you fetch is not saved in the workspace.`

const schema = `{
  "type": "object",
  "properties": {
    "url": {"type": "string", "maxLength": 8192, "description": "The http or https URL to fetch."},
    "max_length": {"type": "integer", "minimum": 100, "maximum": 200000, "default": 20000, "description": "Characters to return; default 20000."},
    "start_index": {"type": "integer", "minimum": 0, "default": 0, "description": "Character to start at (the next part of a long page); default 0."},
    "raw": {"type": "boolean", "default": false, "description": "Return the HTML as it is instead of Markdown."}
  },
  "required": ["url"],
  "additionalProperties": false
}`

// Bounds: the bytes asked of the host (a DOM of more would cost the plugin's memory
// for little a model can read), and the default length of an answer.
const (
	maxFetchBytes    = 2 << 20
	defaultMaxLength = 20000
)

func init() {
	pdk.Plugin("webfetch", "1.0.0")
	pdk.Register(pdk.Tool{Name: "web_fetch", Description: description, Schema: schema, Run: webFetch})
}

func webFetch(in pdk.Input) abi.Result {
	raw := strings.TrimSpace(in.String("url"))
	if raw == "" {
		return abi.ErrorText("Error: url is required: give the http or https URL of the page to fetch.")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return abi.ErrorText("Error: " + strconv.Quote(raw) + " is not an http or https URL. Give a full URL, such as https://example.com/docs/.")
	}
	maxLen := in.Int("max_length", defaultMaxLength)
	if maxLen <= 0 {
		maxLen = defaultMaxLength
	}
	start := max(in.Int("start_index", 0), 0)

	rep, body, err := pdk.Fetch(abi.FetchRequest{URL: raw, MaxBytes: maxFetchBytes})
	if err != nil {
		return abi.ErrorText("Error: could not fetch " + raw + ": " + reason(err, raw))
	}
	mt, params, _ := mime.ParseMediaType(rep.ContentType)
	if mt == "" {
		mt = sniff(body)
	}
	var text string
	switch {
	case isHTML(mt) && !in.Bool("raw"):
		text, err = markdown(body, rep.URL)
		if err != nil {
			return abi.ErrorText("Error: the page at " + rep.URL + " could not be turned into Markdown (" + err.Error() + "); try raw: true.")
		}
	case isHTML(mt) || isText(mt):
		text = toUTF8(body, params["charset"])
	default:
		return abi.ErrorText("Error: " + rep.URL + " is " + mt + ", not a page of text; web_fetch returns text only. Download it with bash in the sandbox if you need the file.")
	}
	return result(rep, text, start, maxLen)
}

// reason is the host's message without the URL it begins with (the result says it).
func reason(err error, raw string) string {
	msg := err.Error()
	var e *pdk.Error
	if errors.As(err, &e) {
		msg = e.Msg
	}
	return strings.TrimPrefix(msg, "fetch "+raw+": ")
}

func isHTML(mt string) bool { return mt == "text/html" || mt == "application/xhtml+xml" }

func isText(mt string) bool {
	switch {
	case strings.HasPrefix(mt, "text/"):
		return true
	case mt == "application/json", mt == "application/xml", mt == "application/javascript",
		mt == "application/x-javascript", mt == "application/yaml", mt == "application/toml",
		strings.HasSuffix(mt, "+json"), strings.HasSuffix(mt, "+xml"):
		return true
	}
	return false
}

// sniff names an answer without a content type: HTML when it looks like it, text when it
// is UTF-8, else binary.
func sniff(b []byte) string {
	head := strings.ToLower(strings.TrimSpace(string(b[:min(len(b), 512)])))
	switch {
	case strings.HasPrefix(head, "<!doctype html"), strings.HasPrefix(head, "<html"):
		return "text/html"
	case utf8.Valid(b[:min(len(b), 4096)]) && !strings.ContainsRune(head, 0):
		return "text/plain"
	}
	return "application/octet-stream"
}

// toUTF8 gives text as valid UTF-8: Latin-1 mapped, other invalid bytes replaced.
func toUTF8(b []byte, charset string) string {
	switch strings.ToLower(charset) {
	case "iso-8859-1", "latin1", "latin-1", "windows-1252":
		var sb strings.Builder
		sb.Grow(len(b))
		for _, c := range b {
			sb.WriteRune(rune(c))
		}
		return sb.String()
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// markdown converts a page, with its links made absolute against where it came from.
func markdown(body []byte, pageURL string) (string, error) {
	domain := ""
	if u, err := url.Parse(pageURL); err == nil {
		domain = u.Scheme + "://" + u.Host
	}
	md, err := htmltomarkdown.ConvertString(strings.ToValidUTF8(string(body), "\uFFFD"), converter.WithDomain(domain))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(md), nil
}

// result is the page's part from start, at most maxLen characters, under a header line.
// It walks the text once and copies only the part it returns: a page of megabytes in a
// plugin's memory is no place for a []rune of it.
func result(rep abi.FetchReply, text string, start, maxLen int) abi.Result {
	total := utf8.RuneCountInString(text)
	var b strings.Builder
	b.WriteString("Fetched " + rep.URL + " (HTTP " + strconv.Itoa(rep.Status))
	if rep.ContentType != "" {
		b.WriteString(", " + rep.ContentType)
	}
	b.WriteString(")\n")
	if rep.Truncated {
		b.WriteString("[the page is larger than " + strconv.Itoa(maxFetchBytes>>20) + " MiB: only its beginning was fetched]\n")
	}
	if start >= total && total > 0 {
		b.WriteString("[start_index " + strconv.Itoa(start) + " is past the end: the page has " + strconv.Itoa(total) + " characters]")
		return abi.ErrorText(b.String())
	}
	end := min(total, start+maxLen)
	if start > 0 {
		b.WriteString("[characters " + strconv.Itoa(start) + " to " + strconv.Itoa(end) + " of " + strconv.Itoa(total) + "]\n")
	}
	b.WriteString("\n")
	if total == 0 {
		b.WriteString("(the page is empty)")
	} else {
		from := byteOffset(text, 0, start)
		b.WriteString(text[from:byteOffset(text, from, end-start)])
	}
	if end < total {
		b.WriteString("\n\n[cut at " + strconv.Itoa(end) + " of " + strconv.Itoa(total) + " characters: call web_fetch again with start_index " + strconv.Itoa(end) + " for more]")
	}
	res := abi.Result{Content: []abi.Content{{Type: abi.ContentText, Text: b.String()}}}
	if rep.Status >= 400 {
		res.IsError = true
	}
	return res
}

// byteOffset is the byte offset n characters after byte offset from in s (valid UTF-8).
func byteOffset(s string, from, n int) int {
	i := from
	for ; n > 0 && i < len(s); n-- {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return i
}
