package pdk

import (
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"unsafe"

	"github.com/toolhost/toolhost/abi"
)

// Tool is one tool a plugin provides.
type Tool struct {
	// Name is what the model calls: [a-zA-Z0-9_-]{1,64}, unique across loaded plugins.
	Name string
	// Description tells the model what the tool does, its defaults and its limits.
	Description string
	// Schema is the JSON Schema of the input: an object schema using only the keywords
	// ABI.md section 4 allows. The host validates every input against it before Run.
	Schema string
	// OutputSchema, optional, is the JSON Schema (an object schema, the same keywords) of
	// the tool's structured results: with one, every result that is not an error carries
	// Structured (see Structured), which the host checks against it (ABI.md section 4.1).
	OutputSchema string
	// Run does the work. Failures of the tool are results with IsError set (see Errorf),
	// never panics; a panic is still caught and becomes an error result.
	Run func(in Input) abi.Result
}

var (
	pluginName    string
	pluginVersion string
	tools         []Tool
	manifest      []byte
)

// Plugin names the plugin ([a-z0-9_-]{1,64}) and gives its version. Call it once, from an
// init function, before Register.
func Plugin(name, version string) {
	if pluginName != "" {
		panic("pdk: Plugin called twice")
	}
	if !validName(name, false) {
		panic("pdk: plugin name " + strconv.Quote(name) + " is not [a-z0-9_-]{1,64}")
	}
	pluginName, pluginVersion = name, version
	manifest = nil
}

// Register adds a tool. Call it from an init function. It panics on a bad name, a
// duplicate, a missing Run or a schema that is not a JSON object: those are bugs in the
// plugin, and a panic at load time makes the host refuse it with the message.
func Register(t Tool) {
	if !validName(t.Name, true) {
		panic("pdk: tool name " + strconv.Quote(t.Name) + " is not [a-zA-Z0-9_-]{1,64}")
	}
	for _, o := range tools {
		if o.Name == t.Name {
			panic("pdk: tool " + t.Name + " registered twice")
		}
	}
	if t.Run == nil {
		panic("pdk: tool " + t.Name + " has no Run function")
	}
	if _, ok := objectFields(nil, []byte(t.Schema)); !ok {
		panic("pdk: the schema of tool " + t.Name + " is not a valid JSON object")
	}
	tools = append(tools, t)
	manifest = nil
}

func validName(s string, upper bool) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' ||
			upper && c >= 'A' && c <= 'Z'
		if !ok {
			return false
		}
	}
	return true
}

// Errorf returns an error result (IsError set) holding the formatted text. It formats as
// fmt.Sprintf does for %s, %v, %q, %d, %x, %t and %% with strings, byte slices, errors,
// Stringers, booleans, integers and floats (flags and widths are not read): the kit does
// not link package fmt, which would add a third to every plugin's module.
func Errorf(format string, args ...any) abi.Result {
	return abi.ErrorText(sprintf(format, args))
}

// Manifest returns the manifest JSON that the toolhost_describe export returns.
func Manifest() []byte {
	if manifest != nil {
		return manifest
	}
	b := append([]byte(nil), `{"abi_version":`...)
	b = strconv.AppendInt(b, abi.Version, 10)
	b = append(b, `,"name":`...)
	b = appendString(b, pluginName)
	b = append(b, `,"version":`...)
	b = appendString(b, pluginVersion)
	b = append(b, `,"tools":[`...)
	for i, t := range tools {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = appendString(b, t.Name)
		b = append(b, `,"description":`...)
		b = appendString(b, t.Description)
		b = append(b, `,"input_schema":`...)
		b = append(b, t.Schema...)
		if t.OutputSchema != "" {
			b = append(b, `,"output_schema":`...)
			b = append(b, t.OutputSchema...)
		}
		b = append(b, '}')
	}
	b = append(b, `],"input_forms":["`...)
	b = append(b, abi.InputFramed1...)
	manifest = append(b, `"]}`...)
	return manifest
}

var (
	outBuf    []byte            // the last result; must stay valid until the next export call
	envBuf    []field           // reused for every request envelope
	fieldBuf  []field           // reused for every Input
	memberBuf []abi.InputMember // reused for every framed request
)

// Handle does what the toolhost_call export does: it decodes a request, framed (ABI.md
// section 9) or JSON ({"tool": ..., "input": {...}}), runs the tool and returns the result
// in the framed form of ABI.md section 5. The returned bytes are reused by the next call.
// Exported so tests can drive tools natively (package pdktest decodes the result).
func Handle(request []byte) []byte {
	if cap(outBuf) > 1<<20 {
		outBuf = nil // do not keep a huge result's buffer for the life of the instance
	}
	res := handle(request)
	outBuf = appendFramed(outBuf[:0], res)
	return outBuf
}

func handle(request []byte) abi.Result {
	if len(request) > 0 && request[0] == 0 {
		tool, members, err := abi.ParseFramedInput(request, memberBuf[:0])
		memberBuf = members[:0]
		if err != nil {
			return abi.ErrorText("Error: " + err.Error())
		}
		t := lookupTool(unsafe.String(unsafe.SliceData(tool), len(tool)))
		if t == nil {
			return noTool(string(tool))
		}
		in := Input{fields: framedFields(fieldBuf, members)}
		fieldBuf = in.fields[:0]
		return run(t, in)
	}
	var tool, input []byte
	fields, ok := objectFields(envBuf[:0], request)
	envBuf = fields[:0]
	if ok {
		for _, f := range fields {
			switch string(f.key) {
			case "tool":
				tool = f.val
			case "input":
				input = f.val
			}
		}
	}
	name, isStr := jsonString(tool)
	if !ok || !isStr {
		return abi.ErrorText(`Error: the request is not {"tool": NAME, "input": {...}}`)
	}
	t := lookupTool(name)
	if t == nil {
		return noTool(name)
	}
	in, err := parseInputInto(fieldBuf, input)
	if err != nil {
		return abi.ErrorText("Error: " + t.Name + ": " + err.Error())
	}
	fieldBuf = in.fields[:0]
	return run(t, in)
}

func lookupTool(name string) *Tool {
	for i := range tools {
		if tools[i].Name == name {
			return &tools[i]
		}
	}
	return nil
}

func noTool(name string) abi.Result {
	return abi.ErrorText("Error: plugin " + pluginName + " has no tool " + strconv.Quote(name))
}

// run calls the tool, turning a panic into an error result so the instance survives.
func run(t *Tool, in Input) (res abi.Result) {
	defer func() {
		if r := recover(); r != nil {
			res = abi.ErrorText("panic in " + t.Name + ": " + panicText(r))
		}
	}()
	return t.Run(in)
}

func panicText(r any) string {
	return sprintf("%v", []any{r})
}

// appendFramed encodes r in the framed form of ABI.md section 5: the magic, a flags byte,
// then each block as a kind byte and u32le-length-prefixed raw bytes. The host escapes the
// text and base64-encodes images, which it does far faster than a guest.
func appendFramed(b []byte, r abi.Result) []byte {
	b = append(b, abi.FramedMagic...)
	var flags byte
	if r.IsError {
		flags |= 1
	}
	b = append(b, flags)
	for _, c := range r.Content {
		switch {
		case c.Type == abi.ContentImage && c.Source != nil:
			data, err := c.Source.Raw, error(nil)
			if data == nil {
				data, err = base64.StdEncoding.DecodeString(c.Source.Data)
			}
			if err != nil || len(c.Source.MediaType) > 255 {
				return appendFramed(b[:0], abi.ErrorText("Error: the tool returned an image that is not valid base64 with a media type"))
			}
			b = append(b, 'i', byte(len(c.Source.MediaType)))
			b = append(b, c.Source.MediaType...)
			b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
			b = append(b, data...)
		case c.Held != 0: // a host buffer, then the text: the host has the bytes
			b = append(b, abi.FramedHeld)
			b = binary.LittleEndian.AppendUint32(b, c.Held)
			b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Text)))
			b = append(b, c.Text...)
		default:
			b = append(b, 't')
			b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Text)))
			b = append(b, c.Text...)
		}
	}
	if len(r.Structured) > 0 {
		b = append(b, 's')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Structured)))
		b = append(b, r.Structured...)
	}
	return b
}

// JSONObject builds the JSON object of a structured result (Tool.OutputSchema) without
// encoding/json, which the kit does not link: Str, Int, Bool and Raw add members in order,
// Bytes returns the object. Keys are written as given (plain names need no escaping).
type JSONObject struct{ b []byte }

func (o *JSONObject) key(k string) {
	if len(o.b) == 0 {
		o.b = append(o.b, '{')
	} else {
		o.b = append(o.b, ',')
	}
	o.b = appendString(o.b, k)
	o.b = append(o.b, ':')
}

// Str adds a string member (escaped as JSON, invalid UTF-8 as U+FFFD).
func (o *JSONObject) Str(k, v string) *JSONObject { o.key(k); o.b = appendString(o.b, v); return o }

// Int adds an integer member.
func (o *JSONObject) Int(k string, v int64) *JSONObject {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
	return o
}

// Bool adds a boolean member.
func (o *JSONObject) Bool(k string, v bool) *JSONObject {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
	return o
}

// Raw adds a member whose value is JSON already (an array built with JSONArray, an
// object's Bytes).
func (o *JSONObject) Raw(k string, v []byte) *JSONObject { o.key(k); o.b = append(o.b, v...); return o }

// Bytes is the object's JSON ("{}" when empty).
func (o *JSONObject) Bytes() abi.RawJSON {
	if len(o.b) == 0 {
		return abi.RawJSON("{}")
	}
	return abi.RawJSON(append(o.b, '}'))
}

// JSONArray joins JSON values (objects' Bytes, JSONString's) into an array.
func JSONArray(items [][]byte) []byte {
	b := []byte{'['}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, it...)
	}
	return append(b, ']')
}

// JSONString is s as a JSON string.
func JSONString(s string) []byte { return appendString(nil, s) }
