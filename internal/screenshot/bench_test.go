//go:build linux

package screenshot

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Benchmarks (docs/BENCHMARKS.md):
//
//	go test -run '^$' -bench . -benchtime 10x ./internal/screenshot
//
// The page is a small UI page whose script fetches data after 50 ms, so network idle is the
// real wait (Playwright's idle = 500 ms without requests). SCREENSHOT_EXECUTABLE picks the
// browser binary (chromium vs chromium-headless-shell).

func benchConfig(b *testing.B) Config {
	return Config{ExecutablePath: os.Getenv("SCREENSHOT_EXECUTABLE"), Logger: testLogger(b)}
}

func reportMedian(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Milliseconds()), "median-ms")
	b.ReportMetric(float64(ds[len(ds)-1].Milliseconds()), "max-ms")
}

// BenchmarkPairWarm: both viewports, browser reused, network idle.
func BenchmarkPairWarm(b *testing.B) {
	c := newCapturer(b, benchConfig(b))
	base := serve(b, appHandler())
	if _, err := c.CapturePair(b.Context(), base, "/"); err != nil { // start the browser
		b.Fatal(err)
	}
	var ds []time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := c.CapturePair(b.Context(), base, "/")
		if err != nil {
			b.Fatal(err)
		}
		if !p.Desktop.Idle || !p.Mobile.Idle {
			b.Fatal("not idle")
		}
		ds = append(ds, time.Since(t0))
	}
	reportMedian(b, ds)
	c.mu.Lock()
	driver, browser := c.rt.driverPID, c.rt.browserPID
	c.mu.Unlock()
	b.ReportMetric(pssMB(browser, true), "browser-pss-MB")
	b.ReportMetric(pssMB(driver, false), "driver-pss-MB")
}

// pssMB sums the proportional set size of pid (and its descendants) in MB.
func pssMB(pid int, tree bool) float64 {
	pids := []int{pid}
	if tree {
		for _, p := range descendants(pid) {
			pids = append(pids, p.pid)
		}
	}
	var kb int
	for _, p := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/smaps_rollup")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Pss:" {
				n, _ := strconv.Atoi(f[1])
				kb += n
			}
		}
	}
	return float64(kb) / 1024
}

// BenchmarkPairCold: the first pair of a fresh Capturer, including starting the driver and
// the browser (what the first capture after process start costs). Close is not timed.
func BenchmarkPairCold(b *testing.B) {
	base := serve(b, appHandler())
	cfg := benchConfig(b)
	if err := New(cfg).Check(); err != nil {
		b.Skipf("not installed: %v", err)
	}
	var ds []time.Duration
	for b.Loop() {
		t0 := time.Now()
		c := New(cfg)
		p, err := c.CapturePair(b.Context(), base, "/")
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		ds = append(ds, d)
		b.StopTimer()
		if !p.Desktop.Idle || !p.Mobile.Idle {
			b.Fatal("not idle")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = c.Close(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportMedian(b, ds)
}

// BenchmarkWebPvsPNG: bytes of the WebP vs the PNG Chromium returned for the same capture,
// for the test page and a denser one; the timed part is the PNG -> WebP re-encode.
func BenchmarkWebPvsPNG(b *testing.B) {
	c := newCapturer(b, benchConfig(b))
	mux := http.NewServeMux()
	mux.Handle("/", appHandler())
	mux.HandleFunc("/dense", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, densePage)
	})
	mux.HandleFunc("/ui", func(w http.ResponseWriter, r *http.Request) {
		html(w, 200, uiPage)
	})
	base := serve(b, mux)
	keepPNG = true
	defer func() { keepPNG = false }()
	for _, tc := range []struct{ name, path string }{{"simple", "/"}, {"ui", "/ui"}, {"dense", "/dense"}} {
		p, err := c.CapturePair(b.Context(), base, tc.path)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range []Shot{p.Desktop, p.Mobile} {
			b.Run(tc.name+"/"+s.Viewport.Name, func(b *testing.B) {
				png := s.png
				var webp []byte
				var err error
				for b.Loop() {
					if webp, err = pngToWebP(png); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(png)), "png-bytes")
				b.ReportMetric(float64(len(webp)), "webp-bytes")
				b.ReportMetric(float64(len(webp))/float64(len(png)), "webp/png")
			})
		}
	}
}

// densePage is text in three columns and a colourful canvas: the hard case for WebP.
const densePage = `<!doctype html><html><head><meta name="viewport" content="width=device-width">
<style>body{margin:16px;font:14px/1.4 serif;columns:3}canvas{width:100%;height:300px}</style></head><body>
<canvas id=c width=600 height=300></canvas><script>
const g=document.getElementById('c').getContext('2d');
for(let i=0;i<400;i++){g.fillStyle='hsl('+(i*37%360)+',70%,'+(30+i%40)+'%)';g.beginPath();g.arc((i*53)%600,(i*97)%300,5+i%30,0,7);g.fill()}
const words='lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua'.split(' ');
let t='';for(let i=0;i<2500;i++)t+=words[(i*7)%words.length]+(i%13?' ':'. ');
document.body.insertAdjacentHTML('beforeend','<p>'+t+'</p>');
</script></body></html>`

// BenchmarkLaunch: Chromium.Launch and Close alone, the driver already running; the number
// that separates chromium from chromium-headless-shell.
func BenchmarkLaunch(b *testing.B) {
	c := newCapturer(b, benchConfig(b))
	rt, err := c.acquire(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	exe, _ := c.executable()
	var ds []time.Duration
	for b.Loop() {
		t0 := time.Now()
		br, err := rt.pw.Chromium.Launch(c.launchOptions(exe, rt.router))
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
		b.StopTimer()
		if err := br.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportMedian(b, ds)
}

// uiPage is a typical app screen: a header bar, a sidebar, cards with text and buttons.
const uiPage = `<!doctype html><html><head><meta name="viewport" content="width=device-width">
<style>body{margin:0;font:15px/1.5 sans-serif;background:#f4f5f7;color:#222}
header{background:#1f3a60;color:#fff;padding:14px 24px;font-size:20px}
nav{float:left;width:200px;padding:16px}nav a{display:block;padding:6px 0;color:#1f3a60}
main{margin-left:232px;padding:16px;display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:16px}
.card{background:#fff;border-radius:8px;box-shadow:0 1px 3px #0003;padding:16px}
button{background:#2d7ff9;color:#fff;border:0;border-radius:4px;padding:8px 14px}
@media (max-width:600px){nav{display:none}main{margin:0}}</style></head><body>
<header>Acme Dashboard</header><nav><a>Overview</a><a>Projects</a><a>Team</a><a>Billing</a><a>Settings</a></nav>
<main id=m></main><script>
const m=document.getElementById('m');
for(let i=1;i<=9;i++)m.insertAdjacentHTML('beforeend','<div class=card><h3>Project '+i+'</h3><p>'+(i*137%1000)+' visitors this week, '+(i*7%30)+' open issues. Last deploy '+i+' hours ago.</p><button>Open</button></div>');
</script></body></html>`

// BenchmarkPairVsOne is issue 18's "screenshot warm pair / one viewport warm": each
// iteration captures the pair and then the desktop viewport alone, browser running and
// pages warm, interleaved, so the ratio of the medians is of one run.
//
//	go test -run '^$' -bench PairVsOne -benchtime 20x -count 1 ./internal/screenshot
func BenchmarkPairVsOne(b *testing.B) {
	c := newCapturer(b, benchConfig(b))
	base := serve(b, appHandler())
	if _, err := c.CapturePair(b.Context(), base, "/"); err != nil { // start the browser
		b.Fatal(err)
	}
	var pair, one []time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := c.CapturePair(b.Context(), base, "/")
		if err != nil {
			b.Fatal(err)
		}
		if !p.Desktop.Idle || !p.Mobile.Idle {
			b.Fatal("not idle")
		}
		pair = append(pair, time.Since(t0))
		t1 := time.Now()
		s, err := c.Capture(b.Context(), base, "/", Desktop)
		if err != nil {
			b.Fatal(err)
		}
		if !s.Idle {
			b.Fatal("not idle")
		}
		one = append(one, time.Since(t1))
	}
	slices.Sort(pair)
	slices.Sort(one)
	pm, om := pair[len(pair)/2], one[len(one)/2]
	b.ReportMetric(float64(pm.Milliseconds()), "pair-ms")
	b.ReportMetric(float64(om.Milliseconds()), "one-ms")
	b.ReportMetric(float64(pm)/float64(om), "pair/one")
}
