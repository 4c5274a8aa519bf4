//go:build linux

package e2bfake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Fault is a failure the fake gives instead of (or in the middle of) an answer.
type Fault struct {
	// On names the requests it hits: a control-plane operation ("create", "get", "list",
	// "timeout", "kill", "pause", "resume", "connect", "metrics", "templates"), "api"
	// for any of them; a data-plane one ("exec" for process starts, "files" for /files,
	// "rpc" for the other envd calls, "preview" for other ports), "envd" for any of those.
	On string `json:"on"`
	// Sandbox limits a data-plane or per-sandbox fault to one sandbox.
	Sandbox string `json:"sandbox,omitempty"`
	// Status answers with this HTTP status and E2B's error body (for a sandbox's host,
	// the edge proxy's), with RetryAfter (seconds) as Retry-After when set.
	Status     int    `json:"status,omitempty"`
	Message    string `json:"message,omitempty"`
	RetryAfter int    `json:"retryAfter,omitempty"`
	// Hang never answers: the request waits until its client gives up (or the fake
	// closes, or Hang elapses when it is a positive duration).
	Hang bool          `json:"hang,omitempty"`
	For  time.Duration `json:"for,omitempty"`
	// CutAfter lets this many bytes of the response body through and then drops the
	// connection without ending the stream (data plane).
	CutAfter int `json:"cutAfter,omitempty"`
	// Times is how many requests the fault hits; 0 means 1, -1 means until cleared.
	Times int `json:"times,omitempty"`
}

type activeFault struct {
	Fault
	left int
}

// Inject arms a fault.
func (s *Server) Inject(f Fault) {
	n := f.Times
	if n == 0 {
		n = 1
	}
	s.mu.Lock()
	s.faults = append(s.faults, &activeFault{Fault: f, left: n})
	s.mu.Unlock()
}

// ClearFaults disarms every fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
}

// take returns the first armed fault for op (and sandbox), counting one use.
func (s *Server) take(op, group, id string) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.faults {
		if f.On != op && f.On != group {
			continue
		}
		if f.Sandbox != "" && f.Sandbox != id {
			continue
		}
		if f.left > 0 {
			f.left--
			if f.left == 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
		}
		c := f.Fault
		return &c
	}
	return nil
}

// fault applies an armed fault of a control-plane op; true when it answered.
func (s *Server) fault(w http.ResponseWriter, r *http.Request, op, id string) bool {
	f := s.take(op, "api", id)
	if f == nil || f.CutAfter > 0 {
		return false
	}
	return s.applyFault(w, r, f, func(status int, msg string) { apiError(w, status, msg) })
}

// applyFault hangs or answers with the fault's status; true when it did either.
func (s *Server) applyFault(w http.ResponseWriter, r *http.Request, f *Fault, answer func(int, string)) bool {
	if f.Hang {
		var limit <-chan time.Time
		if f.For > 0 {
			t := time.NewTimer(f.For)
			defer t.Stop()
			limit = t.C
		}
		select {
		case <-r.Context().Done():
		case <-s.closing:
		case <-limit:
		}
		panic(http.ErrAbortHandler) // drop the connection: no answer ever came
	}
	if f.Status == 0 {
		return false
	}
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	msg := f.Message
	if msg == "" {
		msg = http.StatusText(f.Status)
		if f.Status == http.StatusTooManyRequests {
			msg = "Rate limit exceeded"
		}
	}
	answer(f.Status, msg)
	return true
}

// cutWriter passes n bytes of a response body and then aborts the connection.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(b []byte) (int, error) {
	if len(b) > c.left {
		_, _ = c.ResponseWriter.Write(b[:c.left])
		http.NewResponseController(c.ResponseWriter).Flush()
		panic(http.ErrAbortHandler)
	}
	c.left -= len(b)
	return c.ResponseWriter.Write(b)
}

func (c *cutWriter) Flush() { http.NewResponseController(c.ResponseWriter).Flush() }

func (c *cutWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// Vanish kills a sandbox under its clients, with no DELETE (E2B issue #1381: sandboxes
// that disappear before their end time). It reports whether the sandbox existed.
func (s *Server) Vanish(id string) bool {
	sb := s.lookup(id)
	if sb == nil {
		return false
	}
	s.remove(id)
	sb.stop(context.Background())
	return true
}

// LoseFilesOnResume makes the next resume of a sandbox restore the state of its first
// pause, whatever later pauses saved, and report success (E2B issue #884's silent
// rollback).
func (s *Server) LoseFilesOnResume(id string) bool {
	sb := s.lookup(id)
	if sb == nil {
		return false
	}
	sb.mu.Lock()
	sb.loseOnResume = true
	sb.mu.Unlock()
	return true
}

// SandboxIDs lists the sandboxes the fake holds, running or paused.
func (s *Server) SandboxIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id := range s.sandboxes {
		ids = append(ids, id)
	}
	return ids
}

// Created counts the sandboxes the fake created since it started (a resume or a connect
// creates none): a test sees that a client reconnected instead of creating.
func (s *Server) Created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created
}

// admin serves the fault controls for clients in other processes:
//
//	POST   /_fake/faults            a Fault as JSON: armed
//	DELETE /_fake/faults            every fault disarmed
//	POST   /_fake/vanish?id=ID      Vanish
//	POST   /_fake/lose-files?id=ID  LoseFilesOnResume
//
// They take the API key like the API.
func (s *Server) admin(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(w, r) {
		return
	}
	ok := true
	switch {
	case r.URL.Path == "/_fake/faults" && r.Method == http.MethodPost:
		var f Fault
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&f); err != nil || f.On == "" {
			apiError(w, http.StatusBadRequest, fmt.Sprintf("want a fault as JSON with \"on\": %v", err))
			return
		}
		s.Inject(f)
	case r.URL.Path == "/_fake/faults" && r.Method == http.MethodDelete:
		s.ClearFaults()
	case r.URL.Path == "/_fake/vanish" && r.Method == http.MethodPost:
		ok = s.Vanish(r.URL.Query().Get("id"))
	case r.URL.Path == "/_fake/lose-files" && r.Method == http.MethodPost:
		ok = s.LoseFilesOnResume(r.URL.Query().Get("id"))
	default:
		apiError(w, http.StatusNotFound, "Not found")
		return
	}
	if !ok {
		notFound(w, r.URL.Query().Get("id"))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
