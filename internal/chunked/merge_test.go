package chunked

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMergeRuns: runs each in path order merge into one in path order ("a/b" before
// "a.c"); runs out of order are sorted instead.
func TestMergeRuns(t *testing.T) {
	ents := func(paths ...string) []Entry {
		out := make([]Entry, len(paths))
		for i, p := range paths {
			out[i].Path = p
		}
		return out
	}
	paths := func(es []Entry) []string {
		out := make([]string, len(es))
		for i, e := range es {
			out[i] = e.Path
		}
		return out
	}
	got := paths(mergeRuns(ents("a", "a/b", "c"), ents("a/b/x", "a.c", "b/y"), nil, ents("a/a", "d")))
	want := []string{"a", "a/a", "a/b", "a/b/x", "a.c", "b/y", "c", "d"}
	if !slices.Equal(got, want) {
		t.Errorf("merged %q, want %q", got, want)
	}
	got = paths(mergeRuns(ents("c", "a"), ents("b")))
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("unsorted runs gave %q, want %q", got, want)
	}
	// Random runs of random paths: the result is what sorting gives.
	r := rand.New(rand.NewPCG(34, 3))
	for range 200 {
		var runs [][]Entry
		var all []string
		for range 1 + r.IntN(4) {
			var run []string
			for range r.IntN(30) {
				p := string(rune('a'+r.IntN(3))) + []string{"", "/x", ".y", "/x/z"}[r.IntN(4)] + string(rune('0'+r.IntN(10)))
				run = append(run, p)
			}
			slices.SortFunc(run, compare)
			run = slices.Compact(run)
			runs = append(runs, ents(run...))
			all = append(all, run...)
		}
		slices.SortStableFunc(all, compare)
		if got := paths(mergeRuns(runs...)); !slices.Equal(got, all) {
			t.Fatalf("merged %q, want %q", got, all)
		}
	}
}
