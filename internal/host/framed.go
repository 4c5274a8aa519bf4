package host

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
)

// parseFramed decodes a framed result (ABI.md section 5): the magic, a flags byte (bit 0:
// is_error), then blocks until the end: 't' + u32le length + UTF-8 text, or 'i' + u8 media
// type length + media type + u32le length + raw image bytes. The host does the escaping
// and base64 a guest would otherwise do byte by byte.
//
// A block of kind abi.FramedHeld ('h' + u32le buffer id + u32le length + UTF-8 text) is a
// text block whose text is the named host buffer of the call (bufs) followed by the text.
// A name bufs does not hold is an error: the guest named a buffer it was never given, or
// one of an earlier call.
func parseFramed(raw []byte, bufs *hostBuffers) (abi.Result, error) {
	b := raw[len(abi.FramedMagic):]
	if len(b) < 1 {
		return abi.Result{}, errors.New("framed result: no flags byte")
	}
	res := abi.Result{IsError: b[0]&1 != 0, Content: []abi.Content{}}
	b = b[1:]
	u32 := func(what string) (int, error) {
		if len(b) < 4 {
			return 0, fmt.Errorf("framed result: block %d: %s length cut short", len(res.Content), what)
		}
		n := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if n > len(b) {
			return 0, fmt.Errorf("framed result: block %d: %s of %d bytes runs past the end", len(res.Content), what, n)
		}
		return n, nil
	}
	expanded := 0 // the bytes host buffers add to the result, bounded as the result is
	for len(b) > 0 {
		kind := b[0]
		b = b[1:]
		switch kind {
		case 't':
			n, err := u32("text")
			if err != nil {
				return res, err
			}
			text := string(b[:n])
			if !utf8.ValidString(text) { // ValidString is fast on ASCII; ToValidUTF8 is not
				text = strings.ToValidUTF8(text, "\uFFFD")
			}
			res.Content = append(res.Content, abi.Content{Type: abi.ContentText, Text: text})
			b = b[n:]
		case abi.FramedHeld:
			if len(b) < 4 {
				return res, fmt.Errorf("framed result: block %d: host buffer id cut short", len(res.Content))
			}
			id := binary.LittleEndian.Uint32(b)
			b = b[4:]
			n, err := u32("text")
			if err != nil {
				return res, err
			}
			held, err := bufs.get(id)
			if err != nil {
				return res, fmt.Errorf("framed result: block %d: %w", len(res.Content), err)
			}
			if expanded += len(held); expanded > maxResultBytes {
				return res, fmt.Errorf("framed result: block %d: the host buffers it names add up to more than the %d-byte result limit", len(res.Content), maxResultBytes)
			}
			text := string(held) + string(b[:n])
			if !utf8.ValidString(text) {
				text = strings.ToValidUTF8(text, "\uFFFD")
			}
			res.Content = append(res.Content, abi.Content{Type: abi.ContentText, Text: text})
			b = b[n:]
		case 'i':
			if len(b) < 1 || int(b[0]) > len(b)-1 {
				return res, fmt.Errorf("framed result: block %d: media type cut short", len(res.Content))
			}
			mt := string(b[1 : 1+int(b[0])])
			b = b[1+int(b[0]):]
			n, err := u32("image")
			if err != nil {
				return res, err
			}
			res.Content = append(res.Content, abi.Content{Type: abi.ContentImage, Source: &abi.ImageSource{
				Type: "base64", MediaType: mt, Data: base64.StdEncoding.EncodeToString(b[:n]),
			}})
			b = b[n:]
		case 's': // the structured result (JSON), once; checked against the output schema later
			n, err := u32("structured result")
			if err != nil {
				return res, err
			}
			if res.Structured != nil {
				return res, errors.New("framed result: two structured results")
			}
			res.Structured = abi.RawJSON(append([]byte{}, b[:n]...))
			b = b[n:]
		default:
			return res, fmt.Errorf("framed result: block %d: unknown kind %q", len(res.Content), kind)
		}
	}
	return res, nil
}
