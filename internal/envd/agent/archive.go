//go:build linux

package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/envd"
)

func (s *Server) handleArchive(w http.ResponseWriter, r *http.Request) {
	var excludes []string
	if q := r.URL.Query(); q.Has(envd.QueryExcludes) {
		excludes = []string{}
		if err := json.Unmarshal([]byte(q.Get(envd.QueryExcludes)), &excludes); err != nil {
			s.filesError(w, http.StatusBadRequest, envd.BadArg("%s: want a JSON array of names: %v", envd.QueryExcludes, err))
			return
		}
	}
	w.Header().Set("Trailer", envd.TrailerArchive)
	w.Header().Set("Content-Type", envd.ContentGzip)
	w.WriteHeader(http.StatusOK)
	st, err := archive.Pack(r.Context(), w, s.cfg.Workspace, archive.PackOptions{Excludes: excludes})
	res := envd.ArchiveResult{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks, Skipped: st.Skipped,
		Bytes: st.BytesIn, Millis: st.Duration.Milliseconds()}
	for _, sk := range st.Skips[:min(len(st.Skips), envd.MaxTrailerSkips)] {
		if len(sk.Path) > envd.MaxTrailerSkipName {
			sk.Path = sk.Path[:envd.MaxTrailerSkipName] + "..."
		}
		res.Skips = append(res.Skips, sk)
	}
	if err != nil {
		res.Error = err.Error()
	}
	b, _ := json.Marshal(res)
	w.Header().Set(envd.TrailerArchive, string(b))
}

func (s *Server) handleExtract(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	st, err := archive.Extract(r.Context(), r.Body, s.cfg.Workspace, archive.ExtractOptions{})
	if err != nil {
		s.filesError(w, http.StatusBadRequest, fmt.Errorf("extract into the workspace: %w", err))
		return
	}
	w.Header().Set("Content-Type", envd.ContentJSON)
	_ = json.NewEncoder(w).Encode(envd.ArchiveResult{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks,
		Bytes: st.Bytes, Millis: time.Since(start).Milliseconds()})
}
