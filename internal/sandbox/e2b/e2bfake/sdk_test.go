//go:build linux

package e2bfake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/testnet"
)

// sdkDir finds the official SDK installed by scripts/setup-e2b-sdk.sh. Without node or
// the SDK the test skips, saying so; with CI=true that is a failure.
func sdkDir(t *testing.T) (node, dir string) {
	t.Helper()
	missing := func(format string, a ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: "+format, a...)
		}
		t.Skipf(format, a...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not installed (Node.js >= 20 runs the official E2B SDK): %v", err)
	}
	pkg, err := os.ReadFile("testdata/sdk/package.json")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"e2b": "([0-9.]+)"`).FindSubmatch(pkg)
	if m == nil {
		t.Fatal("testdata/sdk/package.json pins no e2b version")
	}
	version := string(m[1])
	dir = os.Getenv("TOOLHOST_E2B_SDK_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "toolhost", "e2b-sdk", version)
	}
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	if err != nil || !strings.Contains(string(b), `"version": "`+version+`"`) {
		missing("the official E2B SDK %s is not installed in %s (run scripts/setup-e2b-sdk.sh): %v", version, dir, err)
	}
	return node, dir
}

// The official E2B JavaScript SDK (npm e2b, pinned) drives the fake: create, run a
// command, write and read a file, set a timeout, connect from a second client (files and
// background processes there, the end only ever extended), list by metadata (escaping,
// several keys, a missing key, the state filter), kill. Over plain HTTP and over HTTPS
// (the fake's CA given to Node with NODE_EXTRA_CA_CERTS).
func TestOfficialSDK(t *testing.T) {
	node, dir := sdkDir(t)
	script, err := filepath.Abs("testdata/sdk/check.cjs")
	if err != nil {
		t.Fatal(err)
	}
	for _, tls := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[tls], func(t *testing.T) {
			f := e2bfake.Start(t, e2bfake.Config{TLS: tls})
			env := append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TOOLHOST_E2B_SDK_DIR=" + dir}, f.Env()...)
			if tls {
				ca := filepath.Join(t.TempDir(), "ca.pem")
				if err := os.WriteFile(ca, f.CAPEM(), 0o644); err != nil {
					t.Fatal(err)
				}
				env = append(env, "NODE_EXTRA_CA_CERTS="+ca)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, script)
			cmd.Env = env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("the SDK check failed: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
			}
			var got struct {
				SDKVersion    string            `json:"sdkVersion"`
				ID            string            `json:"id"`
				Stdout        string            `json:"stdout"`
				ExitCode      int               `json:"exitCode"`
				Failed        map[string]any    `json:"failed"`
				CommandTO     string            `json:"commandTimeout"`
				TimedOutEnded bool              `json:"timedOutCommandEnded"`
				BackgroundPID int               `json:"backgroundPid"`
				KilledBG      bool              `json:"killedBackground"`
				WrittenPath   string            `json:"writtenPath"`
				Read          string            `json:"read"`
				Catted        string            `json:"catted"`
				Exists        bool              `json:"exists"`
				Listed        []string          `json:"listed"`
				Missing       string            `json:"missing"`
				Extended      int               `json:"extendedSeconds"`
				Metadata      map[string]string `json:"metadata"`
				State         string            `json:"state"`
				Running       bool              `json:"running"`
				InList        bool              `json:"inList"`
				Killed        bool              `json:"killed"`
				RunningAfter  bool              `json:"runningAfterKill"`
				InfoAfterKill string            `json:"infoAfterKill"`
				KilledAgain   bool              `json:"killedAgain"`

				ServerPID        int               `json:"serverPid"`
				ConnectedID      string            `json:"connectedId"`
				ConnectedRead    string            `json:"connectedRead"`
				ConnectedPIDs    []int             `json:"connectedPids"`
				ConnectExtended  int               `json:"connectExtendedSeconds"`
				ShortConnectKept bool              `json:"shortConnectKeptEnd"`
				ListOdd          []string          `json:"listOdd"`
				ListEpoch        []string          `json:"listEpoch"`
				ListBoth         []string          `json:"listBoth"`
				ListWrongEpoch   []string          `json:"listWrongEpoch"`
				ListMissingKey   []string          `json:"listMissingKey"`
				ListRunning      []string          `json:"listRunning"`
				ListPaused       []string          `json:"listPaused"`
				ListedMetadata   map[string]string `json:"listedMetadata"`
				OddID            string            `json:"oddId"`
				ShopID           string            `json:"shopId"`
				ConnectAfterKill string            `json:"connectAfterKill"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("decode the SDK's report %q: %v", out, err)
			}
			t.Logf("SDK %s: %s", got.SDKVersion, out)
			checks := []struct {
				ok   bool
				what string
			}{
				{len(got.ID) == 20, "the sandbox ID has E2B's shape"},
				{got.Stdout == "hello from user in /home/user\n" && got.ExitCode == 0, "the command ran as user in /home/user with the sandbox's env"},
				{got.Failed["error"] == "CommandExitError" && got.Failed["exitCode"] == float64(3) && got.Failed["stderr"] == "oops\n", "a failing command is a CommandExitError with its code and stderr"},
				{got.CommandTO == "TimeoutError", "a command past its timeout is a TimeoutError"},
				{got.TimedOutEnded, "the command the SDK left at its deadline was killed (envd kills at the deadline whether or not the client stayed)"},
				{got.BackgroundPID > 0 && got.KilledBG, "a background command starts and is killed"},
				{got.WrittenPath == "/home/user/dir/hello.txt", "the write reports its path"},
				{got.Read == "written by the official SDK\n" && got.Catted == got.Read && got.Exists, "the file reads back, through the SDK and a command"},
				{strings.Join(got.Listed, ",") == "hello.txt:file", "the directory lists the file"},
				{got.Missing == "FileNotFoundError", "a missing file is a FileNotFoundError"},
				{got.Extended > 400 && got.Extended <= 600, "setTimeout moved endAt (by ~480 s)"},
				{got.Metadata["from"] == "official-sdk" && got.State == "running" && got.Running && got.InList, "getInfo, isRunning and list see the sandbox"},
				{got.Killed && !got.RunningAfter && got.InfoAfterKill == "SandboxNotFoundError" && !got.KilledAgain, "kill ends it: not running, not found, a second kill finds nothing"},
				{got.ConnectedID == got.ID && got.ConnectedRead == got.Read, "Sandbox.connect reaches the sandbox and its files"},
				{got.ServerPID > 0 && slices.Contains(got.ConnectedPIDs, got.ServerPID), "the connected client lists the background process started by the first"},
				{got.ConnectExtended > 200 && got.ConnectExtended <= 400, "a connect with a longer timeout extends the end (by ~300 s)"},
				{got.ShortConnectKept, "a connect with a shorter timeout leaves the end as it was"},
				{got.ConnectAfterKill == "SandboxNotFoundError", "connect to a killed sandbox is a SandboxNotFoundError"},
				{slices.Equal(got.ListOdd, []string{got.OddID}), "a metadata value with &, =, /, +, %, a space and ü filters exactly"},
				{slices.Equal(got.ListEpoch, sorted(got.OddID, got.ShopID)), "one key filters every sandbox that has it"},
				{slices.Equal(got.ListBoth, []string{got.ShopID}), "two keys filter the sandbox that has both"},
				{len(got.ListWrongEpoch) == 0, "a wrong value filters nothing"},
				{len(got.ListMissingKey) == 0, "a key no sandbox has matches none, even with an empty value"},
				{slices.Equal(got.ListRunning, []string{got.ShopID}) && len(got.ListPaused) == 0, "the state filter applies with the metadata filter"},
				{got.ListedMetadata["toolhost_project"] == "shop & co=1/ü+%" && got.ListedMetadata["toolhost_epoch"] == "7", "the listing returns the metadata as given"},
			}
			for _, c := range checks {
				if !c.ok {
					t.Errorf("%s: no", c.what)
				}
			}
			if ids := f.SandboxIDs(); len(ids) != 0 {
				t.Errorf("the fake still holds %v after the SDK killed its sandbox", ids)
			}
		})
	}
}

func sorted(s ...string) []string { return slices.Sorted(slices.Values(s)) }

// The official SDK's network options are honoured by the fake's sandboxes, which reach
// nothing but what they allow, through the egress gateway, on the test's own internet.
func TestOfficialSDKNetwork(t *testing.T) {
	node, dir := sdkDir(t)
	script, err := filepath.Abs("testdata/sdk/network.cjs")
	if err != nil {
		t.Fatal(err)
	}
	n := testnet.New(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) })
	var otherIP netip.Addr
	for _, name := range []string{"registry.test", "other.test"} {
		a, err := n.AddHost(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "other.test" {
			otherIP = a
		}
		l, err := n.Listen("tcp", netip.AddrPortFrom(a, 80).String())
		if err != nil {
			t.Fatal(err)
		}
		n.Serve(l, mux)
	}
	g := egress.New(egress.Config{Resolver: &egress.DNSResolver{Server: n.DNS(), Dialer: n}, Dialer: n, HostAddrs: n.HostAddrs()})
	f := e2bfake.Start(t, e2bfake.Config{Egress: g})
	env := append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TOOLHOST_E2B_SDK_DIR=" + dir, "OTHER_IP=" + otherIP.String()}, f.Env()...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the SDK network check failed: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	type result struct {
		ExitCode int    `json:"exitCode"`
		Stdout   string `json:"stdout"`
	}
	var got map[string]result
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	t.Logf("%s", out)
	ok := func(k, want string) {
		if r := got[k]; r.ExitCode != 0 || r.Stdout != want {
			t.Errorf("%s: %+v; want %q", k, r, want)
		}
	}
	refused := func(k string) {
		if r := got[k]; r.ExitCode == 0 && !strings.Contains(r.Stdout, "egress:") || strings.Contains(r.Stdout, "hello from") {
			t.Errorf("%s: %+v; want a refusal", k, r)
		}
	}
	ok("allowed", "hello from registry.test")
	refused("refused")
	refused("refusedIP")
	ok("afterUpdate", "hello from other.test")
	ok("openAllowed", "hello from registry.test")
	refused("openDenied")
	refused("offline")
}
