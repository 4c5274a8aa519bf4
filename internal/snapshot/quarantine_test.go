package snapshot_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/chunked"
	"github.com/toolhost/toolhost/internal/chunked/chunkedtest"
	"github.com/toolhost/toolhost/internal/snapshot"
)

// damage is one way a stored object goes bad behind toolhost's back.
type damage struct {
	name string
	do   func(t *testing.T, b backend, key string)
}

// damages: a flipped byte on disk (bit rot: the object's checksum no longer matches), a
// flipped byte with the checksum rewritten to match (a careless copy: only the chunk
// digests can tell), a truncated object, and a vanished one.
var damages = []damage{
	{"bit-rot", func(t *testing.T, b backend, key string) {
		p := b.file(key)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/3] ^= 0x55
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}},
	{"checksum-rewritten", func(t *testing.T, b backend, key string) {
		ctx := tctx(t)
		rc, _, err := b.s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(rc)
		rc.Close()
		data[len(data)/3] ^= 0x55
		sum := sha256.Sum256(data)
		if _, err := b.s.Put(ctx, key, bytes.NewReader(data), store.PutOptions{Size: int64(len(data)),
			Metadata: map[string]string{"sha256": hex.EncodeToString(sum[:])}}); err != nil {
			t.Fatal(err)
		}
	}},
	{"truncated", func(t *testing.T, b backend, key string) {
		fi, err := os.Stat(b.file(key))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(b.file(key), fi.Size()/2); err != nil {
			t.Fatal(err)
		}
	}},
	{"missing", func(t *testing.T, b backend, key string) {
		if err := b.s.Delete(tctx(t), key); err != nil {
			t.Fatal(err)
		}
	}},
}

// newPacks returns the packs in the store that are not in before.
func newPacks(t *testing.T, s store.Store, before []store.ObjectInfo) []string {
	t.Helper()
	after, err := store.ListAll(tctx(t), s, chunked.PrefixPacks)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range after {
		if !slices.ContainsFunc(before, func(b store.ObjectInfo) bool { return b.Key == o.Key }) {
			out = append(out, o.Key)
		}
	}
	return out
}

// TestDamagedPackDoesNotStopSaves is issue 29: one damaged pack in the newest snapshot.
// A wake (a fresh process, as `toolhost call` is) falls back to the older snapshot; the
// save after it must succeed, must not depend on the damaged pack (the file whose chunks
// were there is stored anew), and the damaged snapshot is set aside in the project's
// quarantine, where it is listed with why, and the next wake restores the new save.
func TestDamagedPackDoesNotStopSaves(t *testing.T) {
	for _, dmg := range damages {
		for _, b := range backends(t) {
			t.Run(b.name+"/"+dmg.name, func(t *testing.T) {
				ctx := tctx(t)
				m, clk, _ := chunkedManager(t, b.s)
				ws := filepath.Join(t.TempDir(), "ws")
				chunkedtest.MakeTree(t, ws, 31)
				v1, _, err := m.SaveDir(ctx, "p", ws)
				if err != nil {
					t.Fatal(err)
				}
				before, _ := store.ListAll(ctx, b.s, chunked.PrefixPacks)
				big := make([]byte, 3<<20)
				rand.Read(big)
				os.WriteFile(filepath.Join(ws, "new.bin"), big, 0o644)
				chunkedtest.Backdate(t, ws)
				clk.Add(time.Second)
				v2, _, err := m.SaveDir(ctx, "p", ws)
				if err != nil || v2.Key == v1.Key {
					t.Fatalf("second save: %+v %v", v2, err)
				}
				damaged := newPacks(t, b.s, before)
				if len(damaged) == 0 {
					t.Fatal("the second save stored no pack")
				}
				for _, k := range damaged {
					dmg.do(t, b, k)
				}

				// A fresh process wakes: the damaged snapshot is refused and set aside.
				m2, clk2, logs2 := chunkedManager(t, b.s)
				clk2.Add(time.Minute)
				woke := filepath.Join(t.TempDir(), "woke")
				info, _, err := m2.RestoreDir(ctx, "p", woke, false)
				if err != nil {
					t.Fatalf("wake: %v", err)
				}
				if info.Key != v1.Key || len(info.Refused) != 1 || info.Refused[0].Key != v2.Key {
					t.Fatalf("woke in %s, refused %+v; want %s after refusing %s", info.Key, info.Refused, v1.Key, v2.Key)
				}
				if q := info.Refused[0].Quarantine; !strings.HasPrefix(q, "projects/p/quarantine/") || !strings.HasSuffix(q, chunked.ShortKey(v2.Key)+".snap") {
					t.Errorf("the refused snapshot was not set aside: %+v", info.Refused[0])
				}
				if !strings.Contains(logs2.String(), "set aside") {
					t.Errorf("the log does not say the snapshot was set aside:\n%s", logs2.String())
				}

				// The agent works, and makes the damaged pack's file again, byte for byte.
				os.WriteFile(filepath.Join(woke, "work.txt"), []byte("the agent's work\n"), 0o644)
				os.WriteFile(filepath.Join(woke, "new.bin"), big, 0o644)
				clk2.Add(time.Second)
				v3, _, err := m2.SaveDir(ctx, "p", woke)
				if err != nil {
					t.Fatalf("the save after the wake failed: %v", err)
				}
				if v3.Unchanged || v3.Key <= v2.Key {
					t.Fatalf("the save after the wake: %+v", v3)
				}

				// Another fresh process wakes in the new save, which verifies whole.
				m3, clk3, _ := chunkedManager(t, b.s)
				clk3.Add(2 * time.Minute)
				out := filepath.Join(t.TempDir(), "out")
				info, _, err = m3.RestoreDir(ctx, "p", out, false)
				if err != nil || info.Key != v3.Key || len(info.Refused) != 0 {
					t.Fatalf("the next wake: %s, refused %+v, %v; want %s", info.Key, info.Refused, err, v3.Key)
				}
				if got, _ := os.ReadFile(filepath.Join(out, "work.txt")); string(got) != "the agent's work\n" {
					t.Errorf("work.txt after the next wake: %q", got)
				}
				if got, _ := os.ReadFile(filepath.Join(out, "new.bin")); !bytes.Equal(got, big) {
					t.Error("new.bin after the next wake differs")
				}
				if _, err := m3.Verify(ctx, "p", v3.Key); err != nil {
					t.Errorf("the new save does not verify: %v", err)
				}
				man, err := m3.Repo().Manifest(ctx, v3.Key)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range man.Packs {
					if slices.Contains(damaged, chunked.PackKey(p)) {
						t.Errorf("the new save depends on the damaged pack %s", p)
					}
				}

				// The quarantine lists the damaged snapshot, with when and why; the
				// snapshots do not.
				q, err := m3.Quarantined(ctx, "p")
				if err != nil || len(q) != 1 {
					t.Fatalf("quarantine: %+v %v", q, err)
				}
				if q[0].Snapshot != v2.Key || q[0].Time.IsZero() || q[0].Why == "" ||
					(q[0].Reason != "damaged-pack" && q[0].Reason != "missing-pack") {
					t.Errorf("quarantined %+v", q[0])
				}
				list, _ := m3.List(ctx, "p")
				if slices.ContainsFunc(list, func(i snapshot.Info) bool { return i.Key == v2.Key }) {
					t.Error("the damaged snapshot is still listed among the project's snapshots")
				}
			})
		}
	}
}

// corruptRef flips a byte of one blob of a pack, its stored checksum rewritten to match:
// the pack reads, that blob does not verify, the others do.
func corruptRef(t *testing.T, s store.Store, ref chunked.Ref) {
	t.Helper()
	ctx := tctx(t)
	key := chunked.PackKey(ref.Pack)
	rc, _, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(rc)
	rc.Close()
	data[int(ref.Offset)+int(ref.Stored)/2] ^= 0x55
	sum := sha256.Sum256(data)
	if _, err := s.Put(ctx, key, bytes.NewReader(data), store.PutOptions{Size: int64(len(data)),
		Metadata: map[string]string{"sha256": hex.EncodeToString(sum[:])}}); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedPackSharedBySnapshots: a pack three snapshots need (a large file none of
// them changed) rots. The wake sets aside all three, trying only the newest (the others
// are examined, not restored), and wakes in the one before them; the damage is recorded,
// so the save after it stores the file anew, and the next wake is in that save.
func TestDamagedPackSharedBySnapshots(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := tctx(t)
			m, clk, _ := chunkedManager(t, b.s)
			ws := filepath.Join(t.TempDir(), "ws")
			os.MkdirAll(ws, 0o755)
			save := func(name, body string) snapshot.Info {
				t.Helper()
				if name != "" {
					os.WriteFile(filepath.Join(ws, name), []byte(body), 0o644)
				}
				chunkedtest.Backdate(t, ws)
				clk.Add(time.Second)
				info, _, err := m.SaveDir(ctx, "p", ws)
				if err != nil || info.Unchanged {
					t.Fatalf("save %s: %+v %v", name, info, err)
				}
				return info
			}
			v0 := save("small.txt", "small\n")
			before, _ := store.ListAll(ctx, b.s, chunked.PrefixPacks)
			big := make([]byte, 3<<20)
			rand.Read(big)
			v1 := save("big.bin", string(big))
			bigPacks := newPacks(t, b.s, before)
			v2 := save("x.txt", "x\n")
			v3 := save("y.txt", "y\n")
			for _, k := range bigPacks {
				damages[0].do(t, b, k) // bit rot
			}

			m2, clk2, _ := chunkedManager(t, b.s)
			clk2.Add(time.Minute)
			woke := filepath.Join(t.TempDir(), "woke")
			info, _, err := m2.RestoreDir(ctx, "p", woke, false)
			if err != nil || info.Key != v0.Key {
				t.Fatalf("woke in %s (%v), want %s", info.Key, err, v0.Key)
			}
			var refused []string
			for i, r := range info.Refused {
				if r.Quarantine == "" {
					t.Errorf("%s was refused and not set aside: %s", r.Key, r.Reason)
				}
				// The first was tried; the others were set aside with it, examined (their
				// listings read, never their files): not tried.
				if tried := strings.HasPrefix(r.Reason, "it does not verify"); tried != (i == 0) {
					t.Errorf("refusal %d, %s: %q", i, r.Key, r.Reason)
				}
				refused = append(refused, r.Key)
			}
			if !slices.Equal(refused, []string{v3.Key, v2.Key, v1.Key}) {
				t.Fatalf("refused %v, want the three that need the damaged pack", refused)
			}
			q, err := m2.Quarantined(ctx, "p")
			if err != nil || len(q) != 3 {
				t.Fatalf("quarantine %+v %v", q, err)
			}
			records, _ := store.ListAll(ctx, b.s, chunked.PrefixDamaged)
			if len(records) == 0 {
				t.Error("no record of the damaged pack")
			}

			os.WriteFile(filepath.Join(woke, "big.bin"), big, 0o644)
			os.WriteFile(filepath.Join(woke, "work.txt"), []byte("work\n"), 0o644)
			clk2.Add(time.Second)
			v4, _, err := m2.SaveDir(ctx, "p", woke)
			if err != nil {
				t.Fatalf("the save after the wake: %v", err)
			}
			man, err := m2.Repo().Manifest(ctx, v4.Key)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range man.Packs {
				if slices.Contains(bigPacks, chunked.PackKey(p)) {
					t.Errorf("the save reused the damaged pack %s", p)
				}
			}
			m3, clk3, _ := chunkedManager(t, b.s)
			clk3.Add(2 * time.Minute)
			out := filepath.Join(t.TempDir(), "out")
			info, _, err = m3.RestoreDir(ctx, "p", out, false)
			if err != nil || info.Key != v4.Key || len(info.Refused) != 0 {
				t.Fatalf("the next wake: %s %+v %v", info.Key, info.Refused, err)
			}
			if got, _ := os.ReadFile(filepath.Join(out, "big.bin")); !bytes.Equal(got, big) {
				t.Error("big.bin differs after the next wake")
			}
		})
	}
}

// TestPartlyDamagedPack: one blob of a pack two snapshots share rots, and only the older
// snapshot needs it. The newer one still wakes; a verification of the older sets it
// aside alone; the pack is recorded as damaged, so the next save stores anew even what the
// newer one has in its sound part, and is stored even though its content is the newer
// one's (which needs a damaged pack: no longer the reference of "unchanged").
func TestPartlyDamagedPack(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := tctx(t)
			m, clk, _ := chunkedManager(t, b.s)
			ws := filepath.Join(t.TempDir(), "ws")
			os.MkdirAll(ws, 0o755)
			os.WriteFile(filepath.Join(ws, "a.txt"), []byte(strings.Repeat("alpha\n", 1000)), 0o644)
			os.WriteFile(filepath.Join(ws, "b.txt"), []byte(strings.Repeat("beta\n", 1000)), 0o644)
			chunkedtest.Backdate(t, ws)
			v1, _, err := m.SaveDir(ctx, "p", ws)
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(filepath.Join(ws, "b.txt"))
			chunkedtest.Backdate(t, ws)
			clk.Add(time.Second)
			v2, _, err := m.SaveDir(ctx, "p", ws)
			if err != nil {
				t.Fatal(err)
			}
			man1, _ := m.Repo().Manifest(ctx, v1.Key)
			entries, err := m.Repo().Entries(ctx, man1)
			if err != nil {
				t.Fatal(err)
			}
			var bRef, aRef chunked.Ref
			for _, e := range entries {
				switch e.Path {
				case "a.txt":
					aRef = e.Chunks[0]
				case "b.txt":
					bRef = e.Chunks[0]
				}
			}
			if aRef.Pack != bRef.Pack {
				t.Fatalf("a.txt and b.txt are in packs %s and %s; the test wants one", aRef.Pack, bRef.Pack)
			}
			corruptRef(t, b.s, bRef)

			m2, clk2, _ := chunkedManager(t, b.s)
			clk2.Add(time.Minute)
			woke := filepath.Join(t.TempDir(), "woke")
			info, _, err := m2.RestoreDir(ctx, "p", woke, false)
			if err != nil || info.Key != v2.Key || len(info.Refused) != 0 {
				t.Fatalf("wake: %s %+v %v; want %s", info.Key, info.Refused, err, v2.Key)
			}
			_, err = m2.Verify(ctx, "p", v1.Key)
			var qe *snapshot.QuarantineError
			if !errors.As(err, &qe) || !strings.HasPrefix(qe.Quarantine, "projects/p/quarantine/") || len(qe.Others) != 0 {
				t.Fatalf("verify of the damaged snapshot: %v", err)
			}
			list, _ := m2.List(ctx, "p")
			if len(list) != 1 || list[0].Key != v2.Key {
				t.Errorf("snapshots after the verification: %v; want %s alone (it needs only the pack's sound part)", keysOf(list), v2.Key)
			}

			m3, clk3, _ := chunkedManager(t, b.s)
			clk3.Add(2 * time.Minute)
			v3, _, err := m3.SaveDir(ctx, "p", woke)
			if err != nil || v3.Unchanged {
				t.Fatalf("a save of the woken tree: %+v %v; want a new snapshot (the newest needs a damaged pack)", v3, err)
			}
			man3, _ := m3.Repo().Manifest(ctx, v3.Key)
			if slices.Contains(man3.Packs, aRef.Pack) {
				t.Errorf("the save reused pack %s, found damaged", aRef.Pack)
			}
			out := filepath.Join(t.TempDir(), "out")
			info, _, err = m3.RestoreDir(ctx, "p", out, false)
			if err != nil || info.Key != v3.Key {
				t.Fatalf("the next wake: %s %v", info.Key, err)
			}
			if got, _ := os.ReadFile(filepath.Join(out, "a.txt")); string(got) != strings.Repeat("alpha\n", 1000) {
				t.Error("a.txt differs after the next wake")
			}
		})
	}
}

// TestCorruptManifestSetAside: the newest manifest's bytes rot. The wake sets it aside;
// a save goes on; a collection is no longer stopped by it (it was, while it stood among
// the snapshots); it cannot be released, and deleting it empties the quarantine.
func TestCorruptManifestSetAside(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := tctx(t)
			m, clk, _ := chunkedManager(t, b.s)
			ws := filepath.Join(t.TempDir(), "ws")
			chunkedtest.MakeTree(t, ws, 32)
			v1, _, err := m.SaveDir(ctx, "p", ws)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(ws, "later.txt"), []byte("later\n"), 0o644)
			clk.Add(time.Second)
			v2, _, err := m.SaveDir(ctx, "p", ws)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(b.file(v2.Key), []byte("not a manifest at all"), 0o644); err != nil {
				t.Fatal(err)
			}

			m2, clk2, _ := chunkedManager(t, b.s)
			clk2.Add(time.Minute)
			woke := filepath.Join(t.TempDir(), "woke")
			info, _, err := m2.RestoreDir(ctx, "p", woke, false)
			if err != nil || info.Key != v1.Key || len(info.Refused) != 1 || !strings.Contains(info.Refused[0].Quarantine, "-corrupt-manifest-") {
				t.Fatalf("wake: %s %+v %v", info.Key, info.Refused, err)
			}
			os.WriteFile(filepath.Join(woke, "work.txt"), []byte("work\n"), 0o644)
			clk2.Add(time.Second)
			if _, _, err := m2.SaveDir(ctx, "p", woke); err != nil {
				t.Fatalf("the save after the wake: %v", err)
			}
			if _, err := m2.Collect(ctx); err != nil {
				t.Errorf("a collection with a quarantined manifest that does not read: %v", err)
			}
			q := info.Refused[0].Quarantine
			if _, err := m2.Release(ctx, "p", q); !errors.Is(err, chunked.ErrStillDamaged) {
				t.Errorf("release of a manifest that does not read: %v", err)
			}
			if err := m2.Delete(ctx, "p", q); err != nil {
				t.Fatal(err)
			}
			if left, err := m2.Quarantined(ctx, "p"); err != nil || len(left) != 0 {
				t.Errorf("quarantine after the delete: %+v %v", left, err)
			}
			if err := m2.Delete(ctx, "other", q); !errors.Is(err, snapshot.ErrNotSnapshotKey) {
				t.Errorf("another project's quarantine key: %v", err)
			}
		})
	}
}

// TestReleaseAfterRepair: a snapshot whose pack went missing is set aside; it cannot be
// released until the pack is back, then it is, under its own key, the damage record goes,
// and (nothing saved since) the next wake is in it again.
func TestReleaseAfterRepair(t *testing.T) {
	ctx := tctx(t)
	b := newDir(t)
	m, clk, _ := chunkedManager(t, b.s)
	ws := filepath.Join(t.TempDir(), "ws")
	chunkedtest.MakeTree(t, ws, 33)
	if _, _, err := m.SaveDir(ctx, "p", ws); err != nil {
		t.Fatal(err)
	}
	before, _ := store.ListAll(ctx, b.s, chunked.PrefixPacks)
	os.WriteFile(filepath.Join(ws, "later.txt"), []byte("later\n"), 0o644)
	clk.Add(time.Second)
	v2, _, err := m.SaveDir(ctx, "p", ws)
	if err != nil {
		t.Fatal(err)
	}
	type kept struct {
		data []byte
		md   map[string]string
	}
	backup := map[string]kept{}
	for _, k := range newPacks(t, b.s, before) {
		rc, oi, err := b.s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(rc)
		rc.Close()
		backup[k] = kept{data, oi.Metadata}
		b.s.Delete(ctx, k)
	}
	m2, clk2, _ := chunkedManager(t, b.s)
	clk2.Add(time.Minute)
	info, _, err := m2.RestoreDir(ctx, "p", filepath.Join(t.TempDir(), "woke"), false)
	if err != nil || len(info.Refused) != 1 || !strings.Contains(info.Refused[0].Quarantine, "-missing-pack-") {
		t.Fatalf("wake: %+v %v", info.Refused, err)
	}
	q := info.Refused[0].Quarantine
	if _, err := m2.Release(ctx, "p", q); !errors.Is(err, chunked.ErrStillDamaged) {
		t.Fatalf("release before the repair: %v", err)
	}
	for k, kp := range backup {
		if _, err := b.s.Put(ctx, k, bytes.NewReader(kp.data), store.PutOptions{Size: int64(len(kp.data)), Metadata: kp.md}); err != nil {
			t.Fatal(err)
		}
	}
	key, err := m2.Release(ctx, "p", q)
	if err != nil || key != v2.Key {
		t.Fatalf("release after the repair: %q %v", key, err)
	}
	if records, _ := store.ListAll(ctx, b.s, chunked.PrefixDamaged); len(records) != 0 {
		t.Errorf("damage records left after the repair: %v", records)
	}
	if left, _ := m2.Quarantined(ctx, "p"); len(left) != 0 {
		t.Errorf("quarantine after the release: %+v", left)
	}
	m3, _, _ := chunkedManager(t, b.s)
	info, _, err = m3.RestoreDir(ctx, "p", filepath.Join(t.TempDir(), "out"), false)
	if err != nil || info.Key != v2.Key || len(info.Refused) != 0 {
		t.Fatalf("the wake after the release: %s %+v %v", info.Key, info.Refused, err)
	}
}

var _ = context.Background
