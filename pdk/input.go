package pdk

import (
	"errors"
	"unsafe"

	"github.com/toolhost/toolhost/abi"
)

// Input is a tool's input object. The host has already checked it against the tool's
// schema, so the accessors return zero values (or the given default) for absent members
// instead of errors. An Input is valid only while the tool's Run function runs: it points
// into the plugin's input buffer, which the next call overwrites. Strings it returns are
// copies and stay valid; Bytes and Raw return views that do not.
//
// The host sends the input framed (ABI.md section 9) to a plugin built with this kit: its
// string members arrive decoded, so String costs one copy and Bytes none, whatever the
// escapes. A host that sends JSON (an older one) gets the same answers, after a scan.
type Input struct {
	raw    []byte // the JSON object; nil for a framed input until JSON builds it
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

// framedFields turns the members of a framed input into fields.
func framedFields(buf []field, members []abi.InputMember) []field {
	buf = buf[:0]
	for _, m := range members {
		buf = append(buf, field{key: m.Key, val: m.Value, str: m.Kind == abi.MemberString})
	}
	return buf
}

// lookup returns the member key, or nil when key is absent or null. A repeated key
// resolves to its last occurrence, as in encoding/json.
func (in Input) lookup(key string) *field {
	for i := len(in.fields) - 1; i >= 0; i-- {
		f := &in.fields[i]
		if string(f.key) == key {
			if !f.str && string(f.val) == "null" {
				return nil
			}
			return f
		}
	}
	return nil
}

// Has reports whether key is present and not null.
func (in Input) Has(key string) bool { return in.lookup(key) != nil }

// String returns the string member key, or "" when it is absent or not a string.
func (in Input) String(key string) string {
	f := in.lookup(key)
	switch {
	case f == nil:
		return ""
	case f.str:
		return string(f.val)
	}
	s, _ := jsonString(f.val)
	return s
}

// Bytes returns the string member key as bytes, or nil when it is absent or not a string.
// For a framed input (what the host sends) the bytes are the input buffer's own, not a
// copy: a 64 KB file content passed on to WriteFile is never copied inside the plugin.
// They are valid only while Run runs, and must not be modified.
func (in Input) Bytes(key string) []byte {
	f := in.lookup(key)
	switch {
	case f == nil:
		return nil
	case f.str:
		if f.val == nil {
			return []byte{}
		}
		return f.val
	}
	s, ok := jsonString(f.val)
	if !ok {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s)) // s is a fresh copy nobody else holds
}

// json returns the raw JSON value of f.
func (f *field) json() []byte {
	if f.str {
		return appendString(nil, unsafe.String(unsafe.SliceData(f.val), len(f.val)))
	}
	return f.val
}

// Int returns the integer member key, or def when it is absent or not an integer.
func (in Input) Int(key string, def int) int {
	if f := in.lookup(key); f != nil && !f.str {
		if n, ok := jsonInt(f.val); ok {
			return int(n)
		}
	}
	return def
}

// Bool returns the boolean member key; false when it is absent or not a boolean.
func (in Input) Bool(key string) bool {
	f := in.lookup(key)
	return f != nil && !f.str && string(f.val) == "true"
}

// Strings returns the member key when it is an array of strings, else nil.
func (in Input) Strings(key string) []string {
	f := in.lookup(key)
	if f == nil || f.str {
		return nil
	}
	var out []string
	ok := arrayElems(f.val, func(e []byte) bool {
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
func (in Input) Raw(key string) []byte {
	f := in.lookup(key)
	if f == nil {
		return nil
	}
	return f.json()
}

// JSON returns the whole input object as raw JSON; it is valid only while Run runs. For a
// framed input it is built anew at each call (a copy of every member, escaped). An input
// too complex for the accessors can be decoded with json.Unmarshal(in.JSON(), &v); the
// kit itself does not link encoding/json.
func (in Input) JSON() []byte {
	if in.raw != nil {
		return in.raw
	}
	b := []byte{'{'}
	for i := range in.fields {
		f := &in.fields[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, unsafe.String(unsafe.SliceData(f.key), len(f.key)))
		b = append(b, ':')
		if f.str {
			b = appendString(b, unsafe.String(unsafe.SliceData(f.val), len(f.val)))
		} else {
			b = append(b, f.val...)
		}
	}
	return append(b, '}')
}
