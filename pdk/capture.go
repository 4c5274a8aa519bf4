package pdk

import (
	"encoding/json"

	"github.com/toolhost/toolhost/abi"
)

// Capture takes a screenshot pair of a page served inside the sandbox (capability
// capture): desktop 1280x800 and mobile 390x844, as WebP. It names a port and a path,
// never a URL; port 0 means the session's dev server. The images are returned raw: put
// them in a result with Image, which never base64-encodes them in the plugin.
func Capture(req abi.CaptureRequest) (rep abi.CaptureReply, desktop, mobile []byte, err error) {
	enc, _ := json.Marshal(req)
	b, _, err := reply("capture", func(out []byte) int64 { return rawCapture(enc, out) })
	if err != nil {
		return rep, nil, nil, err
	}
	i := indexNewline(b)
	if i < 0 || json.Unmarshal(b[:i], &rep) != nil {
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
	var out struct {
		Objects []abi.StoreObject `json:"objects"`
	}
	if json.Unmarshal(b, &out) != nil {
		return nil, decodeError("store list")
	}
	return out.Objects, nil
}

// StoreDelete removes the object at key; removing a missing key is not an error.
func StoreDelete(key string) error {
	if n := rawStoreDelete(key); n < 0 {
		return statusError("store delete", n)
	}
	return nil
}
