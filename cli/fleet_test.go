//go:build fleet

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/fleet"
	"github.com/toolhost/toolhost/internal/haproxytest"
	"github.com/toolhost/toolhost/internal/store/s3/s3test"
)

// agentReport is what testdata/fleet/agent.cjs prints.
type agentReport struct {
	Project  string   `json:"project"`
	Calls    int      `json:"calls"`
	Retries  int      `json:"retries"`
	Failures []string `json:"failures"`
	// Unknown are the calls whose first request got no answer (the connection cut, or the
	// balancer's 502) or ran on a replica that lost the project meanwhile (its error result
	// says so), and had done its work, as the agent found when the retry failed.
	Unknown []struct {
		At       time.Time `json:"at"`
		Why      string    `json:"why"` // "no answer" or "lost mid-call"
		Call     string    `json:"call"`
		Attempts []string  `json:"attempts"`
	} `json:"unknown"`
	Reconnects     int      `json:"reconnects"`
	Written        int      `json:"written"`
	Missing        []string `json:"missing"`
	ServerStarted  bool     `json:"serverStarted"`
	ServerAnswered bool     `json:"serverAnswered"`
	Fatal          string   `json:"fatal"`
}

// fleetSeconds is how long the fleet test's agents work (FLEET_TEST_SECONDS, default
// 120): the chaos is timed as fractions of it.
func fleetSeconds() int {
	if v, err := strconv.Atoi(os.Getenv("FLEET_TEST_SECONDS")); err == nil && v >= 30 {
		return v
	}
	return 120
}

// TestFleet: three serve replicas sharing an S3 store (the test gateway), sandboxes on
// the E2B fake, behind HAProxy round robin with no affinity; eight agents (the official
// MCP TypeScript client) work for fleetSeconds while the test kills one replica (-9),
// stops another for longer than the lease's ttl and continues it, and rolls all three
// (SIGTERM with serve.drain handoff, start again) one by one. Every call is answered (a
// retry allowed once per failure, and it succeeds; a request in flight on the replica
// killed with -9 gets no answer, and a call the paused replica ends after losing its lease
// says so: when the retry of either fails because the first had done its work, the agent
// finds that done, at the kill or the waking and nowhere else), no file a call reported written is
// missing, the background server each agent started at the beginning still answers at
// the end, and when every agent has ended its session no sandbox is left (the fleet's
// status lists none). That the stopped replica's writes after it woke are refused is
// TestLeaseFencedAfterPause's to prove, with the paused process's own attempts.
func TestFleet(t *testing.T) {
	requireBwrap(t)
	node, clientDir := npmMCPClient(t)
	fake := startE2BFake(t)

	srv, err := s3test.Start(t.TempDir())
	if err != nil {
		t.Fatalf("starting the S3 server: %v", err)
	}
	defer srv.Close()
	bucket, err := srv.NewBucket(t.Context(), "fleet")
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 6 * time.Second
	common, token := fleetEnv(t, fake,
		"AWS_ACCESS_KEY_ID="+s3test.AccessKey, "AWS_SECRET_ACCESS_KEY="+s3test.SecretKey,
		"AWS_REGION="+s3test.Region, "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
		"AWS_EC2_METADATA_DISABLED=true",
		"TOOLHOST_STORE_KIND=s3", "TOOLHOST_STORE_S3_BUCKET="+bucket, "TOOLHOST_STORE_S3_ENDPOINT="+srv.Endpoint,
		"TOOLHOST_STORE_S3_PATH_STYLE=true", "TOOLHOST_SERVE_DRAIN=handoff",
		"TOOLHOST_LEASE_TTL="+ttl.String(), "TOOLHOST_LEASE_RENEW=2s", "TOOLHOST_LOG_LEVEL=debug")
	ports := freePorts(t, 3)
	log := &syncBuilder{done: make(chan struct{})}
	var rs []*fleetReplica
	for i, p := range ports {
		env := cliEnv(t, append(append([]string{}, common...),
			"TOOLHOST_DATA_DIR="+e2bDataDir(t),
			fmt.Sprintf("TOOLHOST_SERVE_FLEET_ADVERTISE=http://127.0.0.1:%d", p))...)
		r := &fleetReplica{t: t, n: i, port: p, env: env, log: log}
		r.start()
		rs = append(rs, r)
	}
	defer func() {
		if t.Failed() {
			// The whole log, for the post-mortem: it outlives the test's directories.
			full := filepath.Join(os.TempDir(), fmt.Sprintf("toolhost-fleet-test-%d.log", os.Getpid()))
			os.WriteFile(full, []byte(log.String()), 0o600)
			t.Logf("replicas' log (the whole of it is in %s):\n%s", full, tail(log.String(), 200))
		}
	}()
	t.Cleanup(func() {
		for _, r := range rs {
			r.signal(syscall.SIGCONT)
			r.signal(syscall.SIGKILL)
			r.wait(time.Minute)
		}
	})
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
	}
	lb := haproxytest.Start(t, addrs...).URL

	secs := fleetSeconds()
	script, err := filepath.Abs("testdata/fleet/agent.cjs")
	if err != nil {
		t.Fatal(err)
	}
	const agents = 8
	reports := make([]agentReport, agents)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+15*time.Minute)
	defer cancel()
	for i := range agents {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, node, script)
			cmd.Env = append(os.Environ(), "TOOLHOST_MCP_CLIENT_DIR="+clientDir, "MCP_URL="+lb+"/mcp", "MCP_TOKEN="+token,
				fmt.Sprintf("PROJECT=agent%d", i), fmt.Sprintf("FLEET_SECONDS=%d", secs), fmt.Sprintf("SERVER_PORT=%d", 8100+i))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if jerr := json.Unmarshal(out, &reports[i]); jerr != nil {
				reports[i].Fatal = fmt.Sprintf("agent %d: %v, %v: %s\n%s", i, err, jerr, out, stderr.String())
			}
		})
	}

	// The chaos, timed as fractions of the agents' work.
	at := func(frac float64) <-chan time.Time {
		return time.After(time.Duration(float64(secs)*frac) * time.Second)
	}
	start := time.Now()
	step := func(what string) {
		t.Logf("%5.1fs (%s): %s", time.Since(start).Seconds(), time.Now().UTC().Format("15:04:05.000"), what)
	}
	<-at(0.15)
	step("kill -9 replica 0")
	killed := time.Now()
	rs[0].signal(syscall.SIGKILL)
	rs[0].wait(time.Minute)
	// A request in flight on the killed replica gets no answer; the agents see it within
	// moments of the kill (their transport's error, HAProxy's 502).
	killSeen := time.Now().Add(10 * time.Second)
	rs[0].start()
	step("replica 0 back")
	<-at(0.15)
	step("SIGSTOP replica 1")
	rs[1].signal(syscall.SIGSTOP)
	time.Sleep(ttl + 4*time.Second)
	rs[1].signal(syscall.SIGCONT)
	woke := time.Now()
	step("SIGCONT replica 1")
	<-at(0.15)
	for _, r := range rs {
		step(fmt.Sprintf("rolling replica %d: SIGTERM", r.n))
		r.signal(syscall.SIGTERM)
		if !r.wait(5 * time.Minute) {
			t.Errorf("replica %d did not exit within 5 minutes of SIGTERM", r.n)
			r.signal(syscall.SIGKILL)
			r.wait(time.Minute)
		}
		r.start()
		step(fmt.Sprintf("replica %d back", r.n))
	}
	wg.Wait()

	for i, rep := range reports {
		if rep.Fatal != "" {
			t.Errorf("agent %d: %s", i, rep.Fatal)
			continue
		}
		t.Logf("agent %d: %d calls, %d retries, %d reconnects, %d files, %d calls of unknown outcome found done",
			i, rep.Calls, rep.Retries, rep.Reconnects, rep.Written, len(rep.Unknown))
		if len(rep.Failures) > 0 {
			t.Errorf("agent %d: %d calls failed after their retry: %v", i, len(rep.Failures), rep.Failures)
		}
		for _, u := range rep.Unknown {
			// Only the kill -9 may leave a request without an answer, and only the paused
			// replica's waking may end a call after its lease (a drain finishes the calls
			// under way and hands the lease over after them).
			from, to, when := killed, killSeen, "the kill -9"
			if u.Why == "lost mid-call" {
				from, to, when = woke, woke.Add(10*time.Second), "the paused replica's waking"
			}
			if u.At.Before(from) || u.At.After(to) {
				t.Errorf("agent %d: a %s (%s) at %s, away from %s (%s): %v", i, u.Call, u.Why,
					u.At.UTC().Format("15:04:05.000"), when, from.UTC().Format("15:04:05.000"), u.Attempts)
			}
		}
		if len(rep.Missing) > 0 {
			t.Errorf("agent %d: files reported written are missing: %v", i, rep.Missing)
		}
		if !rep.ServerStarted || !rep.ServerAnswered {
			t.Errorf("agent %d: background server started %v, answered at the end %v", i, rep.ServerStarted, rep.ServerAnswered)
		}
	}
	// What the fleet did, for the reader of the test's output.
	for _, ev := range []string{"fleet: adopted a session", "took over the sandbox of an earlier session",
		"fleet: session handed over", "lost its project's lease; opening the project again here",
		"took over the project lease of a holder found dead", "took over an expired project lease", "killed an orphan sandbox"} {
		t.Logf("replicas' log: %3d × %q", strings.Count(log.String(), ev), ev)
	}
	// No sandbox is left but those of open sessions: the agents ended theirs (DELETE),
	// so the fleet's status (which lists the E2B sandboxes the fleet started) must come
	// to none.
	// The CLI reads the replicas' configuration, but is no replica: no serve.fleet.* keys.
	var statusEnv []string
	for _, kv := range cliEnv(t, append(append([]string{}, common...), "TOOLHOST_DATA_DIR="+e2bDataDir(t))...) {
		if !strings.HasPrefix(kv, "TOOLHOST_SERVE_FLEET_") {
			statusEnv = append(statusEnv, kv)
		}
	}
	var left []fleet.Sandbox
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		res := runCLI(t, statusEnv, "fleet", "status", "--format", "json")
		var st fleet.Status
		if err := json.Unmarshal([]byte(res.stdout), &st); res.code != 0 || err != nil {
			t.Fatalf("fleet status: exit %d, %v\n%s%s", res.code, err, res.stdout, res.stderr)
		}
		if st.Sandboxes == nil {
			t.Fatalf("fleet status lists no sandboxes on the E2B provider (nil, not empty): %s", res.stdout)
		}
		left = st.Sandboxes
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, sb := range left {
		t.Errorf("sandbox %s of project %s (epoch %d, started by %s) is left after every agent ended its session: %s",
			sb.ID, sb.Project, sb.Epoch, sb.Instance, sb.Verdict)
	}
}
