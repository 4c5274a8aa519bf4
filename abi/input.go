package abi

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// The framed input (ABI.md section 9): the request in a binary form whose string members
// are already decoded, so a plugin reads a 64 KB file content as one copy instead of
// scanning and unescaping it byte by byte. The host sends it only to a plugin whose
// manifest lists InputFramed1 in its input_forms; every other plugin gets the JSON request
// of section 5. Package internal/framedinput encodes a decoded JSON object this way.

// InputFramed1 names the framed input in a manifest's input_forms.
const InputFramed1 = "framed1"

// FramedInputMagic starts a framed request; a JSON request never starts with a NUL byte.
const FramedInputMagic = "\x00thi1"

// Member kinds of a framed input.
const (
	// MemberString: the value is a JSON string's text, decoded (UTF-8, no quotes, no
	// escapes).
	MemberString byte = 's'
	// MemberJSON: the value is the JSON text of any other value (number, boolean, null,
	// array, object), as the host encodes it.
	MemberJSON byte = 'j'
)

// InputMember is one member of the tool input of a framed request. Key and Value point
// into the bytes they were parsed from.
type InputMember struct {
	Kind  byte
	Key   []byte
	Value []byte
}

// AppendFramedInput appends the framed request of tool with the given members: the magic,
// a u8 length and the tool's name, then for each member its kind byte, a u32 little-endian
// length and the key, a u32 little-endian length and the value.
func AppendFramedInput(b []byte, tool string, members []InputMember) []byte {
	b = append(b, FramedInputMagic...)
	b = append(b, byte(len(tool)))
	b = append(b, tool...)
	for _, m := range members {
		b = append(b, m.Kind)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Key)))
		b = append(b, m.Key...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Value)))
		b = append(b, m.Value...)
	}
	return b
}

// FramedInputSize is the length of the framed request AppendFramedInput makes.
func FramedInputSize(tool string, members []InputMember) int {
	n := len(FramedInputMagic) + 1 + len(tool)
	for _, m := range members {
		n += 9 + len(m.Key) + len(m.Value)
	}
	return n
}

// ParseFramedInput splits a framed request into its tool name and its members, appended to
// dst. Nothing is copied: the results point into b.
func ParseFramedInput(b []byte, dst []InputMember) (tool []byte, members []InputMember, err error) {
	if len(b) < len(FramedInputMagic)+1 || string(b[:len(FramedInputMagic)]) != FramedInputMagic {
		return nil, dst, errors.New("framed input: no magic")
	}
	b = b[len(FramedInputMagic):]
	n := int(b[0])
	if n > len(b)-1 {
		return nil, dst, errors.New("framed input: tool name cut short")
	}
	tool, b = b[1:1+n], b[1+n:]
	field := func(what string) ([]byte, error) {
		if len(b) < 4 {
			return nil, errors.New("framed input: member " + strconv.Itoa(len(dst)) + ": " + what + " length cut short")
		}
		n := binary.LittleEndian.Uint32(b)
		if uint64(n) > uint64(len(b)-4) {
			return nil, errors.New("framed input: member " + strconv.Itoa(len(dst)) + ": " + what + " runs past the end")
		}
		v := b[4 : 4+n]
		b = b[4+n:]
		return v, nil
	}
	for len(b) > 0 {
		m := InputMember{Kind: b[0]}
		if m.Kind != MemberString && m.Kind != MemberJSON {
			return nil, dst, errors.New("framed input: member " + strconv.Itoa(len(dst)) + ": unknown kind " + strconv.QuoteRune(rune(m.Kind)))
		}
		b = b[1:]
		if m.Key, err = field("key"); err != nil {
			return nil, dst, err
		}
		if m.Value, err = field("value"); err != nil {
			return nil, dst, err
		}
		dst = append(dst, m)
	}
	return tool, dst, nil
}
