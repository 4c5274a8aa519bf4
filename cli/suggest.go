package cli

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// closest returns the candidates nearest to word (an edit distance of at most a third of
// its length, and 2 at most), nearest first: the did-you-mean of a mistyped command or
// flag. A candidate that word is a prefix of counts as near too.
func closest(word string, candidates []string) []string {
	type scored struct {
		s string
		d int
	}
	limit := min(2, max(1, len(word)/3))
	var near []scored
	for _, c := range candidates {
		d := editDistance(word, c)
		if d <= limit || (len(word) >= 3 && strings.HasPrefix(c, word)) {
			near = append(near, scored{c, d})
		}
	}
	slices.SortStableFunc(near, func(a, b scored) int { return a.d - b.d })
	var out []string
	for _, n := range near {
		if !slices.Contains(out, n.s) {
			out = append(out, n.s)
		}
	}
	return out[:min(len(out), 3)]
}

// editDistance is the Levenshtein distance between a and b, transpositions counting one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

func quoteOr(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = fmt.Sprintf("%q", w)
	}
	return strings.Join(q, " or ")
}

// flagHint is the did-you-mean of an unknown flag in err, among fs's flags.
func flagHint(err error, fs *pflag.FlagSet) string {
	var nf *pflag.NotExistError
	if !errors.As(err, &nf) {
		return ""
	}
	name := nf.GetSpecifiedName()
	if nf.GetSpecifiedShortnames() != "" {
		return ""
	}
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	near := closest(name, names)
	if len(near) == 0 {
		return ""
	}
	for i := range near {
		near[i] = "--" + near[i]
	}
	return " (did you mean " + strings.Join(near, " or ") + "?)"
}
