package pdk

import (
	"strconv"

	"github.com/toolhost/toolhost/abi"
)

// Fetch GETs an http or https URL through the host's egress gateway, within the plugin's
// web scope (capability web; ABI.md section 3.5). Every destination, every redirect and
// every address a name resolves to is decided by the gateway as a sandbox's would be: a
// refused one is an error matching ErrPermission whose message is the gateway's reason,
// written for the model. The reply's body is the raw bytes (at most req.MaxBytes, and the
// host's bound of 5 MiB), owned by the caller.
func Fetch(req abi.FetchRequest) (abi.FetchReply, []byte, error) {
	var rep abi.FetchReply
	b := append(reqBuf[:0], `{"url":`...)
	b = appendString(b, req.URL)
	if req.Accept != "" {
		b = append(b, `,"accept":`...)
		b = appendString(b, req.Accept)
	}
	if req.MaxBytes > 0 {
		b = append(b, `,"max_bytes":`...)
		b = strconv.AppendInt(b, int64(req.MaxBytes), 10)
	}
	if req.TimeoutMS > 0 {
		b = append(b, `,"timeout_ms":`...)
		b = strconv.AppendInt(b, int64(req.TimeoutMS), 10)
	}
	enc := requestBuf(append(b, '}'))
	out, _, err := reply("fetch", func(out []byte) int64 { return rawFetch(enc, out) })
	if err != nil {
		return rep, nil, err
	}
	i := indexNewline(out)
	if i < 0 {
		return rep, nil, decodeError("fetch")
	}
	fields, ok := members(out[:i])
	if !ok {
		return rep, nil, decodeError("fetch")
	}
	for _, f := range fields {
		v := f.val
		switch string(f.key) {
		case "url":
			rep.URL, _ = jsonString(v)
		case "status":
			n, _ := jsonInt(v)
			rep.Status = int(n)
		case "content_type":
			rep.ContentType, _ = jsonString(v)
		case "body_len":
			n, _ := jsonInt(v)
			rep.BodyLen = int(n)
		case "truncated":
			rep.Truncated = string(v) == "true"
		}
	}
	body := out[i+1:]
	if rep.BodyLen != len(body) {
		return rep, nil, decodeError("fetch")
	}
	// A copy: out aliases the reply buffer, which the next host call reuses.
	return rep, append([]byte(nil), body...), nil
}
