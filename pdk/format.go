package pdk

import (
	"strconv"
	"unicode/utf8"
)

// The kit formats without package fmt: fmt brings os, reflect and time with it, a third of
// a plugin's module, which the host decodes and validates at every load.

// stringer is fmt.Stringer.
type stringer interface{ String() string }

// sprintf formats as fmt.Sprintf does for the verbs a tool's message needs: %s, %v, %q,
// %d, %x, %t and %%, with strings, byte slices, errors, Stringers, booleans, integers,
// floats and nil. Flags and widths are not read; a value of another type prints as
// %!v(unsupported), a missing one as %!v(MISSING).
func sprintf(format string, args []any) string {
	b := make([]byte, 0, len(format)+16*len(args))
	n := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		i++
		for i < len(format) && (format[i] == '+' || format[i] == '-' || format[i] == '#' || format[i] == ' ' ||
			format[i] == '.' || format[i] >= '0' && format[i] <= '9') {
			i++ // flags and widths are skipped
		}
		if i >= len(format) {
			b = append(b, "%!(NOVERB)"...)
			break
		}
		verb := format[i]
		if verb == '%' {
			b = append(b, '%')
			continue
		}
		if n >= len(args) {
			b = append(b, '%', '!', verb)
			b = append(b, "(MISSING)"...)
			continue
		}
		b = appendArg(b, verb, args[n])
		n++
	}
	if n < len(args) {
		b = append(b, "%!(EXTRA)"...)
	}
	return string(b)
}

func appendArg(b []byte, verb byte, a any) []byte {
	var s string
	switch v := a.(type) {
	case nil:
		s = "<nil>"
	case string:
		s = v
	case []byte:
		s = string(v)
	case error:
		s = v.Error()
	case stringer:
		s = v.String()
	case bool:
		s = strconv.FormatBool(v)
	case int:
		return appendInt(b, verb, int64(v))
	case int8:
		return appendInt(b, verb, int64(v))
	case int16:
		return appendInt(b, verb, int64(v))
	case int32:
		return appendInt(b, verb, int64(v))
	case int64:
		return appendInt(b, verb, v)
	case uint:
		return appendUint(b, verb, uint64(v))
	case uint8:
		return appendUint(b, verb, uint64(v))
	case uint16:
		return appendUint(b, verb, uint64(v))
	case uint32:
		return appendUint(b, verb, uint64(v))
	case uint64:
		return appendUint(b, verb, v)
	case uintptr:
		return appendUint(b, verb, uint64(v))
	case float64:
		return strconv.AppendFloat(b, v, 'g', -1, 64)
	case float32:
		return strconv.AppendFloat(b, float64(v), 'g', -1, 32)
	default:
		return append(b, "%!v(unsupported)"...)
	}
	switch verb {
	case 'q':
		return strconv.AppendQuote(b, s)
	case 'x':
		const hex = "0123456789abcdef"
		for i := 0; i < len(s); i++ {
			b = append(b, hex[s[i]>>4], hex[s[i]&0xf])
		}
		return b
	}
	return append(b, s...)
}

func appendInt(b []byte, verb byte, v int64) []byte {
	switch verb {
	case 'x':
		return strconv.AppendInt(b, v, 16)
	case 'q':
		if v >= 0 && v <= utf8.MaxRune {
			return strconv.AppendQuoteRune(b, rune(v))
		}
	}
	return strconv.AppendInt(b, v, 10)
}

func appendUint(b []byte, verb byte, v uint64) []byte {
	if verb == 'x' {
		return strconv.AppendUint(b, v, 16)
	}
	return strconv.AppendUint(b, v, 10)
}
