/*
 * toolhost.h: the toolhost plugin ABI, version 1, for C (and anything that reads C
 * headers). abi/ABI.md is the contract; this header states its exports, host functions,
 * status codes and constants in C, and a test (abi/header_test.go) fails when the two
 * disagree. Build a plugin with clang for wasm32-wasi as a reactor:
 *
 *   clang --target=wasm32-wasi -O2 -mexec-model=reactor -I abi -o p.wasm p.c
 *
 * Every pointer is an offset in the plugin's memory, every size a uint32_t; a host
 * function's int64_t result is a length (>= 0) or a negative status (TOOLHOST_E*), after
 * which toolhost_last_error gives the host's message (ABI.md section 3.1). A reply longer
 * than out_cap is parked: allocate its length and call toolhost_take (section 3.2).
 */
#ifndef TOOLHOST_H
#define TOOLHOST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TOOLHOST_ABI_VERSION 1

/* A host function of ABI.md section 3, and an export of section 2. */
#define TOOLHOST_IMPORT(module, name) __attribute__((import_module(module), import_name(name)))
#define TOOLHOST_EXPORT(name) __attribute__((export_name(name)))

/* A packed i64: ptr << 32 | len (toolhost_describe, toolhost_call). */
#define TOOLHOST_PACK(ptr, len) (((int64_t)(uint32_t)(uintptr_t)(ptr) << 32) | (int64_t)(uint32_t)(len))

/* Statuses (ABI.md section 3.1). */
#define TOOLHOST_EPERM (-1)
#define TOOLHOST_ENOENT (-2)
#define TOOLHOST_EIO (-5)
#define TOOLHOST_EFAULT (-14)
#define TOOLHOST_EEXIST (-17)
#define TOOLHOST_EXDEV (-18)
#define TOOLHOST_ENOTDIR (-20)
#define TOOLHOST_EISDIR (-21)
#define TOOLHOST_EINVAL (-22)
#define TOOLHOST_EFBIG (-27)
#define TOOLHOST_ETIME (-62)
#define TOOLHOST_ESTALE (-116)

/* toolhost_log_write levels. */
#define TOOLHOST_LOG_DEBUG (-4)
#define TOOLHOST_LOG_INFO 0
#define TOOLHOST_LOG_WARN 4
#define TOOLHOST_LOG_ERROR 8

/* The framed result (section 5) and the framed input (section 9): magic, then blocks. */
#define TOOLHOST_FRAMED_RESULT_MAGIC "\0thr1"
#define TOOLHOST_FRAMED_INPUT_MAGIC "\0thi1"
#define TOOLHOST_FRAMED_MAGIC_LEN 5
#define TOOLHOST_FRAMED_IS_ERROR 0x01
#define TOOLHOST_BLOCK_TEXT 't'
#define TOOLHOST_BLOCK_IMAGE 'i'
#define TOOLHOST_BLOCK_STRUCTURED 's'
/* A text block that begins with a host buffer (section 5.1): 'h', u32 id, u32 length, bytes. */
#define TOOLHOST_BLOCK_HELD 'h'
#define TOOLHOST_MAX_HOST_BUFFERS 64

/*
 * Exports (section 2): the plugin defines these, marked with TOOLHOST_EXPORT and the
 * same name. _initialize comes from the reactor's start files (-mexec-model=reactor).
 */
int32_t toolhost_abi_version(void);
int64_t toolhost_describe(void);
uint8_t *toolhost_input_buffer(uint32_t size);
int64_t toolhost_call(uint32_t len);

/* Host functions (section 3), by import module; each module is one grant. */

/* toolhost (grant: none) */
TOOLHOST_IMPORT("toolhost", "take")
int64_t toolhost_take(uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost", "last_error")
int64_t toolhost_last_error(uint8_t *out_ptr, uint32_t out_cap);

/* toolhost_session (grant: none) */
TOOLHOST_IMPORT("toolhost_session", "get")
int64_t toolhost_session_get(const uint8_t *key_ptr, uint32_t key_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_session", "set")
int64_t toolhost_session_set(const uint8_t *key_ptr, uint32_t key_len, const uint8_t *data_ptr, uint32_t data_len);

/* toolhost_log (grant: "log") */
TOOLHOST_IMPORT("toolhost_log", "write")
void toolhost_log_write(int32_t level, const uint8_t *msg_ptr, uint32_t msg_len);

/* toolhost_sandbox_exec (grant: "sandbox_exec") */
TOOLHOST_IMPORT("toolhost_sandbox_exec", "run")
int64_t toolhost_sandbox_exec_run(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_sandbox_exec", "process")
int64_t toolhost_sandbox_exec_process(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_sandbox_exec", "terminal_start")
int64_t toolhost_sandbox_exec_terminal_start(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_sandbox_exec", "terminal_io")
int64_t toolhost_sandbox_exec_terminal_io(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);

/* toolhost_sandbox_files (grant: "sandbox_files") */
TOOLHOST_IMPORT("toolhost_sandbox_files", "read")
int64_t toolhost_sandbox_files_read(const uint8_t *path_ptr, uint32_t path_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_sandbox_files", "read_text")
int64_t toolhost_sandbox_files_read_text(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_sandbox_files", "write")
int64_t toolhost_sandbox_files_write(const uint8_t *path_ptr, uint32_t path_len, const uint8_t *data_ptr, uint32_t data_len);
TOOLHOST_IMPORT("toolhost_sandbox_files", "read_versioned")
int64_t toolhost_sandbox_files_read_versioned(const uint8_t *path_ptr, uint32_t path_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_sandbox_files", "write_versioned")
int64_t toolhost_sandbox_files_write_versioned(const uint8_t *path_ptr, uint32_t path_len, const uint8_t *data_ptr, uint32_t data_len, const uint8_t *version_ptr, uint32_t version_len);
TOOLHOST_IMPORT("toolhost_sandbox_files", "remove")
int64_t toolhost_sandbox_files_remove(const uint8_t *path_ptr, uint32_t path_len);
TOOLHOST_IMPORT("toolhost_sandbox_files", "stat")
int64_t toolhost_sandbox_files_stat(const uint8_t *path_ptr, uint32_t path_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_sandbox_files", "list")
int64_t toolhost_sandbox_files_list(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);

/* toolhost_store (grant: "store") */
TOOLHOST_IMPORT("toolhost_store", "put")
int64_t toolhost_store_put(const uint8_t *key_ptr, uint32_t key_len, const uint8_t *data_ptr, uint32_t data_len);
TOOLHOST_IMPORT("toolhost_store", "get")
int64_t toolhost_store_get(const uint8_t *key_ptr, uint32_t key_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_store", "list")
int64_t toolhost_store_list(const uint8_t *prefix_ptr, uint32_t prefix_len, uint8_t *out_ptr, uint32_t out_cap);
TOOLHOST_IMPORT("toolhost_store", "delete")
int64_t toolhost_store_delete(const uint8_t *key_ptr, uint32_t key_len);

/* toolhost_capture (grant: "capture") */
TOOLHOST_IMPORT("toolhost_capture", "capture")
int64_t toolhost_capture_capture(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);

/* toolhost_web (grant: "web") */
TOOLHOST_IMPORT("toolhost_web", "fetch")
int64_t toolhost_web_fetch(const uint8_t *req_ptr, uint32_t req_len, uint8_t *out_ptr, uint32_t out_cap);

#ifdef __cplusplus
}
#endif

#endif /* TOOLHOST_H */
