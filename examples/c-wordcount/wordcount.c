/*
 * wordcount: a toolhost plugin in C, written from abi/ABI.md alone.
 *
 * One tool, count_words {path}: the lines, words and bytes of a file in the workspace,
 * read through toolhost_sandbox_files.read (granted as sandbox_files). It shows the whole
 * contract a plugin in any language implements: the four exports, a host function with
 * the two-call reply protocol (take when the reply did not fit), last_error after a
 * negative status, the request and result JSON, and an error result for an unknown tool.
 *
 * Build (Debian: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32):
 *   clang --target=wasm32-wasi -O2 -mexec-model=reactor -o wordcount.wasm wordcount.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT(name) __attribute__((export_name(name)))
#define IMPORT(module, name) __attribute__((import_module(module), import_name(name)))

/* Host functions (ABI.md section 3.3): pointers and lengths are i32, results i64. */
IMPORT("toolhost", "take") int64_t host_take(void *out, uint32_t cap);
IMPORT("toolhost", "last_error") int64_t host_last_error(void *out, uint32_t cap);
IMPORT("toolhost_sandbox_files", "read")
int64_t host_read(const void *path, uint32_t path_len, void *out, uint32_t cap);

static const char manifest[] =
    "{\"abi_version\":1,\"name\":\"wordcount-c\",\"version\":\"1.0.0\",\"tools\":[{"
    "\"name\":\"count_words\","
    "\"description\":\"Counts the lines, words and bytes of a text file in the workspace "
    "(like wc). path is relative to /home/user or absolute within it.\","
    "\"input_schema\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\","
    "\"minLength\":1,\"description\":\"the file to count\"}},\"required\":[\"path\"],"
    "\"additionalProperties\":false}}]}";

static inline uint64_t pack(const void *ptr, uint32_t len) {
	return (uint64_t)(uintptr_t)ptr << 32 | len;
}

EXPORT("toolhost_abi_version") int32_t abi_version(void) { return 1; }

EXPORT("toolhost_describe") uint64_t describe(void) {
	return pack(manifest, sizeof manifest - 1);
}

/* The input buffer belongs to the plugin; the host asks for it once and reuses it. */
static char *input;
static uint32_t input_cap;

EXPORT("toolhost_input_buffer") char *input_buffer(uint32_t size) {
	if (size > input_cap) {
		char *p = realloc(input, size);
		if (!p)
			return 0; /* the host treats a null buffer as a plugin failure */
		input = p;
		input_cap = size;
	}
	return input;
}

/* A growable byte string. */
struct buf {
	char *p;
	size_t len, cap;
};

static void put(struct buf *b, const char *s, size_t n) {
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n)
			cap *= 2;
		b->p = realloc(b->p, cap);
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* put_json writes s as the inside of a JSON string. */
static void put_json(struct buf *b, const char *s, size_t n) {
	static const char hex[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\') {
			char e[2] = {'\\', (char)c};
			put(b, e, 2);
		} else if (c < 0x20) {
			char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
			put(b, e, 6);
		} else {
			put(b, (const char *)&c, 1);
		}
	}
}

/* The result stays valid until the next call of an export (ABI.md section 2). */
static struct buf result;

static uint64_t text_result(const char *text, size_t n, int is_error) {
	result.len = 0;
	puts_(&result, "{\"content\":[{\"type\":\"text\",\"text\":\"");
	put_json(&result, text, n);
	puts_(&result, is_error ? "\"}],\"is_error\":true}" : "\"}],\"is_error\":false}");
	return pack(result.p, (uint32_t)result.len);
}

/* A minimal JSON reader: enough to find the members of the request and of the input. */
struct scan {
	const char *s, *end;
};

static void ws(struct scan *sc) {
	while (sc->s < sc->end && (*sc->s == ' ' || *sc->s == '\t' || *sc->s == '\n' || *sc->s == '\r'))
		sc->s++;
}

static void put_utf8(struct buf *b, uint32_t r) {
	char u[4];
	if (r < 0x80) {
		u[0] = (char)r;
		put(b, u, 1);
	} else if (r < 0x800) {
		u[0] = (char)(0xc0 | r >> 6), u[1] = (char)(0x80 | (r & 0x3f));
		put(b, u, 2);
	} else if (r < 0x10000) {
		u[0] = (char)(0xe0 | r >> 12), u[1] = (char)(0x80 | (r >> 6 & 0x3f)), u[2] = (char)(0x80 | (r & 0x3f));
		put(b, u, 3);
	} else {
		u[0] = (char)(0xf0 | r >> 18), u[1] = (char)(0x80 | (r >> 12 & 0x3f));
		u[2] = (char)(0x80 | (r >> 6 & 0x3f)), u[3] = (char)(0x80 | (r & 0x3f));
		put(b, u, 4);
	}
}

static int hex4(const char *s, uint32_t *v) {
	*v = 0;
	for (int i = 0; i < 4; i++) {
		char c = s[i];
		*v <<= 4;
		if (c >= '0' && c <= '9')
			*v |= (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			*v |= (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			*v |= (uint32_t)(c - 'A' + 10);
		else
			return 0;
	}
	return 1;
}

/* string reads a JSON string into out (when not null), decoding its escapes. */
static int string(struct scan *sc, struct buf *out) {
	if (sc->s >= sc->end || *sc->s != '"')
		return 0;
	sc->s++;
	while (sc->s < sc->end && *sc->s != '"') {
		char c = *sc->s++;
		if (c != '\\') {
			if (out)
				put(out, &c, 1);
			continue;
		}
		if (sc->s >= sc->end)
			return 0;
		char e = *sc->s++;
		const char *simple = strchr("\"\\/bfnrt", e);
		if (simple && e) {
			static const char decoded[] = "\"\\/\b\f\n\r\t";
			if (out)
				put(out, &decoded[simple - "\"\\/bfnrt"], 1);
		} else if (e == 'u' && sc->end - sc->s >= 4) {
			uint32_t r, lo;
			if (!hex4(sc->s, &r))
				return 0;
			sc->s += 4;
			if (r >= 0xd800 && r < 0xdc00 && sc->end - sc->s >= 6 && sc->s[0] == '\\' && sc->s[1] == 'u' &&
			    hex4(sc->s + 2, &lo) && lo >= 0xdc00 && lo < 0xe000) {
				r = 0x10000 + ((r - 0xd800) << 10) + (lo - 0xdc00);
				sc->s += 6;
			}
			if (out)
				put_utf8(out, r);
		} else {
			return 0;
		}
	}
	if (sc->s >= sc->end)
		return 0;
	sc->s++;
	return 1;
}

/* skip skips any JSON value. */
static int skip(struct scan *sc) {
	ws(sc);
	if (sc->s >= sc->end)
		return 0;
	char c = *sc->s;
	if (c == '"')
		return string(sc, 0);
	if (c == '{' || c == '[') {
		char close = c == '{' ? '}' : ']';
		sc->s++;
		ws(sc);
		if (sc->s < sc->end && *sc->s == close) {
			sc->s++;
			return 1;
		}
		for (;;) {
			if (c == '{') {
				ws(sc);
				if (!string(sc, 0))
					return 0;
				ws(sc);
				if (sc->s >= sc->end || *sc->s++ != ':')
					return 0;
			}
			if (!skip(sc))
				return 0;
			ws(sc);
			if (sc->s >= sc->end)
				return 0;
			if (*sc->s == ',') {
				sc->s++;
				continue;
			}
			if (*sc->s++ != close)
				return 0;
			return 1;
		}
	}
	while (sc->s < sc->end && !strchr(",}] \t\r\n", *sc->s))
		sc->s++; /* a number, true, false or null */
	return 1;
}

/* member finds the value of key in the object at sc and leaves sc on it. */
static int member(struct scan sc, const char *key, struct scan *value) {
	struct buf name = {0};
	int found = 0;
	ws(&sc);
	if (sc.s >= sc.end || *sc.s++ != '{')
		return 0;
	for (;;) {
		ws(&sc);
		name.len = 0;
		if (!string(&sc, &name))
			break;
		ws(&sc);
		if (sc.s >= sc.end || *sc.s++ != ':')
			break;
		ws(&sc);
		if (name.len == strlen(key) && memcmp(name.p, key, name.len) == 0) {
			*value = sc;
			found = 1;
			break;
		}
		if (!skip(&sc))
			break;
		ws(&sc);
		if (sc.s >= sc.end || *sc.s++ != ',')
			break;
	}
	free(name.p);
	return found;
}

/* host_error turns the host's last error into the tool's error result. */
static uint64_t host_error(const char *what) {
	char msg[512];
	int64_t n = host_last_error(msg, sizeof msg);
	if (n > (int64_t)sizeof msg)
		n = sizeof msg;
	struct buf b = {0};
	puts_(&b, "Error: ");
	puts_(&b, what);
	puts_(&b, ": ");
	put(&b, msg, n > 0 ? (size_t)n : 0);
	uint64_t r = text_result(b.p, b.len, 1);
	free(b.p);
	return r;
}

static uint64_t count_words(struct scan in) {
	struct scan v;
	struct buf path = {0};
	if (!member(in, "path", &v) || !string(&v, &path))
		return text_result("Error: path must be a string", 28, 1);

	/* The two-call protocol: a buffer that fits most files, take for the rest. */
	static unsigned char small[4096];
	unsigned char *data = small;
	int64_t n = host_read(path.p, (uint32_t)path.len, small, sizeof small);
	if (n < 0) {
		uint64_t r = host_error("could not count");
		free(path.p);
		return r;
	}
	free(path.p);
	if (n > (int64_t)sizeof small) {
		data = malloc((size_t)n);
		if (!data || host_take(data, (uint32_t)n) != n)
			return text_result("Error: could not take the file's bytes", 38, 1);
	}
	long lines = 0, words = 0;
	int in_word = 0;
	for (int64_t i = 0; i < n; i++) {
		unsigned char c = data[i];
		int space = c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
		if (c == '\n')
			lines++;
		if (!space && !in_word)
			words++;
		in_word = !space;
	}
	if (data != small)
		free(data);
	char text[96];
	int len = 0;
	/* No stdio: format the three numbers by hand. */
	long nums[3] = {lines, words, (long)n};
	const char *units[3] = {" lines, ", " words, ", " bytes"};
	for (int k = 0; k < 3; k++) {
		char digits[24];
		int d = 0;
		long x = nums[k];
		do {
			digits[d++] = (char)('0' + x % 10);
			x /= 10;
		} while (x);
		while (d)
			text[len++] = digits[--d];
		size_t u = strlen(units[k]);
		memcpy(text + len, units[k], u);
		len += (int)u;
	}
	return text_result(text, (size_t)len, 0);
}

EXPORT("toolhost_call") uint64_t call(uint32_t len) {
	struct scan req = {input, input + len}, v, in;
	struct buf tool = {0};
	if (!member(req, "tool", &v) || !string(&v, &tool) || !member(req, "input", &in)) {
		free(tool.p);
		return text_result("Error: the request is not {\"tool\": ..., \"input\": {...}}", 54, 1);
	}
	uint64_t r;
	if (tool.len == 11 && memcmp(tool.p, "count_words", 11) == 0) {
		r = count_words(in);
	} else {
		/* The host only calls the tools of the manifest; answer anything else with an
		 * error result all the same (ABI.md section 5). */
		struct buf b = {0};
		puts_(&b, "Error: unknown tool ");
		put(&b, tool.p, tool.len);
		r = text_result(b.p, b.len, 1);
		free(b.p);
	}
	free(tool.p);
	return r;
}
