package pdk

import (
	"encoding/json"
	"errors"
)

// Input is a tool's input object. The host has already checked it against the tool's
// schema, so the accessors return zero values (or the given default) for absent members
// instead of errors. An Input is valid only while the tool's Run function runs: it points
// into the plugin's input buffer, which the next call overwrites. Strings it returns are
// copies and stay valid.
type Input struct {
	raw    []byte
	fields []field
}

// ParseInput parses a JSON object into an Input. Tools get theirs already parsed; this is
// for tests and for tools that hand nested objects around.
func ParseInput(raw []byte) (Input, error) {
	return parseInputInto(nil, raw)
}

func parseInputInto(buf []field, raw []byte) (Input, error) {
	if i := skipWS(raw, 0); i == len(raw) || literal(raw, i, "null") == len(raw) {
		return Input{raw: []byte("{}")}, nil // an absent input is an empty object
	}
	fields, ok := objectFields(buf[:0], raw)
	if !ok {
		return Input{}, errors.New("input is not a valid JSON object")
	}
	return Input{raw: raw, fields: fields}, nil
}

// lookup returns the raw value of key, or nil when key is absent or null. A repeated key
// resolves to its last occurrence, as in encoding/json.
func (in Input) lookup(key string) []byte {
	for i := len(in.fields) - 1; i >= 0; i-- {
		if string(in.fields[i].key) == key {
			v := in.fields[i].val
			if string(v) == "null" {
				return nil
			}
			return v
		}
	}
	return nil
}

// Has reports whether key is present and not null.
func (in Input) Has(key string) bool { return in.lookup(key) != nil }

// String returns the string member key, or "" when it is absent or not a string.
func (in Input) String(key string) string {
	s, _ := jsonString(in.lookup(key))
	return s
}

// Int returns the integer member key, or def when it is absent or not an integer.
func (in Input) Int(key string, def int) int {
	if n, ok := jsonInt(in.lookup(key)); ok {
		return int(n)
	}
	return def
}

// Bool returns the boolean member key; false when it is absent or not a boolean.
func (in Input) Bool(key string) bool { return string(in.lookup(key)) == "true" }

// Strings returns the member key when it is an array of strings, else nil.
func (in Input) Strings(key string) []string {
	v := in.lookup(key)
	if v == nil {
		return nil
	}
	var out []string
	ok := arrayElems(v, func(e []byte) bool {
		s, ok := jsonString(e)
		out = append(out, s)
		return ok
	})
	if !ok {
		return nil
	}
	return out
}

// Raw returns the raw JSON of member key (nil when absent or null); it is valid only while
// Run runs.
func (in Input) Raw(key string) []byte { return in.lookup(key) }

// JSON returns the whole input object as raw JSON; it is valid only while Run runs.
func (in Input) JSON() []byte { return in.raw }

// Decode unmarshals the whole input into v with encoding/json, for inputs too complex for
// the accessors. It costs reflection; prefer the accessors on hot tools.
func (in Input) Decode(v any) error { return json.Unmarshal(in.raw, v) }
