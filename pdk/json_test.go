package pdk

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toolhost/toolhost/abi"
)

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{
		"", "plain", `q"uote`, `back\slash`, "nl\ncr\rtab\tbs\bff\f", "\x00\x01\x1f\x7f",
		"héllo wörld ✓ 😀", "bad \xff utf8 \xc3", "\u2028\u2029", "</script>&",
	} {
		got := string(appendString(nil, s))
		var back string
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Fatalf("%q encodes to invalid JSON %s: %v", s, got, err)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); back != want {
			t.Errorf("%q: round trip gives %q", s, back)
		}
	}
	if got := string(appendString(nil, "a\x01\"\\\xff")); got != `"a\u0001\"\\\ufffd"` {
		t.Errorf("escapes: %s", got)
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "abc", "\"\\\n\x00", "\xff\xfe", "€😀", "\u2028", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := appendString(nil, s)
		var back string
		if err := json.Unmarshal(enc, &back); err != nil {
			t.Fatalf("%q encodes to invalid JSON %s: %v", s, enc, err)
		}
		// encoding/json's decoder replaces each invalid byte the way ToValidUTF8 cannot
		// (one U+FFFD per bad byte), so compare with our own per-byte replacement.
		var want strings.Builder
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			want.WriteRune(r) // RuneError for a bad byte, with n == 1
			i += n
		}
		if back != want.String() {
			t.Fatalf("%q: round trip gives %q, want %q", s, back, want.String())
		}
		// Our own decoder reads it back the same.
		got, ok := jsonString(enc)
		if !ok || got != back {
			t.Fatalf("%q: jsonString gives %q, %v; want %q", s, got, ok, back)
		}
	})
}

func FuzzDecodeString(f *testing.F) {
	for _, s := range []string{`"a"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`, `"\ud83d\u0041"`, `"\/\b\f\n\r\t\"\\"`, `"\u00e9"`, `"a\u0000b"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // raw invalid bytes are kept on purpose; encoding/json replaces them
		}
		var want string
		wantErr := json.Unmarshal([]byte(s), &want) != nil
		got, ok := jsonString([]byte(s))
		if wantErr {
			if ok && strings.TrimSpace(s) == s {
				t.Fatalf("%q: accepted, encoding/json refuses it", s)
			}
			return
		}
		if strings.TrimSpace(s) != s {
			return // jsonString takes a bare token
		}
		if !ok || got != want {
			t.Fatalf("%q: got %q, %v; want %q", s, got, ok, want)
		}
	})
}

func TestSkipValue(t *testing.T) {
	good := []string{`0`, `-1.5e+10`, `"x"`, `true`, `null`, `[]`, `{}`, `[1, {"a": [null, "]}"]}, "x"]`, ` {"a" : {"b":[[]]} } `}
	bad := []string{``, `01`, `1.`, `-`, `"abc`, `"\x"`, "\"a\x01\"", `[1,]`, `{"a"}`, `{"a":1,}`, `tru`, `{1:2}`, `[1 2]`, strings.Repeat("[", 2000) + strings.Repeat("]", 2000)}
	for _, s := range good {
		b := []byte(s)
		if end := skipValue(b, 0); end < 0 || skipWS(b, end) != len(b) {
			t.Errorf("skipValue(%q) = %d", s, end)
		}
	}
	for _, s := range bad {
		b := []byte(s)
		if end := skipValue(b, 0); end >= 0 && skipWS(b, end) == len(b) {
			t.Errorf("skipValue(%q) accepted it", s)
		}
	}
}

func TestInputAccessors(t *testing.T) {
	in, err := ParseInput([]byte(`{
		"path": "d\u00e9j\u00e0\/x \"q\" \ud83d\ude00", "offset": 10, "big": 1e3, "frac": 2.5,
		"neg": -7, "flag": true, "off": false, "nil": null,
		"nested": {"path": "inner", "list": [1, {"x": "}"}]},
		"list": ["a", "b\n"], "mixed": ["a", 1],
		"k\u0065y": "escaped key", "dup": 1, "dup": 2
	}`))
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		got, want any
	}{
		{in.String("path"), "déjà/x \"q\" 😀"},
		{in.String("missing"), ""},
		{in.String("offset"), ""},
		{in.Int("offset", 1), 10},
		{in.Int("big", 1), 1000},
		{in.Int("frac", 1), 1},
		{in.Int("neg", 1), -7},
		{in.Int("missing", 42), 42},
		{in.Int("nil", 42), 42},
		{in.Bool("flag"), true},
		{in.Bool("off"), false},
		{in.Bool("missing"), false},
		{in.Has("nil"), false},
		{in.Has("nested"), true},
		{in.String("key"), "escaped key"},
		{in.Int("dup", 0), 2},
		{strings.Join(in.Strings("list"), "|"), "a|b\n"},
		{in.Strings("mixed") == nil, true},
		{string(in.Raw("nested")), `{"path": "inner", "list": [1, {"x": "}"}]}`},
	}
	for i, c := range checks {
		if c.got != c.want {
			t.Errorf("check %d: got %#v, want %#v", i, c.got, c.want)
		}
	}
	var v struct {
		Nested struct{ Path string }
	}
	if err := json.Unmarshal(in.JSON(), &v); err != nil || v.Nested.Path != "inner" {
		t.Errorf("Decode: %v %+v", err, v)
	}
	for _, s := range []string{``, `null`, `  `} {
		if in, err := ParseInput([]byte(s)); err != nil || in.Has("x") {
			t.Errorf("ParseInput(%q): %v", s, err)
		}
	}
	for _, s := range []string{`[]`, `{"a":}`, `{"a":1} x`, `"s"`} {
		if _, err := ParseInput([]byte(s)); err == nil {
			t.Errorf("ParseInput(%q) accepted it", s)
		}
	}
}

func TestAppendFramed(t *testing.T) {
	r := abi.Result{Content: []abi.Content{
		{Type: abi.ContentText, Text: "a\"b\x00\xff"},
		{Type: abi.ContentText},
		{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: "image/png", Data: "AAECAw=="}},
	}, IsError: true}
	b := appendFramed(nil, r)
	want := "\x00thr1\x01" + "t\x05\x00\x00\x00a\"b\x00\xff" + "t\x00\x00\x00\x00" + "i\x09image/png\x04\x00\x00\x00\x00\x01\x02\x03"
	if string(b) != want {
		t.Errorf("framed\n got %q\nwant %q", b, want)
	}
	back, err := decodeFramed(b)
	if err != nil || !back.IsError || len(back.Content) != 3 || back.Content[0].Text != "a\"b\x00\xff" || back.Content[2].Source.Data != "AAECAw==" {
		t.Errorf("round trip: %+v %v", back, err)
	}
	bad := appendFramed(nil, abi.Result{Content: []abi.Content{{Type: abi.ContentImage, Source: &abi.ImageSource{Data: "!!"}}}})
	if back, _ := decodeFramed(bad); !back.IsError || !strings.Contains(back.Content[0].Text, "not valid base64") {
		t.Errorf("bad image: %q", bad)
	}
}

// decodeFramed is a test-side reader of the framed form (pdktest has the full one).
func decodeFramed(b []byte) (abi.Result, error) {
	if !strings.HasPrefix(string(b), abi.FramedMagic) || len(b) < 6 {
		return abi.Result{}, errors.New("not framed")
	}
	r := abi.Result{IsError: b[5]&1 != 0}
	b = b[6:]
	for len(b) > 0 {
		kind := b[0]
		var mt string
		b = b[1:]
		if kind == 'i' {
			mt, b = string(b[1:1+int(b[0])]), b[1+int(b[0]):]
		}
		n := int(binary.LittleEndian.Uint32(b))
		d := b[4 : 4+n]
		b = b[4+n:]
		switch kind {
		case 't':
			r.Content = append(r.Content, abi.Content{Type: abi.ContentText, Text: string(d)})
		case 'i':
			r.Content = append(r.Content, abi.Content{Type: abi.ContentImage, Source: &abi.ImageSource{Type: "base64", MediaType: mt, Data: base64.StdEncoding.EncodeToString(d)}})
		default:
			return r, errors.New("unknown block kind")
		}
	}
	return r, nil
}

// FuzzParseInput checks the scanner against encoding/json: the same objects are valid, and
// string and integer members read the same.
func FuzzParseInput(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"b"}`, `{"a":1,"b":[1,2,{"c":null}],"d":true}`, `{"a":"\ud83d\ude00\n"}`,
		`{"a":-0.5e3,"b":12345678901}`, `{"a" : "x" , }`, `{"a":01}`, `[{}]`, `{"a":"\u00"}`, ` {"k\"ey":"v"} `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		trimmed := strings.TrimLeft(s, " \t\r\n")
		if trimmed == "" || strings.TrimRight(trimmed, " \t\r\n") == "null" {
			return // both mean an empty input here, on purpose
		}
		in, err := ParseInput([]byte(s))
		isObj := json.Valid([]byte(s)) && strings.HasPrefix(trimmed, "{")
		if (err == nil) != isObj {
			t.Fatalf("%q: ParseInput err %v, json.Valid %v", s, err, json.Valid([]byte(s)))
		}
		if !isObj {
			return
		}
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber() // 1e700 is valid JSON but no float64
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		for k, v := range m {
			switch v := v.(type) {
			case string:
				if got := in.String(k); got != v {
					t.Fatalf("%q: String(%q) = %q, want %q", s, k, got, v)
				}
			case json.Number:
				if n, err := v.Int64(); err == nil && n < 1<<53 && n > -(1<<53) {
					if got := in.Int(k, -999); got != int(n) {
						t.Fatalf("%q: Int(%q) = %d, want %v", s, k, got, n)
					}
				}
			case bool:
				if got := in.Bool(k); got != v {
					t.Fatalf("%q: Bool(%q) = %v, want %v", s, k, got, v)
				}
			case nil:
				if in.Has(k) {
					t.Fatalf("%q: Has(%q) for null", s, k)
				}
			}
		}
	})
}

// TestJSONObject: the structured-result builder writes valid JSON, escaping what needs it,
// and a framed result carries it in its 's' block after the content.
func TestJSONObject(t *testing.T) {
	var inner JSONObject
	inner.Str("id", "bg-1").Int("pid", 42)
	var o JSONObject
	o.Str("s", "a\"b\n\x00\xff").Int("n", -3).Bool("ok", true).Raw("bg", inner.Bytes()).Raw("l", JSONArray([][]byte{JSONString("x"), JSONString("y")}))
	got := o.Bytes()
	want := `{"s":"a\"b\n\u0000\ufffd","n":-3,"ok":true,"bg":{"id":"bg-1","pid":42},"l":["x","y"]}`
	if string(got) != want || !json.Valid(got) {
		t.Errorf("got %s\nwant %s", got, want)
	}
	var empty JSONObject
	if string(empty.Bytes()) != "{}" {
		t.Errorf("an empty object: %s", empty.Bytes())
	}
	b := appendFramed(nil, abi.Result{Content: []abi.Content{{Type: abi.ContentText, Text: "hi"}}, Structured: got})
	tail := append([]byte{'s', byte(len(got)), 0, 0, 0}, got...)
	if !strings.HasSuffix(string(b), string(tail)) {
		t.Errorf("framed: %q does not end with the structured block", b)
	}
}
