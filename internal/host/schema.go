package host

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// schema is a compiled JSON Schema of the subset ABI.md allows. Compiling refuses every
// other keyword, so a schema never means less than it says.
type schema struct {
	types                []string // nil: any type
	properties           map[string]*schema
	required             []string
	additionalProperties *bool
	items                *schema
	enum                 []any
	minimum, maximum     *float64
	minLength, maxLength *int
	minItems, maxItems   *int
}

var annotationKeywords = map[string]bool{
	"description": true, "title": true, "default": true, "examples": true, "$schema": true,
}

var schemaTypes = []string{"object", "array", "string", "integer", "number", "boolean", "null"}

// compileToolSchema compiles a tool's input schema, which must describe an object.
func compileToolSchema(raw json.RawMessage) (*schema, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("input_schema is missing")
	}
	s, err := compileSchema(raw, "")
	if err != nil {
		return nil, err
	}
	if !slices.Equal(s.types, []string{"object"}) {
		return nil, errors.New(`input_schema must have "type": "object"`)
	}
	return s, nil
}

// compileOutputSchema compiles a tool's output schema (the keywords of input schemas),
// which must describe an object: MCP's structuredContent is one.
func compileOutputSchema(raw json.RawMessage) (*schema, error) {
	s, err := compileSchema(raw, "")
	if err != nil {
		return nil, fmt.Errorf("output_schema: %w", err)
	}
	if !slices.Equal(s.types, []string{"object"}) {
		return nil, errors.New(`output_schema must have "type": "object"`)
	}
	return s, nil
}

func compileSchema(raw json.RawMessage, at string) (*schema, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("schema%s: not a JSON object: %w", at, err)
	}
	s := &schema{}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic errors
	for _, k := range keys {
		v := m[k]
		where := fmt.Sprintf("schema%s.%s", at, k)
		var err error
		switch k {
		case "type":
			s.types, err = compileTypes(v)
		case "properties":
			var props map[string]json.RawMessage
			if err = json.Unmarshal(v, &props); err != nil {
				break
			}
			s.properties = make(map[string]*schema, len(props))
			for name, p := range props {
				if s.properties[name], err = compileSchema(p, at+".properties."+name); err != nil {
					return nil, err
				}
			}
		case "required":
			err = json.Unmarshal(v, &s.required)
		case "additionalProperties":
			var b bool
			if err = json.Unmarshal(v, &b); err == nil {
				s.additionalProperties = &b
			} else {
				err = errors.New("only a boolean is supported")
			}
		case "items":
			s.items, err = compileSchema(v, at+".items")
			if err != nil {
				return nil, err
			}
		case "enum":
			err = json.Unmarshal(v, &s.enum)
			if err == nil && len(s.enum) == 0 {
				err = errors.New("must list at least one value")
			}
		case "minimum":
			s.minimum, err = compileFloat(v)
		case "maximum":
			s.maximum, err = compileFloat(v)
		case "minLength":
			s.minLength, err = compileCount(v)
		case "maxLength":
			s.maxLength, err = compileCount(v)
		case "minItems":
			s.minItems, err = compileCount(v)
		case "maxItems":
			s.maxItems, err = compileCount(v)
		default:
			if !annotationKeywords[k] {
				return nil, fmt.Errorf("%s: unsupported schema keyword", where)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	for _, r := range s.required {
		if s.properties != nil && s.properties[r] == nil {
			return nil, fmt.Errorf("schema%s.required: %q is not among the properties", at, r)
		}
	}
	return s, nil
}

func compileTypes(v json.RawMessage) ([]string, error) {
	var one string
	if json.Unmarshal(v, &one) == nil {
		v = json.RawMessage(`["` + one + `"]`)
	}
	var list []string
	if err := json.Unmarshal(v, &list); err != nil || len(list) == 0 {
		return nil, errors.New("must be a type name or a list of them")
	}
	for _, t := range list {
		if !slices.Contains(schemaTypes, t) {
			return nil, fmt.Errorf("unknown type %q", t)
		}
	}
	return list, nil
}

func compileFloat(v json.RawMessage) (*float64, error) {
	var f float64
	if err := json.Unmarshal(v, &f); err != nil {
		return nil, errors.New("must be a number")
	}
	return &f, nil
}

func compileCount(v json.RawMessage) (*int, error) {
	var n int
	if err := json.Unmarshal(v, &n); err != nil || n < 0 {
		return nil, errors.New("must be a non-negative integer")
	}
	return &n, nil
}

// validateInput decodes raw, checks it against s and returns it decoded (numbers as
// json.Number). The error names the offending property path and is written for the model
// that sent the input.
func (s *schema) validateInput(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("input is not valid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("input is not valid JSON: extra data after the object")
	}
	return v, s.validate(v, "")
}

func (s *schema) validate(v any, at string) error {
	name := at
	if name == "" {
		name = "input"
	}
	if s.types != nil && !slices.ContainsFunc(s.types, func(t string) bool { return hasType(v, t) }) {
		return fmt.Errorf("%s: must be %s, got %s", name, strings.Join(s.types, " or "), typeName(v))
	}
	if s.enum != nil && !slices.ContainsFunc(s.enum, func(e any) bool { return jsonEqual(e, v) }) {
		return fmt.Errorf("%s: must be one of %s", name, enumList(s.enum))
	}
	switch x := v.(type) {
	case map[string]any:
		for _, r := range s.required {
			if _, ok := x[r]; !ok {
				return fmt.Errorf("%s: required property is missing", join(at, r))
			}
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := s.properties[k]
			if p == nil {
				if s.additionalProperties != nil && !*s.additionalProperties {
					return fmt.Errorf("%s: unknown property (allowed: %s)", join(at, k), propertyList(s.properties))
				}
				continue
			}
			if err := p.validate(x[k], join(at, k)); err != nil {
				return err
			}
		}
	case []any:
		if s.minItems != nil && len(x) < *s.minItems {
			return fmt.Errorf("%s: must have at least %d items", name, *s.minItems)
		}
		if s.maxItems != nil && len(x) > *s.maxItems {
			return fmt.Errorf("%s: must have at most %d items", name, *s.maxItems)
		}
		if s.items != nil {
			for i, e := range x {
				if err := s.items.validate(e, fmt.Sprintf("%s[%d]", name, i)); err != nil {
					return err
				}
			}
		}
	case string:
		n := utf8.RuneCountInString(x)
		if s.minLength != nil && n < *s.minLength {
			return fmt.Errorf("%s: must be at least %d characters", name, *s.minLength)
		}
		if s.maxLength != nil && n > *s.maxLength {
			return fmt.Errorf("%s: must be at most %d characters", name, *s.maxLength)
		}
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if s.minimum != nil && f < *s.minimum {
			return fmt.Errorf("%s: must be at least %s", name, formatFloat(*s.minimum))
		}
		if s.maximum != nil && f > *s.maximum {
			return fmt.Errorf("%s: must be at most %s", name, formatFloat(*s.maximum))
		}
	}
	return nil
}

func hasType(v any, t string) bool {
	switch x := v.(type) {
	case map[string]any:
		return t == "object"
	case []any:
		return t == "array"
	case string:
		return t == "string"
	case bool:
		return t == "boolean"
	case nil:
		return t == "null"
	case json.Number:
		if t == "number" {
			return true
		}
		if t == "integer" {
			if _, err := strconv.ParseInt(x.String(), 10, 64); err == nil {
				return true
			}
			f, err := x.Float64()
			return err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53
		}
	}
	return false
}

func typeName(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case nil:
		return "null"
	case json.Number:
		if hasType(x, "integer") {
			return "integer"
		}
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

func jsonEqual(a, b any) bool {
	// enum values come from json.Unmarshal (float64), inputs from UseNumber (json.Number).
	if n, ok := b.(json.Number); ok {
		f, err := n.Float64()
		if err != nil {
			return false
		}
		b = f
	}
	ea, err1 := json.Marshal(a)
	eb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ea, eb)
}

func enumList(values []any) string {
	parts := make([]string, len(values))
	for i, v := range values {
		b, _ := json.Marshal(v)
		parts[i] = string(b)
	}
	return strings.Join(parts, ", ")
}

func propertyList(props map[string]*schema) string {
	if len(props) == 0 {
		return "none"
	}
	names := make([]string, 0, len(props))
	for k := range props {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func join(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
