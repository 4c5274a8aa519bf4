// Package framedinput encodes a tool input, decoded from JSON, as the framed request of
// abi/ABI.md section 9. The host sends it; package pdktest sends the same in tests. It is
// apart from package abi because it needs encoding/json, which abi keeps out of plugins.
package framedinput

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/toolhost/toolhost/abi"
)

// Encode encodes a decoded tool input (as encoding/json decodes an object, with or without
// UseNumber) as the framed request of tool: each member in the order of the keys, a
// string's value decoded, any other value as its JSON text (HTML characters not escaped).
func Encode(tool string, input map[string]any) ([]byte, error) {
	keys := make([]string, 0, len(input))
	for k := range input {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	members := make([]abi.InputMember, len(keys))
	for i, k := range keys {
		m := abi.InputMember{Kind: abi.MemberString, Key: []byte(k)}
		if s, ok := input[k].(string); ok {
			m.Value = []byte(s)
		} else {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(input[k]); err != nil {
				return nil, fmt.Errorf("encode input member %q: %w", k, err)
			}
			m.Kind, m.Value = abi.MemberJSON, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		}
		members[i] = m
	}
	return abi.AppendFramedInput(make([]byte, 0, abi.FramedInputSize(tool, members)), tool, members), nil
}
