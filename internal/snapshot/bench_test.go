package snapshot_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	"github.com/toolhost/toolhost/internal/snapshot"
	dirstore "github.com/toolhost/toolhost/internal/store/dir"
)

// The snapshot figures of issue 19 (and 18's restore), in one run on the same tree: a
// source-like workspace of ~150 MB in 20,000 files (chunkedtest.SourceTree), generated once
// per test binary under $TOOLHOST_BENCH_DIR (default the temp dir) and removed at the end.
// Stores are directory stores beside it, so every figure is the format's own cost on this
// machine's disk. Run:
//
//	go test ./internal/snapshot -run '^$' -bench . -benchtime 5x -count 3

var (
	benchOnce sync.Once
	benchRoot string
	benchWS   string
	benchSize int64
	benchErr  error
)

func cleanupBench() {
	if benchRoot != "" {
		os.RemoveAll(benchRoot)
	}
}

func benchTree(b *testing.B) (string, int64) {
	benchOnce.Do(func() {
		benchRoot, benchErr = os.MkdirTemp(os.Getenv("TOOLHOST_BENCH_DIR"), "toolhost-snapshot-bench-")
		if benchErr != nil {
			return
		}
		benchWS = filepath.Join(benchRoot, "ws")
		if benchSize, benchErr = chunkedtest.SourceTree(benchWS, 19_990, 1); benchErr == nil {
			benchErr = chunkedtest.BackdateDir(benchWS)
		}
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchWS, benchSize
}

func benchManager(b *testing.B, dir string) (*snapshot.Manager, store.Store) {
	st, err := dirstore.New(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	m, err := snapshot.New(snapshot.Config{Store: st, Keep: -1, TempDir: benchRoot,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	return m, st
}

func storeBytes(b *testing.B, st store.Store) int64 {
	objs, err := store.ListAll(context.Background(), st, "")
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, o := range objs {
		n += o.Size
	}
	return n
}

// BenchmarkSave: a first save (a fresh store each time), and a save after one file
// changed (the same process, as a session's next commit).
func BenchmarkSave(b *testing.B) {
	ws, total := benchTree(b)
	ctx := context.Background()
	b.Run("first", func(b *testing.B) {
		b.SetBytes(total)
		var stored int64
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			dir := filepath.Join(benchRoot, fmt.Sprintf("store-%d", i))
			m, st := benchManager(b, dir)
			b.StartTimer()
			if _, _, err := m.SaveDir(ctx, "bench", ws); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			stored = storeBytes(b, st)
			os.RemoveAll(dir)
			b.StartTimer()
		}
		b.ReportMetric(float64(stored), "stored-B")
	})
	b.Run("second/chunked", func(b *testing.B) {
		dir := filepath.Join(benchRoot, "store-second")
		defer os.RemoveAll(dir)
		m, st := benchManager(b, dir)
		if _, _, err := m.SaveDir(ctx, "bench", ws); err != nil {
			b.Fatal(err)
		}
		file := filepath.Join(ws, "pkg07", "sub7", "f00007.go")
		orig, err := os.ReadFile(file)
		if err != nil {
			b.Fatal(err)
		}
		defer os.WriteFile(file, orig, 0o644)
		before := storeBytes(b, st)
		n := 0
		var pack, upload time.Duration
		for i := 0; b.Loop(); i++ {
			b.StopTimer()
			os.WriteFile(file, fmt.Appendf(append([]byte(nil), orig...), "// edit %d\n", i), 0o644)
			b.StartTimer()
			info, _, err := m.SaveDir(ctx, "bench", ws)
			if err != nil || info.Unchanged {
				b.Fatalf("%+v %v", info, err)
			}
			n++
			pk, _ := info.Transfer.Phase("pack")
			up, _ := info.Transfer.Phase("upload")
			pack += pk.Duration
			upload += up.Duration
		}
		b.ReportMetric(float64(storeBytes(b, st)-before)/float64(n), "stored-B/op")
		// Where the time went: the walk and the build (pack), the store's writes (upload).
		b.ReportMetric(float64(pack.Milliseconds())/float64(n), "pack-ms/op")
		b.ReportMetric(float64(upload.Milliseconds())/float64(n), "upload-ms/op")
	})
	// The walk alone (one fstatat per entry, the listing a save without a change journal
	// makes first): the floor of second/chunked.
	b.Run("second/walk", func(b *testing.B) {
		src := chunked.DirSource{Dir: ws}
		for b.Loop() {
			if _, _, err := src.List(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRestore: the same tree restored from a chunked snapshot, from a tar.gz snapshot
// (as older versions stored them), and by GNU tar xzf from that tar.gz, each into a fresh
// directory.
func BenchmarkRestore(b *testing.B) {
	ws, total := benchTree(b)
	ctx := context.Background()
	type snap struct {
		m   *snapshot.Manager
		key string
	}
	snaps := map[string]snap{}
	dir := filepath.Join(benchRoot, "store-restore")
	defer os.RemoveAll(dir)
	m, st := benchManager(b, dir)
	info, _, err := m.SaveDir(ctx, "bench", ws)
	if err != nil {
		b.Fatal(err)
	}
	snaps[snapshot.FormatChunked] = snap{m, info.Key}
	var arc bytes.Buffer
	if _, err := archive.Pack(ctx, &arc, ws, archive.PackOptions{}); err != nil {
		b.Fatal(err)
	}
	old := putTarGz(b, st, "old", time.Now(), arc.Bytes())
	snaps[snapshot.FormatTarGz] = snap{m, old.Key}
	tgz := filepath.Join(dir, "data", filepath.FromSlash(old.Key))
	dst := filepath.Join(benchRoot, "restored")
	defer os.RemoveAll(dst)
	for _, format := range []string{snapshot.FormatChunked, snapshot.FormatTarGz} {
		b.Run(format, func(b *testing.B) {
			b.SetBytes(total)
			s := snaps[format]
			for b.Loop() {
				b.StopTimer()
				os.RemoveAll(dst)
				b.StartTimer()
				project, _, _ := snapshot.ParseKey(s.key)
				if _, _, err := s.m.RestoreDirKey(ctx, project, s.key, dst, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("tar-xzf", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			b.StopTimer()
			os.RemoveAll(dst)
			os.Mkdir(dst, 0o755)
			b.StartTimer()
			if out, err := exec.Command("tar", "xzf", tgz, "-C", dst).CombinedOutput(); err != nil {
				b.Fatalf("tar xzf: %v %s", err, out)
			}
		}
	})
}

// BenchmarkTenCommits: the bytes a scripted session's ten commits store (each edits five
// files and adds one), against what ten tar.gz archives of the workspace (the storage of
// older versions) took. One pass; the figures are the metrics.
func BenchmarkTenCommits(b *testing.B) {
	src, _ := benchTree(b)
	ctx := context.Background()
	ws := filepath.Join(benchRoot, "ws-ten")
	if out, err := exec.Command("cp", "-a", src, ws).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v %s", err, out)
	}
	defer os.RemoveAll(ws)
	dir := filepath.Join(benchRoot, "store-ten")
	defer os.RemoveAll(dir)
	m, st := benchManager(b, dir)
	var tgz int64
	for c := range 10 {
		for k := range 5 {
			i := (c*5 + k) * 397 % 19_990
			f := filepath.Join(ws, fmt.Sprintf("pkg%02d", i%60), fmt.Sprintf("sub%d", i%9), fmt.Sprintf("f%05d.go", i))
			fh, err := os.OpenFile(f, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(fh, "// commit %d\n", c)
			fh.Close()
		}
		os.WriteFile(filepath.Join(ws, fmt.Sprintf("new%d.go", c)), []byte("package main\n"), 0o644)
		if _, _, err := m.SaveDir(ctx, "bench", ws); err != nil {
			b.Fatal(err)
		}
		st, err := archive.Pack(ctx, io.Discard, ws, archive.PackOptions{})
		if err != nil {
			b.Fatal(err)
		}
		tgz += st.BytesOut
	}
	chunkedBytes := float64(storeBytes(b, st))
	for b.Loop() {
	}
	b.ReportMetric(float64(tgz), "tar.gz-B")
	b.ReportMetric(chunkedBytes, "chunked-B")
	b.ReportMetric(chunkedBytes/float64(tgz), "chunked/tar.gz")
}
