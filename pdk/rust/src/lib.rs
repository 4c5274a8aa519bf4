//! The Rust plugin kit of toolhost: a WebAssembly tool plugin in a few lines of Rust, that
//! speaks the ABI of `abi/ABI.md` (version 1). It has no dependencies, so it builds offline
//! with Debian's rustc and cargo and the `wasm32-wasi` standard library.
//!
//! ```ignore
//! use toolhost_pdk::{host, Error, Input, Plugin, Tool, ToolResult};
//!
//! fn plugin() -> Plugin {
//!     Plugin::new("wc", "1.0.0").tool(Tool::new(
//!         "count_lines",
//!         "Counts the lines of a text file in the workspace.",
//!         r#"{"type": "object", "additionalProperties": false, "required": ["path"],
//!             "properties": {"path": {"type": "string", "minLength": 1}}}"#,
//!         count_lines,
//!     ))
//! }
//! toolhost_pdk::export!(plugin);
//!
//! fn count_lines(input: &Input) -> Result<ToolResult, Error> {
//!     let data = host::read_file(input.str("path")?)?;
//!     Ok(ToolResult::text(data.iter().filter(|&&b| b == b'\n').count().to_string()))
//! }
//! ```
//!
//! Build it as a `cdylib` for `wasm32-wasi` (`wasm32-wasip1` on a newer rustc):
//! `cargo build --release --target wasm32-wasi`.
//!
//! The kit implements the exports (`toolhost_abi_version`, `toolhost_describe`,
//! `toolhost_input_buffer`, `toolhost_call`) through [`export!`], reads the JSON request of
//! ABI.md section 5 and returns the framed result (raw text, no escaping). A tool returns
//! `Err(e)` for a failure: the result is then an error whose text is `Error: ` and the
//! error's message (for a host call, the host's own message, as ABI.md section 3.1 asks).

pub mod host;
pub mod json;

pub use host::{Error, Level};
pub use json::Value;

/// A tool's handler.
pub type Handler = fn(&Input) -> Result<ToolResult, Error>;

/// A tool: its name, what it does (for the model), the JSON Schema of its input, and the
/// function that runs it.
pub struct Tool {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: &'static str,
    pub run: Handler,
}

impl Tool {
    pub fn new(name: &'static str, description: &'static str, schema: &'static str, run: Handler) -> Tool {
        Tool { name, description, schema, run }
    }
}

/// A plugin: its name (`[a-z0-9_-]{1,64}`), version and tools.
pub struct Plugin {
    pub name: &'static str,
    pub version: &'static str,
    pub tools: Vec<Tool>,
}

impl Plugin {
    pub fn new(name: &'static str, version: &'static str) -> Plugin {
        Plugin { name, version, tools: Vec::new() }
    }

    /// Adds a tool.
    pub fn tool(mut self, t: Tool) -> Plugin {
        self.tools.push(t);
        self
    }

    /// The manifest JSON of ABI.md section 4. A schema that is not valid JSON is kept as it
    /// is, so the host refuses the plugin at load saying so.
    pub fn manifest(&self) -> String {
        let mut out = String::from("{\"abi_version\":1,\"name\":");
        json::write_string(&mut out, self.name);
        out.push_str(",\"version\":");
        json::write_string(&mut out, self.version);
        out.push_str(",\"tools\":[");
        for (i, t) in self.tools.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"name\":");
            json::write_string(&mut out, t.name);
            out.push_str(",\"description\":");
            json::write_string(&mut out, t.description);
            out.push_str(",\"input_schema\":");
            out.push_str(t.schema);
            out.push('}');
        }
        // Requests come framed (section 9) from hosts that know the form; JSON from others.
        out.push_str("],\"input_forms\":[\"framed1\"]}");
        out
    }

    /// Handles one request, framed (ABI.md section 9) or JSON (section 5), and returns the
    /// framed result.
    pub fn handle(&self, request: &[u8]) -> Vec<u8> {
        let (name, input) = if request.first() == Some(&0) {
            match framed_request(request) {
                Ok(r) => r,
                Err(e) => return ToolResult::error(e).framed(),
            }
        } else {
            let req = match json::parse(request) {
                Ok(v) => v,
                Err(e) => return ToolResult::error(format!("the request is not valid JSON: {}", e)).framed(),
            };
            let name = req.get("tool").and_then(Value::as_str).unwrap_or("").to_string();
            (name, req.get("input").cloned().unwrap_or(Value::Object(Vec::new())))
        };
        let tool = match self.tools.iter().find(|t| t.name == name) {
            Some(t) => t,
            None => return ToolResult::error(format!("unknown tool {}", name)).framed(),
        };
        match (tool.run)(&Input { value: input }) {
            Ok(r) => r.framed(),
            Err(e) => ToolResult::error(format!("Error: {}", e)).framed(),
        }
    }
}

/// Reads a framed request (ABI.md section 9): the tool's name and its input as an object
/// (a string member is its bytes, taken as UTF-8; any other member is JSON text).
fn framed_request(b: &[u8]) -> Result<(String, Value), String> {
    if !b.starts_with(b"\x00thi1") || b.len() < 6 {
        return Err("the request is in a framed form this plugin does not read".to_string());
    }
    let n = b[5] as usize;
    let name = b.get(6..6 + n).ok_or("the framed request is cut short")?;
    let mut members = Vec::new();
    let mut at = 6 + n;
    let u32_at = |at: usize| -> Option<usize> { Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize) };
    while at < b.len() {
        let malformed = || "the framed request's input is malformed".to_string();
        let kind = b[at];
        let klen = u32_at(at + 1).ok_or_else(malformed)?;
        let key = b.get(at + 5..at + 5 + klen).ok_or_else(malformed)?;
        at += 5 + klen;
        let vlen = u32_at(at).ok_or_else(malformed)?;
        let val = b.get(at + 4..at + 4 + vlen).ok_or_else(malformed)?;
        at += 4 + vlen;
        let v = match kind {
            b's' => Value::String(String::from_utf8_lossy(val).into_owned()),
            _ => json::parse(val).map_err(|e| format!("the framed request's member {}: {}", String::from_utf8_lossy(key), e))?,
        };
        members.push((String::from_utf8_lossy(key).into_owned(), v));
    }
    Ok((String::from_utf8_lossy(name).into_owned(), Value::Object(members)))
}

/// A tool's input: the JSON object the host checked against the tool's schema.
pub struct Input {
    pub value: Value,
}

impl Input {
    /// The member `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.value.get(key)
    }

    fn want<'a, T>(&'a self, key: &str, kind: &str, f: impl Fn(&'a Value) -> Option<T>) -> Result<T, Error> {
        match self.value.get(key) {
            None => Err(Error::input(format!("{}: required property is missing", key))),
            Some(v) => f(v).ok_or_else(|| Error::input(format!("{}: must be {}, got {}", key, kind, v.kind()))),
        }
    }

    /// The string member `key`.
    pub fn str(&self, key: &str) -> Result<&str, Error> {
        self.want(key, "string", Value::as_str)
    }

    /// The integer member `key`.
    pub fn i64(&self, key: &str) -> Result<i64, Error> {
        self.want(key, "integer", Value::as_i64)
    }

    /// The boolean member `key`.
    pub fn bool(&self, key: &str) -> Result<bool, Error> {
        self.want(key, "boolean", Value::as_bool)
    }

    /// The member `key`, an array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<String>, Error> {
        self.want(key, "array of strings", |v| {
            v.as_array()?.iter().map(|s| s.as_str().map(String::from)).collect::<Option<Vec<_>>>()
        })
    }
}

/// One block of a result.
pub enum Block {
    /// Text (UTF-8; the host replaces invalid bytes with U+FFFD).
    Text(Vec<u8>),
    /// An image's raw bytes and media type (`image/png`, `image/webp`, `image/jpeg`,
    /// `image/gif`).
    Image { media_type: &'static str, data: Vec<u8> },
}

/// A tool's result.
pub struct ToolResult {
    pub content: Vec<Block>,
    pub is_error: bool,
}

impl ToolResult {
    /// A result of one text block.
    pub fn text(s: impl Into<String>) -> ToolResult {
        ToolResult { content: vec![Block::Text(s.into().into_bytes())], is_error: false }
    }

    /// A result of one text block from bytes (a program's output), taken as UTF-8 by the host.
    pub fn text_bytes(b: Vec<u8>) -> ToolResult {
        ToolResult { content: vec![Block::Text(b)], is_error: false }
    }

    /// An error result of one text block.
    pub fn error(s: impl Into<String>) -> ToolResult {
        ToolResult { content: vec![Block::Text(s.into().into_bytes())], is_error: true }
    }

    /// The framed form of ABI.md section 5.
    pub fn framed(&self) -> Vec<u8> {
        let mut out = b"\x00thr1".to_vec();
        out.push(self.is_error as u8);
        for b in &self.content {
            match b {
                Block::Text(t) => {
                    out.push(b't');
                    out.extend_from_slice(&(t.len() as u32).to_le_bytes());
                    out.extend_from_slice(t);
                }
                Block::Image { media_type, data } => {
                    out.push(b'i');
                    out.push(media_type.len() as u8);
                    out.extend_from_slice(media_type.as_bytes());
                    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                    out.extend_from_slice(data);
                }
            }
        }
        out
    }
}

// The exports' memory (ABI.md section 2): the input buffer stays in place until the next
// toolhost_input_buffer; a returned result stays valid until the next export call. A
// plugin instance runs one export at a time.
static mut INPUT: Vec<u8> = Vec::new();
static mut OUTPUT: Vec<u8> = Vec::new();

fn pack(b: &[u8]) -> i64 {
    ((b.as_ptr() as u32 as i64) << 32) | b.len() as u32 as i64
}

// Through raw pointers (addr_of_mut!), never a reference to the static itself: the one
// export running at a time is the only user.
fn input() -> &'static mut Vec<u8> {
    unsafe { &mut *std::ptr::addr_of_mut!(INPUT) }
}

fn output() -> &'static mut Vec<u8> {
    unsafe { &mut *std::ptr::addr_of_mut!(OUTPUT) }
}

#[doc(hidden)]
pub fn __describe(p: fn() -> Plugin) -> i64 {
    let out = output();
    *out = p().manifest().into_bytes();
    pack(out)
}

#[doc(hidden)]
pub fn __input_buffer(size: i32) -> i32 {
    let buf = input();
    let size = size as u32 as usize;
    if buf.len() < size {
        *buf = vec![0; size];
    }
    buf.as_mut_ptr() as i32
}

#[doc(hidden)]
pub fn __call(p: fn() -> Plugin, len: i32) -> i64 {
    let (buf, out) = (input(), output());
    let len = (len as u32 as usize).min(buf.len());
    *out = Vec::new(); // the last result's memory back before this call's
    *out = p().handle(&buf[..len]);
    pack(out)
}

/// Exports the ABI's functions for the plugin that `f` (a `fn() -> Plugin`) describes.
/// Use it once, in the crate of the plugin (a `cdylib`).
#[macro_export]
macro_rules! export {
    ($f:path) => {
        #[no_mangle]
        pub extern "C" fn toolhost_abi_version() -> i32 {
            1
        }
        #[no_mangle]
        pub extern "C" fn toolhost_describe() -> i64 {
            $crate::__describe($f)
        }
        #[no_mangle]
        pub extern "C" fn toolhost_input_buffer(size: i32) -> i32 {
            $crate::__input_buffer(size)
        }
        #[no_mangle]
        pub extern "C" fn toolhost_call(len: i32) -> i64 {
            $crate::__call($f, len)
        }
    };
}
