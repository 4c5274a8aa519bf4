//go:build linux

package e2bfake_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/testenv"
)

// client speaks to the fake as a bare HTTP client would, to check the wire.
type client struct {
	t *testing.T
	f *e2bfake.Server
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("not a JSON object: %q", r.body)
	}
	return m
}

func (c client) do(method, path string, body any, hdr map[string]string) reply {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, c.f.URL()+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("X-API-Key", c.f.APIKey())
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// create makes a sandbox (v2) and returns its ID and envd token.
func (c client) create(body map[string]any) (string, string) {
	c.t.Helper()
	if body == nil {
		body = map[string]any{"templateID": "base", "allow_internet_access": false}
	}
	r := c.do("POST", "/v2/sandboxes", body, nil)
	if r.status != 201 {
		c.t.Fatalf("create: %d %s", r.status, r.body)
	}
	m := r.json(c.t)
	return m["sandboxID"].(string), m["envdAccessToken"].(string)
}

// envd calls a sandbox's envd by the routing headers.
func (c client) envd(id, token, method, path string, body []byte, hdr map[string]string) reply {
	c.t.Helper()
	h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token, "X-API-Key": ""}
	for k, v := range hdr {
		h[k] = v
	}
	return c.do(method, path, body, h)
}

func (c client) rpc(id, token, proc string, in any) reply {
	c.t.Helper()
	b, _ := json.Marshal(in)
	return c.envd(id, token, "POST", proc, b, map[string]string{"Content-Type": "application/json"})
}

// run starts a process over a Connect stream and returns its events' JSON and the end.
func (c client) run(id, token string, argv []string, hdr map[string]string) ([]map[string]any, map[string]any) {
	c.t.Helper()
	msg, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": argv[0], "args": argv[1:]}, "stdin": false})
	env := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(env[1:], uint32(len(msg)))
	copy(env[5:], msg)
	h := map[string]string{"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
	for k, v := range hdr {
		h[k] = v
	}
	r := c.envd(id, token, "POST", "/process.Process/Start", env, h)
	if r.status != 200 {
		c.t.Fatalf("start: %d %s", r.status, r.body)
	}
	var events []map[string]any
	b := r.body
	for len(b) >= 5 {
		n := binary.BigEndian.Uint32(b[1:5])
		var m map[string]any
		_ = json.Unmarshal(b[5:5+n], &m)
		if b[0]&2 != 0 {
			return events, m
		}
		events = append(events, m)
		b = b[5+n:]
	}
	c.t.Fatalf("stream without end: %q", r.body)
	return nil, nil
}

func (c client) sh(id, token, script string) string {
	c.t.Helper()
	events, end := c.run(id, token, []string{"/bin/sh", "-c", script}, nil)
	if end["error"] != nil {
		c.t.Fatalf("sh %q: %v", script, end)
	}
	var out strings.Builder
	for _, ev := range events {
		if d, ok := ev["event"].(map[string]any)["data"].(map[string]any); ok {
			if s, ok := d["stdout"].(string); ok {
				var b []byte
				_ = json.Unmarshal([]byte(`"`+s+`"`), &b)
				out.Write(b)
			}
		}
	}
	return out.String()
}

func TestControlPlane(t *testing.T) {
	f := e2bfake.Start(t, e2bfake.Config{})
	c := client{t, f}

	for key, want := range map[string]string{"": "authorization header is missing", "sk-123": "authorization header is malformed", "e2b_nope": "Invalid API key"} {
		r := c.do("GET", "/v2/sandboxes", nil, map[string]string{"X-API-Key": key})
		if r.status != 401 || !strings.Contains(r.json(t)["message"].(string), want) || r.json(t)["code"] != float64(401) {
			t.Errorf("key %q: %d %s", key, r.status, r.body)
		}
	}
	for name, tc := range map[string]struct {
		path   string
		body   map[string]any
		status int
		msg    string
	}{
		"no template":     {"/v2/sandboxes", map[string]any{}, 400, "templateID"},
		"unknown":         {"/v2/sandboxes", map[string]any{"templateID": "nope"}, 404, "template 'nope' not found"},
		"zero timeout":    {"/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 0}, 400, "Timeout must be greater than 0"},
		"over the max":    {"/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 7200}, 400, "Timeout cannot be greater than 1 hours"},
		"bad ID":          {"/sandboxes/not-an-id/timeout", map[string]any{"timeout": 5}, 400, "Invalid sandbox ID"},
		"missing sandbox": {"/sandboxes/aaaaaaaaaaaaaaaaaaaa/timeout", map[string]any{"timeout": 5}, 404, `Sandbox \"aaaaaaaaaaaaaaaaaaaa\" doesn't exist`},
	} {
		r := c.do("POST", tc.path, tc.body, nil)
		if r.status != tc.status || !strings.Contains(string(r.body), tc.msg) {
			t.Errorf("%s: %d %s", name, r.status, r.body)
		}
	}

	// v2 create defaults to 300 s, v1 to 15 s; the answer has no times, GET does.
	id, token := c.create(nil)
	d := c.do("GET", "/sandboxes/"+id, nil, nil).json(t)
	start, _ := time.Parse(time.RFC3339Nano, d["startedAt"].(string))
	end, _ := time.Parse(time.RFC3339Nano, d["endAt"].(string))
	if got := end.Sub(start); got < 299*time.Second || got > 301*time.Second || d["state"] != "running" || d["cpuCount"] != float64(2) {
		t.Errorf("v2 default lifetime %s, detail %v", got, d)
	}
	r := c.do("POST", "/sandboxes", map[string]any{"templateID": "base"}, nil)
	v1 := r.json(t)
	if _, ok := v1["envdAccessToken"]; ok {
		t.Errorf("v1 without secure carries an envd token: %s", r.body)
	}
	d1 := c.do("GET", "/sandboxes/"+v1["sandboxID"].(string), nil, nil).json(t)
	s1, _ := time.Parse(time.RFC3339Nano, d1["startedAt"].(string))
	e1, _ := time.Parse(time.RFC3339Nano, d1["endAt"].(string))
	if got := e1.Sub(s1); got < 14*time.Second || got > 16*time.Second {
		t.Errorf("v1 default lifetime %s", got)
	}

	// Timeout: overwrites (shortens too); connect only extends.
	if r := c.do("POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 60}, nil); r.status != 204 {
		t.Fatalf("timeout: %d %s", r.status, r.body)
	}
	endOf := func() time.Time {
		e, _ := time.Parse(time.RFC3339Nano, c.do("GET", "/sandboxes/"+id, nil, nil).json(t)["endAt"].(string))
		return e
	}
	if left := time.Until(endOf()); left > 61*time.Second || left < 55*time.Second {
		t.Errorf("after timeout 60: %s left", left)
	}
	if r := c.do("POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 10}, nil); r.status != 200 || time.Until(endOf()) < 50*time.Second {
		t.Errorf("connect with a shorter timeout: %d, %s left", r.status, time.Until(endOf()))
	}
	if r := c.do("POST", "/v2/sandboxes/"+id+"/connect", nil, nil); r.status != 200 || time.Until(endOf()) < 290*time.Second {
		t.Errorf("v2 connect without a body: %d, %s left", r.status, time.Until(endOf()))
	}
	if r := c.do("POST", "/sandboxes/"+id+"/connect", []byte(`{}`), nil); r.status != 400 {
		t.Errorf("v1 connect without timeout: %d %s", r.status, r.body)
	}

	// List v2: paging with X-Next-Token, filters, X-Total-Running.
	for range 3 {
		c.create(map[string]any{"templateID": "base", "metadata": map[string]string{"team": "x y"}, "allow_internet_access": false})
	}
	var ids []string
	next := ""
	pages := 0
	for {
		q := "/v2/sandboxes?limit=2"
		if next != "" {
			q += "&nextToken=" + next
		}
		r := c.do("GET", q, nil, nil)
		var page []map[string]any
		_ = json.Unmarshal(r.body, &page)
		for _, s := range page {
			ids = append(ids, s["sandboxID"].(string))
		}
		pages++
		if r.header.Get("X-Total-Running") != "5" {
			t.Errorf("X-Total-Running %q", r.header.Get("X-Total-Running"))
		}
		if next = r.header.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if len(ids) != 5 || pages != 3 {
		t.Errorf("paged list: %d sandboxes in %d pages", len(ids), pages)
	}
	r = c.do("GET", "/v2/sandboxes?metadata="+urlQueryEscape("team=x y"), nil, nil)
	var filtered []map[string]any
	_ = json.Unmarshal(r.body, &filtered)
	if len(filtered) != 3 {
		t.Errorf("metadata filter: %d", len(filtered))
	}
	if r := c.do("GET", "/v2/sandboxes?limit=101", nil, nil); r.status != 400 {
		t.Errorf("limit 101: %d", r.status)
	}

	// Pause and resume (resume restores the files), kill.
	if got := c.sh(id, token, "echo kept > /home/user/a.txt; cat a.txt"); got != "kept\n" {
		t.Fatalf("write before pause: %q", got)
	}
	if r := c.do("POST", "/sandboxes/"+id+"/pause", nil, nil); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	if r := c.do("POST", "/sandboxes/"+id+"/pause", nil, nil); r.status != 409 {
		t.Errorf("pause twice: %d", r.status)
	}
	if d := c.do("GET", "/sandboxes/"+id, nil, nil).json(t); d["state"] != "paused" {
		t.Errorf("state %v", d["state"])
	}
	if r := c.envd(id, token, "GET", "/health", nil, nil); r.status != 502 || !strings.Contains(string(r.body), "The sandbox was not found") {
		t.Errorf("envd of a paused sandbox: %d %s", r.status, r.body)
	}
	if r := c.do("POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 120}, nil); r.status != 201 {
		t.Fatalf("connect to a paused sandbox: %d %s", r.status, r.body)
	}
	if got := c.sh(id, token, "cat /home/user/a.txt"); got != "kept\n" {
		t.Errorf("after resume: %q", got)
	}
	if m := c.do("GET", "/sandboxes/"+id+"/metrics", nil, nil); m.status != 200 || !strings.Contains(string(m.body), `"cpuCount":2`) {
		t.Errorf("metrics: %d %s", m.status, m.body)
	}
	if r := c.do("DELETE", "/sandboxes/"+id, nil, nil); r.status != 204 {
		t.Errorf("kill: %d", r.status)
	}
	if r := c.do("DELETE", "/sandboxes/"+id, nil, nil); r.status != 404 {
		t.Errorf("kill twice: %d", r.status)
	}
	// Faults by HTTP, for clients in other processes.
	if r := c.do("POST", "/_fake/faults", map[string]any{"on": "create", "status": 503, "message": "no capacity"}, nil); r.status != 204 {
		t.Fatalf("inject: %d %s", r.status, r.body)
	}
	if r := c.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, nil); r.status != 503 || !strings.Contains(string(r.body), "no capacity") {
		t.Errorf("injected 503: %d %s", r.status, r.body)
	}
}

func urlQueryEscape(s string) string {
	return strings.NewReplacer(" ", "%2520", "=", "%3D", "&", "%26").Replace(s)
}

// A resume that loses files (E2B issue #884): the state of the first pause comes back,
// and the resume says it succeeded.
func TestResumeLosesFiles(t *testing.T) {
	f := e2bfake.Start(t, e2bfake.Config{})
	c := client{t, f}
	id, token := c.create(nil)
	c.sh(id, token, "echo first > /home/user/a.txt")
	c.do("POST", "/sandboxes/"+id+"/pause", nil, nil)
	c.do("POST", "/v2/sandboxes/"+id+"/connect", nil, nil)
	c.sh(id, token, "echo second > /home/user/b.txt")
	c.do("POST", "/sandboxes/"+id+"/pause", nil, nil)
	if !f.LoseFilesOnResume(id) {
		t.Fatal("no such sandbox")
	}
	if r := c.do("POST", "/v2/sandboxes/"+id+"/connect", nil, nil); r.status != 201 {
		t.Fatalf("resume: %d %s", r.status, r.body)
	}
	if got := c.sh(id, token, "ls /home/user"); got != "a.txt\n" {
		t.Errorf("after the faulty resume the workspace holds %q, want only what the first pause saved", got)
	}
}

// The fake speaks envd, not our agent: no toolhost endpoints or fields; a Connect
// deadline and SendSignal reach only the process started, never its children.
func TestEnvdIsNotOurAgent(t *testing.T) {
	f := e2bfake.Start(t, e2bfake.Config{})
	c := client{t, f}
	id, token := c.create(nil)

	if r := c.envd(id, "wrong", "POST", "/filesystem.Filesystem/Stat", []byte(`{"path":"/"}`), map[string]string{"Content-Type": "application/json"}); r.status != 401 ||
		!strings.Contains(string(r.body), "unauthorized access") {
		t.Errorf("wrong token: %d %s", r.status, r.body)
	}
	for _, p := range []string{"/toolhost/ports", "/toolhost/archive", "/toolhost/dial?port=1"} {
		if r := c.envd(id, token, "GET", p, nil, nil); r.status != 404 {
			t.Errorf("%s: %d (envd has no such endpoint)", p, r.status)
		}
	}
	events, end := c.run(id, token, []string{"sh", "-c", "head -c 100000 /dev/zero"}, map[string]string{"Toolhost-Max-Output-Bytes": "10", "Toolhost-Background": "1"})
	n := 0
	for _, ev := range events {
		b, _ := json.Marshal(ev)
		if strings.Contains(string(b), "toolhost") {
			t.Errorf("an event carries a toolhost field: %s", b)
		}
		if d, ok := ev["event"].(map[string]any)["data"].(map[string]any); ok {
			var raw []byte
			_ = json.Unmarshal([]byte(`"`+d["stdout"].(string)+`"`), &raw)
			n += len(raw)
		}
	}
	if n != 100000 || len(end) != 0 {
		t.Errorf("the toolhost headers changed the stream: %d bytes, end %v", n, end)
	}

	marker := strconv.Itoa(600 + int(time.Now().UnixNano()%300))
	_, end = c.run(id, token, []string{"sh", "-c", "sleep " + marker + " & sleep " + marker}, map[string]string{"Connect-Timeout-Ms": "500"})
	if e, _ := end["error"].(map[string]any); e["code"] != "deadline_exceeded" {
		t.Errorf("past its Connect deadline: end %v", end)
	}
	// Once envd has killed the shell it started, what it killed is known: both sleeps live on.
	shell := "sh -c sleep " + marker + " & sleep " + marker
	if !testenv.Eventually(func() bool { return c.sh(id, token, "ps -eo args | grep -cxF '"+shell+"' || true") == "0\n" }) {
		t.Fatalf("envd never killed the shell past its Connect deadline")
	}
	if got := c.sh(id, token, "ps -eo args | grep -c '^sleep "+marker+"$' || true"); got != "2\n" {
		t.Errorf("after the deadline %q sleeps run, want both (envd kills only the process it started, the shell)", got)
	}

	// A link is described by its target, as envd does.
	c.sh(id, token, "cd /home/user && mkdir d && ln -s d dl && ln -s /etc/passwd pw && ln -s nowhere dangling")
	for name, want := range map[string]string{"dl": `"type":"FILE_TYPE_DIRECTORY"`, "pw": `"symlinkTarget":"/etc/passwd"`, "dangling": `"symlinkTarget":"/home/user/dangling"`} {
		r := c.rpc(id, token, "/filesystem.Filesystem/Stat", map[string]string{"path": name})
		if r.status != 200 || !strings.Contains(string(r.body), want) || !strings.Contains(string(r.body), `"permissions":"Lrwxrwxrwx"`) {
			t.Errorf("stat %s: %d %s (want %s)", name, r.status, r.body, want)
		}
	}
	// /files follows links anywhere, as envd does.
	if r := c.envd(id, token, "GET", "/files?path=pw", nil, nil); r.status != 200 || !bytes.HasPrefix(r.body, []byte("root:")) {
		t.Errorf("read through a link out: %d %.20q", r.status, r.body)
	}
	if r := c.rpc(id, token, "/process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": 99999}, "signal": "SIGNAL_SIGKILL"}); r.status != 404 ||
		!strings.Contains(string(r.body), "process with pid 99999 not found") {
		t.Errorf("signal to no process: %d %s", r.status, r.body)
	}
	if r := c.rpc(id, token, "/filesystem.Filesystem/Stat", map[string]string{"path": "missing"}); r.status != 404 || !strings.Contains(string(r.body), `"code":"not_found"`) {
		t.Errorf("stat of nothing: %d %s", r.status, r.body)
	}
	if r := c.envd(id, token, "POST", "/filesystem.Filesystem/Stat", nil, map[string]string{"Content-Type": "application/json"}); r.status != 400 {
		t.Errorf("empty unary body: %d %s", r.status, r.body)
	}
	fmt.Fprint(io.Discard, id)
}
