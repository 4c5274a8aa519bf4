package pdk

import (
	"strconv"

	"github.com/toolhost/toolhost/abi"
)

// Capture takes a screenshot pair of a page served inside the sandbox (capability
// capture): desktop 1280x800 and mobile 390x844, as WebP. It names a port and a path,
// never a URL; port 0 means the session's dev server. The images are returned raw: put
// them in a result with Image, which never base64-encodes them in the plugin.
func Capture(req abi.CaptureRequest) (rep abi.CaptureReply, desktop, mobile []byte, err error) {
	enc := requestBuf(appendCaptureRequest(reqBuf[:0], req))
	b, _, err := reply("capture", func(out []byte) int64 { return rawCapture(enc, out) })
	if err != nil {
		return rep, nil, nil, err
	}
	i := indexNewline(b)
	if i < 0 {
		return rep, nil, nil, decodeError("capture")
	}
	var ok bool
	if rep, ok = decodeCaptureReply(b[:i]); !ok {
		return rep, nil, nil, decodeError("capture")
	}
	rest := b[i+1:]
	d, m := rep.Desktop.Bytes, rep.Mobile.Bytes
	if d < 0 || m < 0 || d+m != len(rest) {
		return rep, nil, nil, decodeError("capture")
	}
	// Copies: b aliases the reply buffer, which the next host call reuses.
	return rep, append([]byte(nil), rest[:d]...), append([]byte(nil), rest[d:]...), nil
}

// Image is a content block holding an image's raw bytes (image/webp, image/png,
// image/jpeg or image/gif).
func Image(mediaType string, data []byte) abi.Content {
	return abi.Content{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: mediaType, Raw: data}}
}

// StorePut writes data under key in the plugin's own corner of the object store
// (capability store). Keys are relative: letters, digits, '.', '_', '-' and '/'.
func StorePut(key string, data []byte) error {
	if n := rawStorePut(key, data); n < 0 {
		return statusError("store put", n)
	}
	return nil
}

// StoreGet reads the object at key; a missing one is an error matching ErrNotFound.
func StoreGet(key string) ([]byte, error) {
	b, owned, err := reply("store get", func(out []byte) int64 { return rawStoreGet(key, out) })
	if err != nil {
		return nil, err
	}
	if !owned {
		b = append([]byte(nil), b...)
	}
	return b, nil
}

// StoreList lists the plugin's objects whose keys start with prefix ("" for all).
func StoreList(prefix string) ([]abi.StoreObject, error) {
	b, _, err := reply("store list", func(out []byte) int64 { return rawStoreList(prefix, out) })
	if err != nil {
		return nil, err
	}
	objects, ok := decodeStoreList(b)
	if !ok {
		return nil, decodeError("store list")
	}
	return objects, nil
}

// StoreDelete removes the object at key; removing a missing key is not an error.
func StoreDelete(key string) error {
	if n := rawStoreDelete(key); n < 0 {
		return statusError("store delete", n)
	}
	return nil
}

func appendCaptureRequest(b []byte, r abi.CaptureRequest) []byte {
	b = append(b, '{')
	if r.Port != 0 {
		b = append(b, `"port":`...)
		b = strconv.AppendInt(b, int64(r.Port), 10)
	}
	if r.Path != "" {
		if r.Port != 0 {
			b = append(b, ',')
		}
		b = append(b, `"path":`...)
		b = appendString(b, r.Path)
	}
	return append(b, '}')
}

// decodeCaptureReply decodes the header line of a capture reply.
func decodeCaptureReply(b []byte) (r abi.CaptureReply, ok bool) {
	d := cursor{b: b}
	ok = d.object(func(key []byte) bool {
		switch string(key) {
		case "port":
			r.Port = int(d.int())
		case "page":
			r.Page = d.str()
		case "desktop":
			return d.shot(&r.Desktop)
		case "mobile":
			return d.shot(&r.Mobile)
		case "blocked":
			return d.strings(&r.Blocked)
		case "page_errors":
			return d.strings(&r.PageErrors)
		case "store_error":
			r.StoreError = d.str()
		default:
			return d.skip()
		}
		return d.i >= 0
	})
	return r, ok && d.end()
}

func (d *cursor) shot(s *abi.Shot) bool {
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "width":
			s.Width = int(d.int())
		case "height":
			s.Height = int(d.int())
		case "bytes":
			s.Bytes = int(d.int())
		case "status":
			s.Status = int(d.int())
		case "idle":
			s.Idle = d.boolean()
		case "key":
			s.Key = d.str()
		case "url":
			s.URL = d.str()
		default:
			return d.skip()
		}
		return d.i >= 0
	})
}

// strings reads an array of strings, or null.
func (d *cursor) strings(out *[]string) bool {
	if d.null() {
		return true
	}
	return d.array(func() bool {
		if d.peek() != '"' {
			return false
		}
		*out = append(*out, d.str())
		return d.i >= 0
	})
}

// decodeStoreList decodes a store list reply: {"objects": [{"key": ..., "size": ...}]}.
func decodeStoreList(b []byte) (objects []abi.StoreObject, ok bool) {
	d := cursor{b: b}
	ok = d.object(func(key []byte) bool {
		if string(key) != "objects" {
			return d.skip()
		}
		if d.null() {
			return true
		}
		return d.array(func() bool {
			var o abi.StoreObject
			ok := d.object(func(key []byte) bool {
				switch string(key) {
				case "key":
					o.Key = d.str()
				case "size":
					o.Size = d.int()
				default:
					return d.skip()
				}
				return d.i >= 0
			})
			objects = append(objects, o)
			return ok
		})
	})
	if objects == nil {
		objects = []abi.StoreObject{}
	}
	return objects, ok && d.end()
}
