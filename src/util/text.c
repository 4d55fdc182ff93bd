/* SPDX-License-Identifier: MIT */
/* Printable text from untrusted bytes: see include/ckfs/text.h. */
#include "ckfs/text.h"

#include <stdio.h>

size_t ckfs_utf8_seq(const unsigned char *s)
{
	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xC2 && s[0] <= 0xDF)
		return (s[1] & 0xC0) == 0x80 ? 2 : 0;
	if (s[0] >= 0xE0 && s[0] <= 0xEF) {
		unsigned lo = s[0] == 0xE0 ? 0xA0 : 0x80, hi = s[0] == 0xED ? 0x9F : 0xBF;
		return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
	}
	if (s[0] >= 0xF0 && s[0] <= 0xF4) {
		unsigned lo = s[0] == 0xF0 ? 0x90 : 0x80, hi = s[0] == 0xF4 ? 0x8F : 0xBF;
		return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 &&
		       (s[3] & 0xC0) == 0x80 ? 4 : 0;
	}
	return 0;
}

/* A character printed as it is: printable ASCII, or valid UTF-8 that is
 * not a C1 control (U+0080-U+009F, encoded C2 80 .. C2 9F). */
static size_t printable_seq(const unsigned char *s)
{
	if (s[0] < 0x20 || s[0] == 0x7F)
		return 0;
	size_t k = ckfs_utf8_seq(s);
	if (k == 2 && s[0] == 0xC2 && s[1] < 0xA0)
		return 0;
	return k;
}

size_t ckfs_text_escape(char *dst, size_t cap, const char *src)
{
	const unsigned char *s = (const unsigned char *)src;
	size_t n = 0;

	while (*s) {
		size_t k = printable_seq(s);
		if (k) {
			if (n + k >= cap)
				break;
			for (size_t i = 0; i < k; i++)
				dst[n++] = (char)s[i];
			s += k;
		} else {
			if (n + 4 >= cap)
				break;
			snprintf(dst + n, cap - n, "\\x%02x", *s++);
			n += 4;
		}
	}
	dst[n] = '\0';
	return n;
}
