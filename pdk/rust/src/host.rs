//! The host functions of ABI.md section 3, with the two-call reply protocol (section 3.2)
//! and a reusable buffer, so most replies take one host call. Each function belongs to a
//! capability the plugin must be granted (log, sandbox_files, sandbox_exec); the linker
//! imports only the functions a plugin calls, so a plugin needs only the grants it uses.

use crate::json::{self, Value};
use std::fmt;

/// A failed host call: the status of ABI.md section 3.1 and the host's message
/// (`toolhost.last_error`), written for a person or a model to read. A tool's own failure
/// (bad input) has status [`Error::EINVAL`] and a message of its own.
#[derive(Clone, Debug)]
pub struct Error {
    pub status: i64,
    pub message: String,
}

impl Error {
    pub const EPERM: i64 = -1;
    pub const ENOENT: i64 = -2;
    pub const EIO: i64 = -5;
    pub const EFAULT: i64 = -14;
    pub const EEXIST: i64 = -17;
    pub const EXDEV: i64 = -18;
    pub const ENOTDIR: i64 = -20;
    pub const EISDIR: i64 = -21;
    pub const EINVAL: i64 = -22;
    pub const EFBIG: i64 = -27;
    pub const ETIME: i64 = -62;
    pub const ESTALE: i64 = -116;

    /// An error of the tool's input.
    pub fn input(message: String) -> Error {
        Error { status: Error::EINVAL, message }
    }

    /// The error of a negative status, with the host's message.
    fn last(status: i64, op: &str) -> Error {
        let mut buf = vec![0u8; 512];
        let mut n = unsafe { imports::last_error(buf.as_mut_ptr(), buf.len() as u32) };
        if n as usize > buf.len() {
            buf = vec![0u8; n as usize];
            n = unsafe { imports::last_error(buf.as_mut_ptr(), buf.len() as u32) };
        }
        buf.truncate(n.max(0).min(buf.len() as i64) as usize);
        let mut message = String::from_utf8_lossy(&buf).into_owned();
        if message.is_empty() {
            message = format!("{}: status {}", op, status);
        }
        Error { status, message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Log levels of `toolhost_log.write`.
#[derive(Clone, Copy, Debug)]
pub enum Level {
    Debug = -4,
    Info = 0,
    Warn = 4,
    Error = 8,
}

#[cfg(target_arch = "wasm32")]
mod imports {
    #[link(wasm_import_module = "toolhost")]
    extern "C" {
        pub fn take(out: *mut u8, cap: u32) -> i64;
        pub fn last_error(out: *mut u8, cap: u32) -> i64;
    }
    #[link(wasm_import_module = "toolhost_log")]
    extern "C" {
        #[link_name = "write"]
        pub fn log_write(level: i32, msg: *const u8, len: u32);
    }
    #[link(wasm_import_module = "toolhost_sandbox_files")]
    extern "C" {
        #[link_name = "read"]
        pub fn files_read(path: *const u8, path_len: u32, out: *mut u8, cap: u32) -> i64;
        #[link_name = "write"]
        pub fn files_write(path: *const u8, path_len: u32, data: *const u8, data_len: u32) -> i64;
        #[link_name = "stat"]
        pub fn files_stat(path: *const u8, path_len: u32, out: *mut u8, cap: u32) -> i64;
        #[link_name = "list"]
        pub fn files_list(req: *const u8, req_len: u32, out: *mut u8, cap: u32) -> i64;
        #[link_name = "remove"]
        pub fn files_remove(path: *const u8, path_len: u32) -> i64;
    }
    #[link(wasm_import_module = "toolhost_sandbox_exec")]
    extern "C" {
        #[link_name = "run"]
        pub fn exec_run(req: *const u8, req_len: u32, out: *mut u8, cap: u32) -> i64;
    }
}

// Built for another target (cargo test on the build machine), every host call fails with
// EPERM, as outside a tool call.
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::missing_safety_doc)]
mod imports {
    pub unsafe fn take(_: *mut u8, _: u32) -> i64 {
        -2
    }
    pub unsafe fn last_error(_: *mut u8, _: u32) -> i64 {
        0
    }
    pub unsafe fn log_write(_: i32, _: *const u8, _: u32) {}
    pub unsafe fn files_read(_: *const u8, _: u32, _: *mut u8, _: u32) -> i64 {
        -1
    }
    pub unsafe fn files_write(_: *const u8, _: u32, _: *const u8, _: u32) -> i64 {
        -1
    }
    pub unsafe fn files_stat(_: *const u8, _: u32, _: *mut u8, _: u32) -> i64 {
        -1
    }
    pub unsafe fn files_list(_: *const u8, _: u32, _: *mut u8, _: u32) -> i64 {
        -1
    }
    pub unsafe fn files_remove(_: *const u8, _: u32) -> i64 {
        -1
    }
    pub unsafe fn exec_run(_: *const u8, _: u32, _: *mut u8, _: u32) -> i64 {
        -1
    }
}

/// The reusable reply buffer: 4 KiB, growing to 64 KiB for larger replies.
static mut BUF: Vec<u8> = Vec::new();

/// Calls a host function with an output buffer and returns its whole reply, through
/// toolhost.take when it is larger than the buffer.
fn reply(op: &str, f: impl Fn(*mut u8, u32) -> i64) -> Result<Vec<u8>, Error> {
    let buf = unsafe { &mut *std::ptr::addr_of_mut!(BUF) };
    if buf.is_empty() {
        *buf = vec![0; 4096];
    }
    let n = f(buf.as_mut_ptr(), buf.len() as u32);
    if n < 0 {
        return Err(Error::last(n, op));
    }
    let n = n as usize;
    if n <= buf.len() {
        return Ok(buf[..n].to_vec());
    }
    let mut out = vec![0u8; n];
    let m = unsafe { imports::take(out.as_mut_ptr(), n as u32) };
    if m < 0 {
        return Err(Error::last(m, op));
    }
    out.truncate(m as usize);
    if n > buf.len() && buf.len() < 64 << 10 {
        *buf = vec![0; n.min(64 << 10)];
    }
    Ok(out)
}

/// Writes a message to the host's log, attributed to the plugin (grant `log`).
pub fn log(level: Level, msg: &str) {
    unsafe { imports::log_write(level as i32, msg.as_ptr(), msg.len() as u32) }
}

/// The file's bytes (grant `sandbox_files`). Paths are relative to the workspace.
pub fn read_file(path: &str) -> Result<Vec<u8>, Error> {
    reply("read", |out, cap| unsafe { imports::files_read(path.as_ptr(), path.len() as u32, out, cap) })
}

/// Creates or replaces the file, creating its parent directories (grant `sandbox_files`).
pub fn write_file(path: &str, data: &[u8]) -> Result<(), Error> {
    let n = unsafe { imports::files_write(path.as_ptr(), path.len() as u32, data.as_ptr(), data.len() as u32) };
    if n < 0 {
        return Err(Error::last(n, "write"));
    }
    Ok(())
}

/// Removes a file or symbolic link (grant `sandbox_files`).
pub fn remove(path: &str) -> Result<(), Error> {
    let n = unsafe { imports::files_remove(path.as_ptr(), path.len() as u32) };
    if n < 0 {
        return Err(Error::last(n, "remove"));
    }
    Ok(())
}

fn parse_reply(op: &str, b: &[u8]) -> Result<Value, Error> {
    json::parse(b).map_err(|e| Error { status: Error::EIO, message: format!("{}: the host's reply is not JSON: {}", op, e) })
}

/// The file's metadata, as ABI.md's `stat` gives it (grant `sandbox_files`).
pub fn stat(path: &str) -> Result<Value, Error> {
    let b = reply("stat", |out, cap| unsafe { imports::files_stat(path.as_ptr(), path.len() as u32, out, cap) })?;
    parse_reply("stat", &b)
}

/// A directory's entries: `req` is the request JSON of ABI.md's `list`, such as
/// `{"path": ".", "recursive": true}` (grant `sandbox_files`).
pub fn list(req: &str) -> Result<Value, Error> {
    let b = reply("list", |out, cap| unsafe { imports::files_list(req.as_ptr(), req.len() as u32, out, cap) })?;
    parse_reply("list", &b)
}

/// A command to run in the sandbox (grant `sandbox_exec`): argv runs directly, never
/// through a shell.
pub struct Exec {
    argv: Vec<String>,
    cwd: Option<String>,
    env: Vec<(String, String)>,
    timeout_ms: i64,
}

/// What a command did.
pub struct ExecResult {
    /// -1 when a signal killed it.
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The bytes the host dropped from the middle of each stream.
    pub stdout_cut: i64,
    pub stderr_cut: i64,
    pub timed_out: bool,
    /// The reply's header, for what the fields above leave out.
    pub header: Value,
}

impl Exec {
    pub fn new<S: AsRef<str>>(argv: &[S]) -> Exec {
        Exec { argv: argv.iter().map(|s| s.as_ref().to_string()).collect(), cwd: None, env: Vec::new(), timeout_ms: 0 }
    }

    /// The working directory, relative to the workspace.
    pub fn cwd(mut self, dir: &str) -> Exec {
        self.cwd = Some(dir.to_string());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Exec {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Bounds the command (the host clamps it to its maximum; 0 is the host's default).
    pub fn timeout_ms(mut self, ms: i64) -> Exec {
        self.timeout_ms = ms;
        self
    }

    /// The request JSON.
    pub fn request(&self) -> String {
        let mut members = vec![("argv".to_string(), Value::Array(self.argv.iter().map(|a| Value::String(a.clone())).collect()))];
        if let Some(cwd) = &self.cwd {
            members.push(("cwd".to_string(), Value::String(cwd.clone())));
        }
        if !self.env.is_empty() {
            members.push(("env".to_string(), Value::Object(self.env.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())));
        }
        if self.timeout_ms > 0 {
            members.push(("timeout_ms".to_string(), Value::Number(self.timeout_ms.to_string())));
        }
        Value::Object(members).to_json()
    }

    /// Runs the command and waits for it.
    pub fn run(&self) -> Result<ExecResult, Error> {
        let req = self.request();
        let b = reply("exec", |out, cap| unsafe { imports::exec_run(req.as_ptr(), req.len() as u32, out, cap) })?;
        let nl = b.iter().position(|&c| c == b'\n').unwrap_or(b.len());
        let header = parse_reply("exec", &b[..nl])?;
        let num = |k: &str| header.get(k).and_then(Value::as_i64).unwrap_or(0);
        let rest = b.get(nl + 1..).unwrap_or(&[]);
        let so = (num("stdout_len").max(0) as usize).min(rest.len());
        let se = (num("stderr_len").max(0) as usize).min(rest.len() - so);
        Ok(ExecResult {
            exit_code: num("exit_code"),
            stdout: rest[..so].to_vec(),
            stderr: rest[so..so + se].to_vec(),
            stdout_cut: num("stdout_cut"),
            stderr_cut: num("stderr_cut"),
            timed_out: header.get("timed_out").and_then(Value::as_bool).unwrap_or(false),
            header,
        })
    }
}

/// The plugin's configuration value `key` (a WASI environment variable, ABI.md section 6).
pub fn config(key: &str) -> Option<String> {
    std::env::var(key).ok()
}
