package chunked

import (
	"strings"
	"testing"
)

func TestUnifiedDiff(t *testing.T) {
	a := "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n"
	b := "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n"
	got := UnifiedDiff("a/f", "b/f", []byte(a), []byte(b))
	want := "--- a/f\n+++ b/f\n@@ -1,6 +1,6 @@\n one\n two\n-three\n+THREE\n four\n five\n six\n@@ -8,3 +8,4 @@\n eight\n nine\n ten\n+eleven\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if UnifiedDiff("a", "b", []byte(a), []byte(a)) != "" {
		t.Error("equal files diffed")
	}
	// Apply every diff of random-ish edits back: the hunks must rebuild b from a.
	for _, c := range [][2]string{{"", "x\n"}, {"x\n", ""}, {"a\nb\nc\n", "c\nb\na\n"}, {"a\nb\n", "a\nb"}, {"1\n2\n3\n4\n", "0\n1\n3\n5\n"}} {
		la, lb := splitLines([]byte(c[0])), splitLines([]byte(c[1]))
		var out []string
		p := 0
		for _, h := range diffLines(la, lb) {
			out = append(out, la[p:h.A1]...)
			out = append(out, lb[h.B1:h.B2]...)
			p = h.A2
		}
		out = append(out, la[p:]...)
		if strings.Join(out, "") != c[1] {
			t.Errorf("%q -> %q: hunks rebuild %q", c[0], c[1], strings.Join(out, ""))
		}
	}
}

func TestMerge3(t *testing.T) {
	base := "a\nb\nc\nd\ne\nf\n"
	ours := "a\nB\nc\nd\ne\nf\n"      // changes b
	theirs := "a\nb\nc\nd\nE\nf\ng\n" // changes e, adds g
	got, n := Merge3([]byte(base), []byte(ours), []byte(theirs))
	if n != 0 || string(got) != "a\nB\nc\nd\nE\nf\ng\n" {
		t.Errorf("clean merge: %d conflicts, %q", n, got)
	}
	// Both change c: a conflict, both versions kept between markers.
	got, n = Merge3([]byte(base), []byte("a\nb\nC1\nd\ne\nf\n"), []byte("a\nb\nC2\nd\ne\nf\n"))
	if n != 1 || !strings.Contains(string(got), "<<<<<<< ours\nC1\n=======\nC2\n>>>>>>> theirs\n") {
		t.Errorf("conflict: %d, %q", n, got)
	}
	// The same change on both sides is no conflict.
	got, n = Merge3([]byte(base), []byte("a\nX\nc\nd\ne\nf\n"), []byte("a\nX\nc\nd\ne\nf\n"))
	if n != 0 || string(got) != "a\nX\nc\nd\ne\nf\n" {
		t.Errorf("same change: %d, %q", n, got)
	}
}
