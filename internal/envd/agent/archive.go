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
	excludes, err := excludesOf(r)
	if err != nil {
		s.filesError(w, http.StatusBadRequest, err)
		return
	}
	w.Header().Set("Trailer", envd.TrailerArchive)
	w.Header().Set("Content-Type", envd.ContentGzip)
	w.WriteHeader(http.StatusOK)
	st, err := archive.Pack(r.Context(), w, s.cfg.Workspace, archive.PackOptions{Excludes: excludes})
	res := envd.ArchiveResult{Files: st.Files, Dirs: st.Dirs, Symlinks: st.Symlinks, Skipped: st.Skipped,
		Bytes: st.BytesIn, Millis: st.Duration.Milliseconds()}
	res.Skips = trailerSkips(st.Skips)
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
