// A small JSON reader and writer over UTF-8 bytes: enough for the requests, replies and
// manifests of the ABI. Strings are decoded from UTF-8 into AssemblyScript's UTF-16
// strings here, at the boundary, and encoded back by Bytes.appendString.

/** A growable byte buffer. */
export class Bytes {
  buf: Uint8Array;
  length: i32 = 0;

  constructor(capacity: i32 = 64) {
    this.buf = new Uint8Array(capacity > 0 ? capacity : 64);
  }

  private grow(extra: i32): void {
    const need = this.length + extra;
    if (need <= this.buf.length) return;
    let cap = this.buf.length * 2;
    if (cap < need) cap = need;
    const next = new Uint8Array(cap);
    memory.copy(next.dataStart, this.buf.dataStart, <usize>this.length);
    this.buf = next;
  }

  push(b: u8): void {
    this.grow(1);
    store<u8>(this.buf.dataStart + <usize>this.length, b);
    this.length++;
  }

  appendRaw(ptr: usize, len: i32): void {
    if (len <= 0) return;
    this.grow(len);
    memory.copy(this.buf.dataStart + <usize>this.length, ptr, <usize>len);
    this.length += len;
  }

  append(b: Uint8Array): void {
    this.appendRaw(b.dataStart, b.length);
  }

  /** Appends s encoded as UTF-8. */
  appendString(s: string): void {
    const n = String.UTF8.byteLength(s);
    this.grow(n);
    String.UTF8.encodeUnsafe(changetype<usize>(s), s.length, this.buf.dataStart + <usize>this.length);
    this.length += n;
  }

  appendU32(v: u32): void {
    this.grow(4);
    store<u32>(this.buf.dataStart + <usize>this.length, v);
    this.length += 4;
  }

  /** The bytes written, as a view (no copy). */
  bytes(): Uint8Array {
    return this.buf.subarray(0, this.length);
  }
}

/** A string's UTF-8 bytes. */
export function utf8(s: string): Uint8Array {
  return Uint8Array.wrap(String.UTF8.encode(s));
}

/** Bytes taken as UTF-8 (invalid sequences are not checked). */
export function fromUTF8(b: Uint8Array): string {
  return String.UTF8.decodeUnsafe(b.dataStart, <usize>b.length);
}

export const enum Kind {
  Null,
  Bool,
  Number,
  String,
  Array,
  Object,
}

/** A JSON value. Objects keep their members in order; get finds a repeated key's last. */
export class Value {
  kind: Kind = Kind.Null;
  bool: bool = false;
  /** A number's JSON text. */
  number: string = "";
  str: string = "";
  items: Value[] = [];
  keys: string[] = [];
  values: Value[] = [];

  get(key: string): Value | null {
    for (let i = this.keys.length - 1; i >= 0; i--) {
      if (this.keys[i] == key) return this.values[i];
    }
    return null;
  }

  isString(): bool {
    return this.kind == Kind.String;
  }

  /** The number as an integer (0 when it is none). */
  asI64(): i64 {
    return this.kind == Kind.Number ? I64.parseInt(this.number) : 0;
  }

  asF64(): f64 {
    return this.kind == Kind.Number ? F64.parseFloat(this.number) : 0;
  }

  kindName(): string {
    switch (this.kind) {
      case Kind.Null: return "null";
      case Kind.Bool: return "boolean";
      case Kind.Number: return "number";
      case Kind.String: return "string";
      case Kind.Array: return "array";
      default: return "object";
    }
  }
}

/** Parses JSON; on failure returns null and sets parseError. */
export let parseError: string = "";

export function parse(b: Uint8Array): Value | null {
  const p = new Parser(b);
  p.ws();
  const v = p.value();
  if (v === null) {
    parseError = p.err;
    return null;
  }
  p.ws();
  if (p.i != b.length) {
    parseError = "unexpected bytes after the value at byte " + p.i.toString();
    return null;
  }
  return v;
}

const MAX_DEPTH = 512;

class Parser {
  i: i32 = 0;
  err: string = "";
  depth: i32 = 0;
  scratch: Bytes = new Bytes(256);

  constructor(public b: Uint8Array) {}

  at(i: i32): i32 {
    return i < this.b.length ? <i32>load<u8>(this.b.dataStart + <usize>i) : -1;
  }

  fail(msg: string): Value | null {
    if (this.err.length == 0) this.err = msg + " at byte " + this.i.toString();
    return null;
  }

  ws(): void {
    while (true) {
      const c = this.at(this.i);
      if (c == 0x20 || c == 0x09 || c == 0x0a || c == 0x0d) this.i++;
      else return;
    }
  }

  lit(word: string, v: Value): Value | null {
    for (let k = 0; k < word.length; k++) {
      if (this.at(this.i + k) != word.charCodeAt(k)) return this.fail("invalid literal");
    }
    this.i += word.length;
    return v;
  }

  value(): Value | null {
    const c = this.at(this.i);
    if (c == 0x7b || c == 0x5b) {
      if (++this.depth > MAX_DEPTH) return this.fail("nested too deep");
      const v = c == 0x7b ? this.object() : this.array();
      this.depth--;
      return v;
    }
    if (c == 0x22) {
      const s = this.string();
      if (s === null) return null;
      const v = new Value();
      v.kind = Kind.String;
      v.str = s;
      return v;
    }
    if (c == 0x74 || c == 0x66) {
      const v = new Value();
      v.kind = Kind.Bool;
      v.bool = c == 0x74;
      return this.lit(c == 0x74 ? "true" : "false", v);
    }
    if (c == 0x6e) return this.lit("null", new Value());
    if (c == 0x2d || (c >= 0x30 && c <= 0x39)) return this.num();
    return this.fail("unexpected character");
  }

  object(): Value | null {
    this.i++;
    const v = new Value();
    v.kind = Kind.Object;
    this.ws();
    if (this.at(this.i) == 0x7d) {
      this.i++;
      return v;
    }
    while (true) {
      this.ws();
      if (this.at(this.i) != 0x22) return this.fail("expected a key");
      const k = this.string();
      if (k === null) return null;
      this.ws();
      if (this.at(this.i) != 0x3a) return this.fail("expected ':'");
      this.i++;
      this.ws();
      const m = this.value();
      if (m === null) return null;
      v.keys.push(k);
      v.values.push(m);
      this.ws();
      const c = this.at(this.i);
      this.i++;
      if (c == 0x2c) continue;
      if (c == 0x7d) return v;
      this.i--;
      return this.fail("expected ',' or '}'");
    }
  }

  array(): Value | null {
    this.i++;
    const v = new Value();
    v.kind = Kind.Array;
    this.ws();
    if (this.at(this.i) == 0x5d) {
      this.i++;
      return v;
    }
    while (true) {
      this.ws();
      const m = this.value();
      if (m === null) return null;
      v.items.push(m);
      this.ws();
      const c = this.at(this.i);
      this.i++;
      if (c == 0x2c) continue;
      if (c == 0x5d) return v;
      this.i--;
      return this.fail("expected ',' or ']'");
    }
  }

  num(): Value | null {
    const start = this.i;
    while (true) {
      const c = this.at(this.i);
      if (c == 0x2d || c == 0x2b || c == 0x2e || c == 0x65 || c == 0x45 || (c >= 0x30 && c <= 0x39)) this.i++;
      else break;
    }
    const v = new Value();
    v.kind = Kind.Number;
    v.number = String.UTF8.decodeUnsafe(this.b.dataStart + <usize>start, <usize>(this.i - start));
    return v;
  }

  hex4(): i32 {
    let v = 0;
    for (let k = 0; k < 4; k++) {
      const c = this.at(this.i + k);
      let d = -1;
      if (c >= 0x30 && c <= 0x39) d = c - 0x30;
      else if (c >= 0x61 && c <= 0x66) d = c - 0x61 + 10;
      else if (c >= 0x41 && c <= 0x46) d = c - 0x41 + 10;
      if (d < 0) return -1;
      v = (v << 4) | d;
    }
    this.i += 4;
    return v;
  }

  // A string: runs without escapes are decoded straight from the input; escapes go
  // through the scratch buffer as UTF-8, decoded once at the end.
  string(): string | null {
    this.i++;
    const out = this.scratch;
    out.length = 0;
    let escaped = false;
    while (true) {
      const start = this.i;
      let c = this.at(this.i);
      while (c != 0x22 && c != 0x5c && c != -1) {
        this.i++;
        c = this.at(this.i);
      }
      if (c == -1) {
        this.fail("unterminated string");
        return null;
      }
      if (c == 0x22 && !escaped) {
        this.i++;
        return String.UTF8.decodeUnsafe(this.b.dataStart + <usize>start, <usize>(this.i - 1 - start));
      }
      out.appendRaw(this.b.dataStart + <usize>start, this.i - start);
      if (c == 0x22) {
        this.i++;
        return fromUTF8(out.bytes());
      }
      escaped = true;
      this.i++; // the backslash
      const e = this.at(this.i);
      this.i++;
      let cp = -1;
      if (e == 0x22) cp = 0x22;
      else if (e == 0x5c) cp = 0x5c;
      else if (e == 0x2f) cp = 0x2f;
      else if (e == 0x62) cp = 8;
      else if (e == 0x66) cp = 12;
      else if (e == 0x6e) cp = 10;
      else if (e == 0x72) cp = 13;
      else if (e == 0x74) cp = 9;
      else if (e == 0x75) {
        const hi = this.hex4();
        if (hi < 0) {
          this.fail("invalid \\u escape");
          return null;
        }
        cp = hi;
        if (hi >= 0xd800 && hi < 0xdc00 && this.at(this.i) == 0x5c && this.at(this.i + 1) == 0x75) {
          const save = this.i;
          this.i += 2;
          const lo = this.hex4();
          if (lo >= 0xdc00 && lo < 0xe000) cp = 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
          else {
            this.i = save;
            cp = 0xfffd;
          }
        } else if (hi >= 0xd800 && hi < 0xe000) cp = 0xfffd;
      } else {
        this.i--;
        this.fail("invalid escape");
        return null;
      }
      appendCodePoint(out, cp);
    }
  }
}

function appendCodePoint(out: Bytes, cp: i32): void {
  if (cp < 0x80) out.push(<u8>cp);
  else if (cp < 0x800) {
    out.push(<u8>(0xc0 | (cp >> 6)));
    out.push(<u8>(0x80 | (cp & 63)));
  } else if (cp < 0x10000) {
    out.push(<u8>(0xe0 | (cp >> 12)));
    out.push(<u8>(0x80 | ((cp >> 6) & 63)));
    out.push(<u8>(0x80 | (cp & 63)));
  } else {
    out.push(<u8>(0xf0 | (cp >> 18)));
    out.push(<u8>(0x80 | ((cp >> 12) & 63)));
    out.push(<u8>(0x80 | ((cp >> 6) & 63)));
    out.push(<u8>(0x80 | (cp & 63)));
  }
}

const HEX = "0123456789abcdef";

/** Appends s to out as a JSON string (quoted, escaped, UTF-8). */
export function writeString(out: Bytes, s: string): void {
  out.push(0x22);
  let start = 0;
  for (let k = 0; k < s.length; k++) {
    const c = s.charCodeAt(k);
    if (c >= 0x20 && c != 0x22 && c != 0x5c) continue;
    if (k > start) out.appendString(s.substring(start, k));
    start = k + 1;
    out.push(0x5c);
    if (c == 0x22) out.push(0x22);
    else if (c == 0x5c) out.push(0x5c);
    else if (c == 0x0a) out.push(0x6e);
    else if (c == 0x0d) out.push(0x72);
    else if (c == 0x09) out.push(0x74);
    else {
      out.push(0x75);
      out.push(0x30);
      out.push(0x30);
      out.push(<u8>HEX.charCodeAt(c >> 4));
      out.push(<u8>HEX.charCodeAt(c & 15));
    }
  }
  if (s.length > start) out.appendString(start == 0 ? s : s.substring(start));
  out.push(0x22);
}
