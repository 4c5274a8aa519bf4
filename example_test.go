package toolhost_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"log"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	_ "golang.org/x/image/webp" // image.DecodeConfig of the screenshots

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	_ "github.com/toolhost/toolhost/modules/standard" // the built-in providers and stores
)

// A session of an agent: it serves a page from its sandbox, looks at it with
// take_screenshot, and commits a snapshot of its work. This is docs/LIBRARY.md's
// example; it needs bubblewrap, python3 and Chromium (make setup installs them).
func Example() {
	ctx := context.Background()

	// A throwaway store for the example. The data dir, which keeps the plugins' compiled
	// code, is the user's: ~/.local/share/toolhost.
	dir, err := os.MkdirTemp("", "toolhost-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	cfg := toolhost.DefaultConfig() // the built-in plugins, the local sandbox, a directory store
	if err := cfg.Set("store.dir", filepath.Join(dir, "store")); err != nil {
		log.Fatal(err)
	}
	cfg.Project = "example"
	th, err := toolhost.New(ctx, cfg, toolhost.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		log.Fatal(err)
	}
	defer th.Close(ctx)

	// A session wakes the project's workspace from its newest snapshot (none yet).
	sess, err := th.Open(ctx, toolhost.SessionOptions{})
	if err != nil {
		log.Fatal(err) // e.g. bubblewrap is not installed
	}
	defer sess.Close(ctx)

	var names []string
	for _, t := range sess.Tools() { // the tools of a Messages API request
		names = append(names, t.Name)
	}
	fmt.Println("tools:", strings.Join(names, ", "))

	// What the agent's tool_use blocks would ask for.
	call := func(tool, input string) abi.Result {
		res, err := sess.Dispatch(ctx, tool, json.RawMessage(input))
		if err != nil {
			log.Fatal(err) // the host could not run the tool; tool failures are res.IsError
		}
		if res.IsError {
			log.Fatalf("%s: %s", tool, res.Content[0].Text)
		}
		return res
	}
	call("write_file", `{"path": "site/index.html", "content": "<h1>Hello from the sandbox</h1>"}`)
	call("bash", `{"command": "cd site && exec python3 -m http.server 8000", "background": true}`)
	call("bash", `{"command": "for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.1; done; exit 1"}`)

	shot := call("take_screenshot", `{"port": 8000}`)
	var sizes []string
	for i, c := range shot.Content {
		if c.Type != abi.ContentImage {
			continue
		}
		raw, _ := base64.StdEncoding.DecodeString(c.Source.Data)
		img, _, err := image.DecodeConfig(bytes.NewReader(raw))
		if err != nil {
			log.Fatal(err)
		}
		sizes = append(sizes, fmt.Sprintf("%s %dx%d", []string{"desktop", "mobile"}[i], img.Width, img.Height))
	}
	fmt.Printf("screenshot: %d images (%s)\n", len(sizes), strings.Join(sizes, ", "))

	info, err := sess.Commit(ctx, "the first page")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed under", path.Dir(info.Key))

	stored, err := sess.Screenshots(ctx, toolhost.ScreenshotsAgent)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored screenshots:", len(stored))

	// Output:
	// tools: bash, bash_output, bash_kill, exec_command, write_stdin, read_file, write_file, edit_file, apply_patch, grep, glob, take_screenshot
	// screenshot: 2 images (desktop 1280x800, mobile 390x844)
	// committed under projects/example/snapshots
	// stored screenshots: 2
}
