package chunked

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Line diffs for snapshot diff and three-way merges: Myers' O(ND) algorithm ("An O(ND)
// Difference Algorithm and Its Variations", Algorithmica 1986), over lines.

// IsText reports whether b reads as text: UTF-8 without NUL, at most MaxTextBytes.
func IsText(b []byte) bool {
	return len(b) <= MaxTextBytes && utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

// MaxTextBytes bounds the files diffed and merged line by line.
const MaxTextBytes = 1 << 20

// maxEdits bounds Myers' search; past it the files are one replaced block.
const maxEdits = 4000

// hunk replaces a[A1:A2] by b[B1:B2].
type hunk struct{ A1, A2, B1, B2 int }

func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// diffLines returns the hunks that turn a into b.
func diffLines(a, b []string) []hunk {
	// Trim the common head and tail: most edits are small.
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	x, y := a[pre:len(a)-suf], b[pre:len(b)-suf]
	var hs []hunk
	for _, h := range myers(x, y) {
		hs = append(hs, hunk{h.A1 + pre, h.A2 + pre, h.B1 + pre, h.B2 + pre})
	}
	return hs
}

func myers(a, b []string) []hunk {
	n, m := len(a), len(b)
	if n == 0 && m == 0 {
		return nil
	}
	if n == 0 || m == 0 {
		return []hunk{{0, n, 0, m}}
	}
	max := n + m
	if max > 2*maxEdits {
		max = 2 * maxEdits
	}
	off := max + 1
	v := make([]int, 2*max+3)
	var trace [][]int
	found := false
	for d := 0; d <= max && !found; d++ {
		trace = append(trace, append([]int(nil), v...))
		for k := -d; k <= d; k += 2 {
			var xx int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				xx = v[off+k+1]
			} else {
				xx = v[off+k-1] + 1
			}
			yy := xx - k
			for xx < n && yy < m && a[xx] == b[yy] {
				xx++
				yy++
			}
			v[off+k] = xx
			if xx >= n && yy >= m {
				found = true
				break
			}
		}
	}
	if !found {
		return []hunk{{0, n, 0, m}}
	}
	trace = append(trace, v)
	// Walk back through the trace, collecting matched diagonals.
	type pair struct{ x, y int }
	var matches []pair
	x, y := n, m
	for d := len(trace) - 2; d >= 0 && (x > 0 || y > 0); d-- {
		vv := trace[d+1]
		_ = vv
		prev := trace[d]
		k := x - y
		var pk int
		if k == -d || (k != d && prev[off+k-1] < prev[off+k+1]) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := prev[off+pk]
		py := px - pk
		for x > px && y > py && x > 0 && y > 0 {
			x--
			y--
			matches = append(matches, pair{x, y})
		}
		if d > 0 {
			x, y = px, py
		}
	}
	for x > 0 && y > 0 && a[x-1] == b[y-1] {
		x--
		y--
		matches = append(matches, pair{x, y})
	}
	// matches run backwards; turn the gaps between them into hunks.
	var hs []hunk
	ax, by := 0, 0
	for i := len(matches) - 1; i >= 0; i-- {
		p := matches[i]
		if p.x > ax || p.y > by {
			hs = append(hs, hunk{ax, p.x, by, p.y})
		}
		ax, by = p.x+1, p.y+1
	}
	if ax < n || by < m {
		hs = append(hs, hunk{ax, n, by, m})
	}
	return hs
}

// UnifiedDiff renders the change from a to b as a unified diff with 3 lines of context,
// or "" when they are equal.
func UnifiedDiff(nameA, nameB string, a, b []byte) string {
	la, lb := splitLines(a), splitLines(b)
	hs := diffLines(la, lb)
	if len(hs) == 0 {
		return ""
	}
	const ctx = 3
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", nameA, nameB)
	for i := 0; i < len(hs); {
		j := i
		for j+1 < len(hs) && hs[j+1].A1-hs[j].A2 <= 2*ctx {
			j++
		}
		a1, a2 := max(hs[i].A1-ctx, 0), min(hs[j].A2+ctx, len(la))
		b1 := hs[i].B1 - (hs[i].A1 - a1)
		b2 := hs[j].B2 + (a2 - hs[j].A2)
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n", rangeStr(a1, a2-a1), rangeStr(b1, b2-b1))
		pos := a1
		for k := i; k <= j; k++ {
			h := hs[k]
			for ; pos < h.A1; pos++ {
				line(&sb, ' ', la[pos])
			}
			for _, l := range la[h.A1:h.A2] {
				line(&sb, '-', l)
			}
			for _, l := range lb[h.B1:h.B2] {
				line(&sb, '+', l)
			}
			pos = h.A2
		}
		for ; pos < a2; pos++ {
			line(&sb, ' ', la[pos])
		}
		i = j + 1
	}
	return sb.String()
}

func rangeStr(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

func line(sb *strings.Builder, c byte, l string) {
	sb.WriteByte(c)
	sb.WriteString(l)
	if !strings.HasSuffix(l, "\n") {
		sb.WriteString("\n\\ No newline at end of file\n")
	}
}

// Merge3 merges the changes from base to ours and from base to theirs, line by line.
// ok is false when both changed the same lines differently: the result then holds both
// versions between conflict markers, and conflicts counts the regions.
func Merge3(base, ours, theirs []byte) (merged []byte, conflicts int) {
	lb, lo, lt := splitLines(base), splitLines(ours), splitLines(theirs)
	ho, ht := diffLines(lb, lo), diffLines(lb, lt)
	var out []string
	pos := 0
	i, j := 0, 0
	for i < len(ho) || j < len(ht) {
		// The next region: the earliest hunk, grown while hunks of either side overlap or
		// touch it.
		var a1, a2 int
		switch {
		case j >= len(ht) || (i < len(ho) && ho[i].A1 <= ht[j].A1):
			a1, a2 = ho[i].A1, ho[i].A2
		default:
			a1, a2 = ht[j].A1, ht[j].A2
		}
		i2, j2 := i, j
		for {
			grew := false
			for i2 < len(ho) && ho[i2].A1 <= a2 && (ho[i2].A1 < a2 || ho[i2].A1 == a1 || ho[i2].A2 == ho[i2].A1) {
				a2 = max(a2, ho[i2].A2)
				i2++
				grew = true
			}
			for j2 < len(ht) && ht[j2].A1 <= a2 && (ht[j2].A1 < a2 || ht[j2].A1 == a1 || ht[j2].A2 == ht[j2].A1) {
				a2 = max(a2, ht[j2].A2)
				j2++
				grew = true
			}
			if !grew {
				break
			}
		}
		out = append(out, lb[pos:a1]...)
		side := func(hs []hunk, from, to int, lines []string) []string {
			var r []string
			p := a1
			for _, h := range hs[from:to] {
				r = append(r, lb[p:h.A1]...)
				r = append(r, lines[h.B1:h.B2]...)
				p = h.A2
			}
			return append(r, lb[p:a2]...)
		}
		switch {
		case i2 == i:
			out = append(out, side(ht, j, j2, lt)...)
		case j2 == j:
			out = append(out, side(ho, i, i2, lo)...)
		default:
			o, t := side(ho, i, i2, lo), side(ht, j, j2, lt)
			if strings.Join(o, "") == strings.Join(t, "") {
				out = append(out, o...)
			} else {
				conflicts++
				out = append(out, "<<<<<<< ours\n")
				out = append(out, terminate(o)...)
				out = append(out, "=======\n")
				out = append(out, terminate(t)...)
				out = append(out, ">>>>>>> theirs\n")
			}
		}
		pos, i, j = a2, i2, j2
	}
	out = append(out, lb[pos:]...)
	return []byte(strings.Join(out, "")), conflicts
}

func terminate(lines []string) []string {
	if n := len(lines); n > 0 && !strings.HasSuffix(lines[n-1], "\n") {
		lines = append(lines[:n-1:n-1], lines[n-1]+"\n")
	}
	return lines
}
