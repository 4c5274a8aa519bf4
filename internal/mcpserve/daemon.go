package mcpserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/sessionapi"
)

// SessionAPI is the HTTP interface of the held sessions (package sessionapi documents
// it). It has no authentication of its own: it is served only on the session daemon's
// socket, which only its user can reach (package daemon checks every peer).
func (s *Server) SessionAPI() http.Handler {
	started := time.Now().UTC()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/daemon", func(w http.ResponseWriter, r *http.Request) {
		writeAPI(w, http.StatusOK, sessionapi.Info{PID: os.Getpid(), Version: s.opts.Version, Started: started,
			ConfigDigest: s.opts.ConfigDigest, Sessions: len(s.Held()), TakesCalls: s.takesOneShots(), OneShots: s.held.oneShots.Load()})
	})
	mux.HandleFunc("GET /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		writeAPI(w, http.StatusOK, sessionapi.List{Sessions: s.Held()})
	})
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		if d := r.Header.Get(sessionapi.ConfigDigestHeader); d != "" && s.opts.ConfigDigest != "" && d != s.opts.ConfigDigest {
			writeAPIError(w, apiErrorf(http.StatusConflict, "the session daemon runs with another configuration (another store, provider or plugins than this command's): stop its sessions (toolhost session stop --all) and start again"))
			return
		}
		var req sessionapi.StartRequest
		if err := readAPI(r, &req); err != nil {
			writeAPIError(w, err)
			return
		}
		sess, err := s.StartHeld(r.Context(), req.Project, req.Workspace, time.Duration(req.IdleTimeoutMS)*time.Millisecond)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		writeAPI(w, http.StatusCreated, sess)
	})
	mux.HandleFunc("POST /v1/sessions/{id}/calls", func(w http.ResponseWriter, r *http.Request) {
		var req sessionapi.CallRequest
		if err := readAPI(r, &req); err != nil {
			writeAPIError(w, err)
			return
		}
		res, err := s.CallHeld(r.Context(), r.PathValue("id"), req.Tool, req.Input)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		if res.Content == nil {
			res.Content = []abi.Content{}
		}
		writeAPI(w, http.StatusOK, res)
	})
	mux.HandleFunc("POST /v1/sessions/{id}/commit", func(w http.ResponseWriter, r *http.Request) {
		var req sessionapi.CommitRequest
		if err := readAPI(r, &req); err != nil {
			writeAPIError(w, err)
			return
		}
		info, err := s.CommitHeld(r.Context(), r.PathValue("id"), req.Label)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		writeAPI(w, http.StatusOK, sessionapi.Snapshot{Key: info.Key, Bytes: info.Size, Unchanged: info.Unchanged})
	})
	mux.HandleFunc("DELETE /v1/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		info, err := s.StopHeld(r.Context(), r.PathValue("id"))
		if err != nil {
			writeAPIError(w, err)
			return
		}
		writeAPI(w, http.StatusOK, sessionapi.Snapshot{Key: info.Key, Bytes: info.Size, Unchanged: info.Unchanged})
	})
	if s.opts.OneShot != nil {
		mux.HandleFunc("POST /v1/calls", func(w http.ResponseWriter, r *http.Request) {
			res, err := s.oneShot(r.Context(), r)
			if err != nil {
				writeAPIError(w, err)
				return
			}
			writeAPI(w, http.StatusOK, res)
		})
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.held.inflight.Add(1)
		defer func() {
			s.held.last.Store(time.Now().UnixNano())
			s.held.inflight.Add(-1)
		}()
		mux.ServeHTTP(w, r)
	})
}

func readAPI(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	if err := dec.Decode(v); err != nil {
		return apiErrorf(http.StatusBadRequest, "the request does not decode: %v", err)
	}
	return nil
}

func writeAPI(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func writeAPIError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	if ae, ok := errors.AsType[*apiError](err); ok {
		status = ae.status
	} else if errors.Is(err, context.Canceled) {
		status = 499 // the client went away; nobody reads this
	}
	writeAPI(w, status, sessionapi.Error{Error: err.Error()})
}

// ServeDaemon serves the session API on ln (the session daemon's socket) until ctx ends
// or, when exitIdle > 0, nothing has been held, connected or asked for exitIdle; then it
// commits every session and closes every sandbox (Shutdown), bounded by grace.
func (s *Server) ServeDaemon(ctx context.Context, ln net.Listener, exitIdle, grace time.Duration) error {
	hs := &http.Server{Handler: s.SessionAPI(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }() // owned here: ends when hs is shut down below
	s.log.Info("session daemon: serving", "socket", ln.Addr().String(), "exit_idle", exitIdle)
	var tick <-chan time.Time
	if exitIdle > 0 {
		t := time.NewTicker(min(max(exitIdle/4, 100*time.Millisecond), 5*time.Second))
		defer t.Stop()
		tick = t.C
	}
	why := "asked to stop"
loop:
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("serving the session daemon: %w", err)
		case <-ctx.Done():
			break loop
		case <-tick:
			if s.CloseIfIdle(exitIdle) {
				why = "idle"
				break loop
			}
		}
	}
	s.log.Info("session daemon: stopping", "why", why)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	serr := s.Shutdown(sctx)
	hctx, hcancel := context.WithTimeout(sctx, 5*time.Second)
	defer hcancel()
	if err := hs.Shutdown(hctx); err != nil {
		hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		serr = errors.Join(serr, err)
	}
	return serr
}
