package mcpserve

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// What a session's tools stored (a screenshot's images) comes back to the client as a
// resource_link beside the image (toMCP), and resources/read answers it: from the host's
// store, for the session's own project only, never through a path on the host.

// storedTemplate is the resource template of stored objects.
var storedTemplate = &mcp.ResourceTemplate{
	URITemplate: abi.StoreURIPrefix + "{+key}",
	Name:        "stored",
	Title:       "Stored screenshots",
	Description: "The images take_screenshot stored for this session's project, as the resource_link of its result names them.",
	MIMEType:    "image/webp",
}

// maxStoredBytes bounds what one read answers: a screenshot is a few hundred KB.
const maxStoredBytes = 32 << 20

// storedKey is the store key uri names when the session of project may read it: one of
// the project's screenshots, named in clean form. ok is false for anything else.
func storedKey(uri, project string) (key string, ok bool) {
	key, ok = strings.CutPrefix(uri, abi.StoreURIPrefix)
	if !ok || key == "" || path.Clean(key) != key || strings.ContainsAny(key, "\\?#%") {
		return "", false
	}
	for _, kind := range []string{"agent", "auto"} {
		if p := storekeys.Screenshots(project, kind); strings.HasPrefix(key, p) && !strings.Contains(key[len(p):], "/") {
			return key, true
		}
	}
	return "", false
}

// readStored answers resources/read of a stored object of b's project.
func (b *binding) readStored(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	key, ok := storedKey(uri, b.project)
	if !ok {
		// Another project's, or not a stored screenshot: the same answer as a missing one,
		// so a client learns nothing of what else the store holds.
		return nil, mcp.ResourceNotFoundError(uri)
	}
	rc, info, err := b.srv.th.Storage().Store().Get(ctx, key)
	if err != nil {
		b.srv.log.Debug("mcp: reading a stored object", "key", key, "err", err)
		return nil, mcp.ResourceNotFoundError(uri)
	}
	defer rc.Close()
	if info.Size > maxStoredBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a read answers", uri, info.Size, maxStoredBytes)
	}
	data, err := io.ReadAll(io.LimitReader(rc, maxStoredBytes+1))
	if err != nil {
		b.srv.log.Warn("mcp: reading a stored object", "key", key, "err", err)
		return nil, fmt.Errorf("%s could not be read from the store; try again", uri)
	}
	if len(data) > maxStoredBytes {
		return nil, fmt.Errorf("%s is more than the %d bytes a read answers", uri, maxStoredBytes)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "image/webp", Blob: data}}}, nil
}
