/* SPDX-License-Identifier: MIT */
/*
 * Text that came from a checkpoint (tensor names, keys, file names) made
 * safe to print. A name holding "\n" would split one error into two lines;
 * one holding "\x1b[31m" would write to the reader's terminal or log. Every
 * message and log line goes through ckfs_text_escape (err.c, log.c), so
 * callers format freely.
 */
#ifndef CKFS_TEXT_H
#define CKFS_TEXT_H

#include <stddef.h>

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), 0 when invalid. s must be
 * NUL-terminated (a NUL ends a sequence as invalid). */
size_t ckfs_utf8_seq(const unsigned char *s);

/*
 * Copy src into dst (cap > 0 bytes, always NUL-terminated), writing every
 * C0 control (0x00-0x1F), DEL, C1 control (U+0080-U+009F) and every byte
 * that is not part of valid UTF-8 as "\xNN", one escape per byte.
 * Printable ASCII and other valid UTF-8 characters are copied. The output
 * is cut only between whole characters or escapes. Returns its length.
 */
size_t ckfs_text_escape(char *dst, size_t cap, const char *src);

#endif
