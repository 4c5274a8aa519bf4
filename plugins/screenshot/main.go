// Command screenshot is the take_screenshot tool: both viewports of a page the agent serves
// inside its sandbox, as images the model can see.
package main

import (
	"errors"
	"strconv"
	"strings"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/pdk"
)

func main() {}

const description = `Takes screenshots of a web page served inside the sandbox (a dev server you started, e.g. with bash and background: true) and returns them as images you can see: desktop (1280x800) and mobile (390x844).

- port: the port the server listens on inside the sandbox. Leave it out to use the dev server this session last saw start.
- path: the page to open, e.g. "/" or "/settings?tab=2" (default "/"). A path only: URLs, other hosts and other ports are refused, and the page can load nothing from other origins.
- The page is shot once the network is idle (at most a few seconds; a page that keeps loading is shot anyway, and the result says so).
- The result ends with a note giving the sizes, where the images are stored, the page's HTTP status when it is an error, blocked requests and JavaScript errors.`

const schema = `{
  "type": "object",
  "properties": {
    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "Port of the server inside the sandbox; default: the dev server last seen starting."},
    "path": {"type": "string", "maxLength": 2048, "description": "Path of the page on that server, starting with /. Default /."}
  },
  "additionalProperties": false
}`

func init() {
	pdk.Plugin("screenshot", "1.0.0")
	pdk.Register(pdk.Tool{Name: "take_screenshot", Description: description, Schema: schema, Run: takeScreenshot})
}

func takeScreenshot(in pdk.Input) abi.Result {
	req := abi.CaptureRequest{Port: in.Int("port", 0), Path: in.String("path")}
	rep, desktop, mobile, err := pdk.Capture(req)
	if err != nil {
		var e *pdk.Error
		msg := err.Error()
		if errors.As(err, &e) {
			msg = strings.TrimPrefix(e.Msg, "capture: ")
		}
		return abi.ErrorText("Error: could not take the screenshot: " + msg)
	}
	return abi.Result{Content: []abi.Content{
		pdk.Image("image/webp", desktop),
		pdk.Image("image/webp", mobile),
		{Type: abi.ContentText, Text: note(rep)},
	}}
}

// note says what the images are, where they are kept and anything odd about the page.
func note(r abi.CaptureReply) string {
	var b strings.Builder
	b.WriteString("Screenshots of " + r.Page + " on port " + strconv.Itoa(r.Port) + ":\n")
	for _, v := range []struct {
		name string
		s    abi.Shot
	}{{"desktop", r.Desktop}, {"mobile", r.Mobile}} {
		b.WriteString("- " + v.name + " " + strconv.Itoa(v.s.Width) + "x" + strconv.Itoa(v.s.Height) + " WebP")
		if v.s.URL != "" {
			b.WriteString(", stored at " + v.s.URL)
		}
		b.WriteString("\n")
	}
	if s := r.Desktop.Status; s >= 400 {
		b.WriteString("The page answered HTTP " + strconv.Itoa(s) + ": the images show its error page.\n")
	}
	if !r.Desktop.Idle || !r.Mobile.Idle {
		b.WriteString("The page was still loading when shot (the network never went idle within the wait).\n")
	}
	if len(r.Blocked) > 0 {
		b.WriteString("Blocked requests to other origins: " + strings.Join(r.Blocked, ", ") + "\n")
	}
	if len(r.PageErrors) > 0 {
		b.WriteString("JavaScript errors on the page: " + strings.Join(r.PageErrors, " | ") + "\n")
	}
	if r.StoreError != "" {
		b.WriteString("The images could not be stored: " + r.StoreError + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}
