package storekeys

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestLayoutIsTodays: the keys are the ones every earlier version wrote, byte for byte, so
// a store written before this package existed reads the same.
func TestLayoutIsTodays(t *testing.T) {
	for got, want := range map[string]string{
		Snapshots("shop"):            "projects/shop/snapshots/",
		Lease("shop"):                "projects/shop/lease/",
		LeaseGeneration("shop", 42):  "projects/shop/lease/00000000000000000042",
		SessionState("shop", "s-1"):  "projects/shop/sessions/s-1.json",
		Screenshots("shop", "agent"): "screenshots/shop/agent/",
		Screenshots("shop", "auto"):  "screenshots/shop/auto/",
		Plugin("bash"):               "plugins/bash/",
		Quota("e2b"):                 "quota/e2b/",
		SnapshotKey("shop", time.Date(2026, 11, 21, 9, 30, 0, 42e6, time.UTC), "7f3a9c"): "projects/shop/snapshots/20261121T093000Z-042-7f3a9c.tar.gz",
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
	if s, ok := ParseSessionState("shop", SessionState("shop", "s-1")); !ok || s != "s-1" {
		t.Errorf("ParseSessionState of its own key: %q %v", s, ok)
	}
	for _, k := range []string{"projects/shop/sessions/a/b.json", "projects/shop/sessions/.json", "projects/shop/sessions/x.txt", "projects/shop2/sessions/x.json"} {
		if s, ok := ParseSessionState("shop", k); ok {
			t.Errorf("ParseSessionState(%q) = %q", k, s)
		}
	}
	if p := DoctorProbe("h", 7, 9); !strings.HasPrefix(p, "doctor/probe-h-7-9-") || p == DoctorProbe("h", 7, 9) {
		t.Errorf("doctor probes %q: want doctor/probe-HOST-PID-N-NONCE, never the same twice", p)
	}
}

// TestParseSnapshotKey: today's keys and the older forms parse, with the time each holds
// and the earliest time a newer key may take; anything else does not.
func TestParseSnapshotKey(t *testing.T) {
	at := time.Date(2026, 11, 21, 9, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		key         string
		ok          bool
		t, after    time.Time
		wantProject string
	}{
		{"projects/shop/snapshots/20261121T093000Z-042-7f3a9c.tar.gz", true, at.Add(42 * time.Millisecond), at.Add(43 * time.Millisecond), "shop"},
		{"projects/shop/snapshots/20261121T093000Z.tar.gz", true, at, at.Add(time.Second), "shop"},
		{"projects/shop/snapshots/20261121T093000Z_01.tar.gz", true, at, at.Add(time.Second), "shop"},
		{"projects/shop/snapshots/20261121T093000Z_00.tar.gz", false, time.Time{}, time.Time{}, ""},
		{"projects/shop/snapshots/20261121T093000Z-042-7F3A9C.tar.gz", false, time.Time{}, time.Time{}, ""},
		{"projects/shop/lease/00000000000000000042", false, time.Time{}, time.Time{}, ""},
		{"projects/../snapshots/20261121T093000Z.tar.gz", false, time.Time{}, time.Time{}, ""},
		{"screenshots/shop/agent/20261121T093000Z_desktop.webp", false, time.Time{}, time.Time{}, ""},
		{"projects/shop/snapshots/20261121T093000Z-042-7f3a9c.tar.gz.tmp", false, time.Time{}, time.Time{}, ""},
	} {
		p, tm, after, ok := ParseSnapshotKey(tc.key)
		if ok != tc.ok || p != tc.wantProject || !tm.Equal(tc.t) || !after.Equal(tc.after) {
			t.Errorf("%s: %q %v %v %v, want %q %v %v %v", tc.key, p, tm, after, ok, tc.wantProject, tc.t, tc.after, tc.ok)
		}
	}
	if p, tm, ok := ParseManifestKey("projects/shop/snapshots/20261121T093000Z-042-7f3a9c.snap"); !ok || p != "shop" || !tm.Equal(at.Add(42*time.Millisecond)) {
		t.Errorf("a manifest key: %q %v %v", p, tm, ok)
	}
	if _, _, ok := ParseManifestKey("projects/shop/snapshots/20261121T093000Z-042-7f3a9c.tar.gz"); ok {
		t.Error("a tar.gz key parsed as a manifest's")
	}
	if _, _, _, ok := ParseSnapshotKey("projects/shop/snapshots/20261121T093000Z-042-7f3a9c.snap"); ok {
		t.Error("a manifest key parsed as a tar.gz snapshot's")
	}
	k := SnapshotKey("a.b-c_d", at.Add(7*time.Millisecond), NewNonce())
	if p, tm, _, ok := ParseSnapshotKey(k); !ok || p != "a.b-c_d" || !tm.Equal(at.Add(7*time.Millisecond)) {
		t.Errorf("round trip of %s: %q %v %v", k, p, tm, ok)
	}
}

// TestValidProject: a project id is one path segment that cannot climb, so no project's
// prefix reaches another's or leaves projects/.
func TestValidProject(t *testing.T) {
	for _, ok := range []string{"a", "shop", "Shop.v2", "a_b-c.d", "1", strings.Repeat("x", MaxProjectLen)} {
		if err := ValidProject(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", ".hidden", "-x", "a/b", "a..b", "a b", "é", "a\x00", strings.Repeat("x", MaxProjectLen+1)} {
		if err := ValidProject(bad); !errors.Is(err, ErrInvalidProject) {
			t.Errorf("%q: %v, want ErrInvalidProject", bad, err)
		}
	}
	// With valid ids, no project's folder is a prefix of another's, and the roots are
	// disjoint.
	ids := []string{"1", "10", "1-x", "1.x"}
	for _, a := range ids {
		for _, b := range ids {
			if a != b && strings.HasPrefix(Project(b), Project(a)) {
				t.Errorf("Project(%q) is a prefix of Project(%q)", a, b)
			}
		}
	}
	roots := []string{Project("p"), Screenshots("p", "agent"), Plugin("p"), Quota("p"), DoctorProbe("h", 1, 1)}
	for i, a := range roots {
		for j, b := range roots {
			top := func(s string) string { return s[:strings.Index(s, "/")+1] }
			if i != j && top(a) == top(b) {
				t.Errorf("%q and %q share a root", a, b)
			}
		}
	}
}

// TestQuarantineKey: a snapshot set aside keeps its name behind when and why, in its
// project's quarantine folder, and reads back; other keys do not.
func TestQuarantineKey(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 15, 0, 0, time.UTC)
	snap := "projects/shop/snapshots/20261121T093000Z-042-7f3a9c.snap"
	k := QuarantineKey("shop", at.Add(700*time.Millisecond), "damaged-pack", snap)
	if want := "projects/shop/quarantine/20261122T101500Z-damaged-pack-20261121T093000Z-042-7f3a9c.snap"; k != want {
		t.Fatalf("%q, want %q", k, want)
	}
	p, tm, why, from, ok := ParseQuarantineKey(k)
	if !ok || p != "shop" || !tm.Equal(at) || why != "damaged-pack" || from != snap {
		t.Errorf("read back: %q %v %q %q %v", p, tm, why, from, ok)
	}
	if k := QuarantineKey("shop", at, "Not A Code/../x", snap); !strings.Contains(k, "-damaged-20261121T093000Z") {
		t.Errorf("a reason that is not a code: %q", k)
	}
	for _, bad := range []string{
		snap,
		"projects/shop/quarantine/20261122T101500Z-damaged-pack-notasnapshot.snap",
		"projects/shop/quarantine/20261122T101500Z-20261121T093000Z-042-7f3a9c.snap",
		"projects/shop/quarantine/20261122T101500Z-Damaged-20261121T093000Z-042-7f3a9c.snap",
		"projects/../quarantine/20261122T101500Z-damaged-20261121T093000Z-042-7f3a9c.snap",
		"projects/shop/quarantine/20261122T101500Z-damaged-20261121T093000Z-042-7f3a9c.snap/x",
	} {
		if _, _, _, _, ok := ParseQuarantineKey(bad); ok {
			t.Errorf("%q read as a quarantine key", bad)
		}
	}
	if strings.HasPrefix(Quarantine("shop"), Snapshots("shop")) || strings.HasPrefix(Snapshots("shop"), Quarantine("shop")) {
		t.Error("the quarantine and the snapshots share a prefix: a listing of one sees the other")
	}
	if DamagedPack("0123") != "chunks/damaged/0123" {
		t.Errorf("damaged pack record %q", DamagedPack("0123"))
	}
}
