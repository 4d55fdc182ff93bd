/* SPDX-License-Identifier: MIT */
/*
 * A growable text buffer for the files ckfs renders (safetensors headers,
 * config.json, the index, adapter_config.json). Appends never fail on the
 * spot: a failed allocation sets `failed`, later appends do nothing, and
 * the caller checks once at the end.
 */
#ifndef CKFS_STRBUF_H
#define CKFS_STRBUF_H

#include <stddef.h>

#include "ckfs/err.h"

struct ckfs_strbuf {
	char *p;        /* NUL-terminated once anything is appended; malloc'd */
	size_t len, cap;
	int failed;
};

void ckfs_strbuf_put(struct ckfs_strbuf *b, const char *s, size_t n);
void ckfs_strbuf_str(struct ckfs_strbuf *b, const char *s);
void ckfs_strbuf_fmt(struct ckfs_strbuf *b, const char *fmt, ...) CKFS_PRINTF(2, 3);
/* s as a JSON string: quotes, backslash and control characters escaped
 * (\b \f \n \r \t, the others \u00XX), everything else (UTF-8 included)
 * raw, as serde_json and Python's json.dumps(ensure_ascii=False) write it. */
void ckfs_strbuf_json(struct ckfs_strbuf *b, const char *s);

#endif
