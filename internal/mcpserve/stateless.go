package mcpserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The MCP revision 2026-07-28 is stateless over HTTP: no handshake, no Mcp-Session-Id;
// every request stands alone, and state that spans calls travels as explicit handles the
// server mints and the model passes back as tool arguments (SEP-2567). Requests of that
// revision (the MCP-Protocol-Version header says it) go to a stateless handler whose
// tools are the same, each with one more optional argument, "session":
//
//   - session_start opens a session (a sandbox woken from the project's newest snapshot)
//     and answers its handle; session_end commits and closes one.
//   - A call that names a session runs there; one that names none runs in the default
//     session of its token and project, opened on its first call, so a client that
//     ignores handles still works in one workspace.
//
// Those sessions are held sessions (held.go), owned by the token that opened them: a
// handle of another token's session is "no session". They end at session_end, after
// IdleTimeout without a call, or at Shutdown, committed each time. Requests of the older
// revisions keep the stateful handler and its one session per MCP session.

// Tools of the stateless revision.
const (
	SessionStartTool = "session_start"
	SessionEndTool   = "session_end"
	sessionArg       = "session"
)

// statelessEra reports whether r speaks the stateless revision (2026-07-28 or later).
func statelessEra(r *http.Request) bool {
	v := r.Header.Get("MCP-Protocol-Version")
	return v >= "2026-07-28"
}

// defaultKey names the default session of a token (its name, or "" without tokens) and
// a project.
type defaultKey struct{ owner, project string }

// ownerOf is who a stateless request acts for: its token's name.
func ownerOf(ti *auth.TokenInfo) string {
	if ti == nil {
		return "http"
	}
	return "token:" + ti.UserID
}

// statelessServer is the one MCP server of every stateless request; its handlers take
// the project and the token from the request.
func (s *Server) statelessServer() *mcp.Server {
	s.statelessOnce.Do(func() {
		ms := mcp.NewServer(&mcp.Implementation{Name: "toolhost", Version: s.opts.Version},
			&mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}})
		ms.AddReceivingMiddleware(s.traceMCP(""))
		for _, t := range s.tools {
			st := *t
			st.InputSchema = withSessionArg(t.InputSchema)
			ms.AddTool(&st, s.statelessHandler(t.Name))
		}
		ms.AddTool(&mcp.Tool{Name: SessionStartTool, Title: "Start a session",
			Description: "Open a new session: a sandbox of its own, woken from the project's newest snapshot. " +
				"Answers its handle; pass it as \"session\" to the other tools to work there. Without a handle, " +
				"tools work in the project's default session, which is enough for one line of work.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)},
			s.sessionStart)
		ms.AddTool(&mcp.Tool{Name: SessionEndTool, Title: "End a session",
			Description: "End a session: its workspace is saved as the project's newest snapshot and its sandbox closed. " +
				"Sessions also end after a while without calls, saved the same way.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"session":{"type":"string","description":"the handle session_start answered"}},"required":["session"],"additionalProperties":false}`)},
			s.sessionEnd)
		s.stateless = ms
	})
	return s.stateless
}

// withSessionArg adds the optional "session" property to a tool's object schema.
func withSessionArg(schema any) json.RawMessage {
	raw, _ := schema.(json.RawMessage)
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	props, _ := m["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
	}
	props[sessionArg] = map[string]any{"type": "string",
		"description": "the session to work in, a handle session_start answered; omitted: the project's default session"}
	m["properties"] = props
	b, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return b
}

// requestProject is the project the gate chose for a stateless request.
func requestProject(req *mcp.CallToolRequest) string {
	if req.Extra != nil && req.Extra.Header != nil {
		return req.Extra.Header.Get(ProjectHeader)
	}
	return ""
}

func requestOwner(req *mcp.CallToolRequest) string {
	if req.Extra == nil {
		return ownerOf(nil)
	}
	return ownerOf(req.Extra.TokenInfo)
}

// splitSession takes the "session" argument out of a call's arguments.
func splitSession(args json.RawMessage) (string, json.RawMessage, error) {
	if len(args) == 0 || string(args) == "null" {
		return "", json.RawMessage(`{}`), nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil {
		return "", nil, errors.New("the arguments are not a JSON object")
	}
	raw, ok := m[sessionArg]
	if !ok {
		return "", args, nil
	}
	var id string
	if err := json.Unmarshal(raw, &id); err != nil {
		return "", nil, errors.New(`"session" must be a string, a handle session_start answered`)
	}
	delete(m, sessionArg)
	rest, err := json.Marshal(m)
	return id, rest, err
}

// statelessHandler is tool's handler for stateless requests.
func (s *Server) statelessHandler(tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		id, input, err := splitSession(req.Params.Arguments)
		if err != nil {
			return errorResult(err.Error()), nil
		}
		owner, project := requestOwner(req), requestProject(req)
		if id == "" {
			if id, err = s.defaultSession(ctx, owner, project); err != nil {
				return errorResult(err.Error()), nil
			}
		} else if err := s.adoptHandle(ctx, req, id); err != nil {
			return errorResult(err.Error()), nil
		}
		stop := s.reportProgress(ctx, req, tool)
		defer stop()
		res, err := s.callHeld(ctx, owner, id, tool, input)
		if err != nil {
			if ctx.Err() != nil {
				return errorResult(fmt.Sprintf("%s was cancelled", tool)), nil
			}
			return errorResult(err.Error()), nil
		}
		return toMCP(res), nil
	}
}

// defaultSession is the id of owner's default session of project, opened when it has
// none. Two first calls at once open one session.
func (s *Server) defaultSession(ctx context.Context, owner, project string) (string, error) {
	key := defaultKey{owner, project}
	s.held.mu.Lock()
	slot := s.held.defaults[key]
	if slot == nil {
		slot = &defaultSlot{}
		s.held.defaults[key] = slot
	}
	s.held.mu.Unlock()
	slot.mu.Lock() // held while the session opens: a second call waits for it
	defer slot.mu.Unlock()
	if slot.id != "" {
		s.held.mu.Lock()
		h := s.held.byID[slot.id]
		s.held.mu.Unlock()
		if h != nil {
			return slot.id, nil
		}
	}
	sess, err := s.openHeld(ctx, owner, project, "", 0, "", false)
	if err != nil {
		return "", err
	}
	slot.id = sess.ID
	return sess.ID, nil
}

// defaultSlot is a default session being opened, or opened.
type defaultSlot struct {
	mu sync.Mutex
	id string
}

func (s *Server) sessionStart(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	sess, err := s.startHeld(ctx, requestOwner(req), requestProject(req), "", 0)
	if err != nil {
		return errorResult(err.Error()), nil
	}
	msg := fmt.Sprintf("session %s of project %s is ready", sess.ID, sess.Project)
	if sess.WokeFrom != "" {
		msg += ", woken from snapshot " + sess.WokeFrom
	}
	msg += fmt.Sprintf(`; pass "session": %q to the tools to work in it`, sess.ID)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}},
		StructuredContent: map[string]any{"session": sess.ID, "project": sess.Project}}, nil
}

func (s *Server) sessionEnd(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	id, _, err := splitSession(req.Params.Arguments)
	if err != nil || id == "" {
		return errorResult(`session_end takes {"session": "the handle session_start answered"}`), nil
	}
	if err := s.adoptHandle(ctx, req, id); err != nil {
		return errorResult(err.Error()), nil
	}
	info, err := s.stopHeld(ctx, requestOwner(req), id)
	if err != nil {
		return errorResult(strings.TrimSpace(err.Error())), nil
	}
	msg := fmt.Sprintf("session %s ended", id)
	if info.Key != "" {
		msg += "; its work is snapshot " + info.Key
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}}}, nil
}
