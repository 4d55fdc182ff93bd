/* SPDX-License-Identifier: MIT */
/* A growable text buffer: see include/ckfs/strbuf.h. */
#include "ckfs/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ckfs_strbuf_put(struct ckfs_strbuf *b, const char *s, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->failed = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void ckfs_strbuf_str(struct ckfs_strbuf *b, const char *s)
{
	ckfs_strbuf_put(b, s, strlen(s));
}

void ckfs_strbuf_fmt(struct ckfs_strbuf *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap, again;

	va_start(ap, fmt);
	va_copy(again, ap);
	int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0 && (size_t)n < sizeof(tmp)) {
		ckfs_strbuf_put(b, tmp, (size_t)n);
	} else if (n > 0) {
		/* longer than tmp: formatted again, whole (it was cut) */
		char *big = malloc((size_t)n + 1);
		if (big && vsnprintf(big, (size_t)n + 1, fmt, again) == n)
			ckfs_strbuf_put(b, big, (size_t)n);
		else
			b->failed = 1;
		free(big);
	}
	va_end(again);
}

void ckfs_strbuf_json(struct ckfs_strbuf *b, const char *s)
{
	ckfs_strbuf_put(b, "\"", 1);
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		switch (*c) {
		case '"': ckfs_strbuf_put(b, "\\\"", 2); break;
		case '\\': ckfs_strbuf_put(b, "\\\\", 2); break;
		case '\b': ckfs_strbuf_put(b, "\\b", 2); break;
		case '\f': ckfs_strbuf_put(b, "\\f", 2); break;
		case '\n': ckfs_strbuf_put(b, "\\n", 2); break;
		case '\r': ckfs_strbuf_put(b, "\\r", 2); break;
		case '\t': ckfs_strbuf_put(b, "\\t", 2); break;
		default:
			if (*c < 0x20)
				ckfs_strbuf_fmt(b, "\\u%04x", *c);
			else
				ckfs_strbuf_put(b, (const char *)c, 1);
		}
	}
	ckfs_strbuf_put(b, "\"", 1);
}
