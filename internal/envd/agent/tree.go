//go:build linux

package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/tree"
)

// handleTreeList lists the workspace (tree.Walk: never follows a link) in tree's wire form.
func (s *Server) handleTreeList(w http.ResponseWriter, r *http.Request) {
	excludes, err := excludesOf(r)
	if err != nil {
		s.filesError(w, http.StatusBadRequest, err)
		return
	}
	w.Header().Set("Trailer", envd.TrailerTree)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	var buf []byte
	var werr error
	st, err := tree.Walk(r.Context(), s.cfg.Workspace, tree.WalkOptions{Excludes: excludes}, func(e tree.Entry, _ tree.Opener) error {
		buf = tree.AppendEntry(buf, e)
		if len(buf) >= 128<<10 {
			_, werr = w.Write(buf)
			buf = buf[:0]
		}
		return werr
	})
	if err == nil && len(buf) > 0 {
		_, err = w.Write(buf)
	}
	res := envd.TreeResult{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks, Skipped: st.Skipped, Bytes: st.Bytes}
	res.Skips = trailerSkips(st.Skips)
	if err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	w.Header().Set(envd.TrailerTree, string(b))
}

// handleTreeRead answers the contents of the files named in the body.
func (s *Server) handleTreeRead(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, envd.MaxTreeReadBody+1))
	if err != nil || len(body) > envd.MaxTreeReadBody {
		s.filesError(w, http.StatusBadRequest, envd.BadArg("the paths to read: too long or cut short"))
		return
	}
	rd, err := tree.NewReader(s.cfg.Workspace)
	if err != nil {
		s.filesError(w, http.StatusInternalServerError, fmt.Errorf("open the workspace: %w", err))
		return
	}
	defer rd.Close()
	w.Header().Set("Trailer", envd.TrailerTree)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	var res envd.TreeResult
	if err := tree.WriteRead(r.Context(), w, rd, tree.SplitPaths(string(body))); err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	w.Header().Set(envd.TrailerTree, string(b))
}

// excludesOf reads the names a pack or a listing leaves out: absent means the default
// (nil), [] none.
func excludesOf(r *http.Request) ([]string, error) {
	q := r.URL.Query()
	if !q.Has(envd.QueryExcludes) {
		return nil, nil
	}
	excludes := []string{}
	if err := json.Unmarshal([]byte(q.Get(envd.QueryExcludes)), &excludes); err != nil {
		return nil, envd.BadArg("%s: want a JSON array of names: %v", envd.QueryExcludes, err)
	}
	return excludes, nil
}

// trailerSkips are the skips a trailer names: the first envd.MaxTrailerSkips, their
// paths cut to envd.MaxTrailerSkipName bytes.
func trailerSkips(skips []tree.Skip) []tree.Skip {
	var out []tree.Skip
	for _, sk := range skips[:min(len(skips), envd.MaxTrailerSkips)] {
		if len(sk.Path) > envd.MaxTrailerSkipName {
			sk.Path = sk.Path[:envd.MaxTrailerSkipName] + "..."
		}
		out = append(out, sk)
	}
	return out
}
