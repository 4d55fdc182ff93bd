/* SPDX-License-Identifier: MIT */
/* Error records: see include/ckfs/err.h. */
#include "ckfs/err.h"

#include "ckfs/text.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void ckfs_error_clear(struct ckfs_error *err)
{
	if (!err)
		return;
	err->code = CKFS_OK;
	err->sys_errno = 0;
	err->msg[0] = '\0';
}

CKFS_PRINTF(4, 0)
static void record(struct ckfs_error *err, enum ckfs_code code, int sys_errno,
		   const char *fmt, va_list ap)
{
	char raw[sizeof(err->msg)];

	if (!err || err->code != CKFS_OK)
		return;
	err->code = code;
	err->sys_errno = sys_errno;
	/* Names and paths in the message come from the checkpoint: no
	 * control character may reach a terminal or split the line. */
	vsnprintf(raw, sizeof(raw), fmt, ap);
	ckfs_text_escape(err->msg, sizeof(err->msg), raw);
}

enum ckfs_code ckfs_fail(struct ckfs_error *err, enum ckfs_code code,
			 const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	record(err, code, 0, fmt, ap);
	va_end(ap);
	return code;
}

/* The cause of this thread's last failed read from an object store (its
 * own words), told to the message that reports the errno it became. */
static _Thread_local char read_cause[512];

void ckfs_error_note_cause(const char *why)
{
	snprintf(read_cause, sizeof(read_cause), "%s", why ? why : "");
}

enum ckfs_code ckfs_fail_errno(struct ckfs_error *err, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	char cause[sizeof(read_cause)];

	snprintf(cause, sizeof(cause), "%s", read_cause);
	read_cause[0] = '\0';

	/* ENOMEM from a system call (realpath, opendir) is running out of
	 * memory, not an I/O error; ESTALE from a read of an object in a
	 * store (include/ckfs/file.h) is a source that changed. */
	enum ckfs_code code = saved == ENOMEM   ? CKFS_E_NOMEM
			      : saved == ESTALE ? CKFS_E_CHANGED
						: CKFS_E_IO;

	if (!err || err->code != CKFS_OK)
		return code;
	va_start(ap, fmt);
	record(err, code, code == CKFS_E_CHANGED ? 0 : saved, fmt, ap);
	va_end(ap);
	size_t n = strlen(err->msg);
	snprintf(err->msg + n, sizeof(err->msg) - n, ": %s",
		 cause[0] && (saved == EIO || saved == ESTALE) ? cause
		 : saved == ENOMEM ? "out of memory"
		 : saved == ESTALE ? "the object changed since it was opened"
				   : strerror(saved));
	return code;
}

enum ckfs_code ckfs_nomem(struct ckfs_error *err)
{
	return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
}

void ckfs_error_prefix(struct ckfs_error *err, const char *fmt, ...)
{
	char raw[512], prefix[512], old[sizeof(err->msg)];
	va_list ap;

	if (!err || err->code == CKFS_OK)
		return;
	va_start(ap, fmt);
	vsnprintf(raw, sizeof(raw), fmt, ap);
	va_end(ap);
	ckfs_text_escape(prefix, sizeof(prefix), raw);
	memcpy(old, err->msg, sizeof(old));
	/* prefix + ": " + old, truncated to the message buffer. */
	size_t n = strlen(prefix), cap = sizeof(err->msg) - 1;
	if (n > cap)
		n = cap;
	memcpy(err->msg, prefix, n);
	for (const char *p = ": "; *p && n < cap; p++)
		err->msg[n++] = *p;
	size_t k = strlen(old);
	if (k > cap - n)
		k = cap - n;
	memcpy(err->msg + n, old, k);
	err->msg[n + k] = '\0';
}

const char *ckfs_strerror(enum ckfs_code code)
{
	switch (code) {
	case CKFS_OK: return "success";
	case CKFS_E_IO: return "i/o error";
	case CKFS_E_NOMEM: return "out of memory";
	case CKFS_E_FORMAT: return "format error";
	case CKFS_E_TRUNCATED: return "truncated input";
	case CKFS_E_LIMIT: return "limit exceeded";
	case CKFS_E_UNSUPPORTED: return "unsupported";
	case CKFS_E_NOTFOUND: return "not found";
	case CKFS_E_INVALID: return "invalid";
	case CKFS_E_CHANGED: return "source changed";
	case CKFS_E_EXISTS: return "already exists";
	case CKFS_E_MISMATCH: return "mismatch";
	}
	return "unknown error";
}

void ckfs_first_error_init(struct ckfs_first_error *f)
{
	pthread_mutex_init(&f->lock, NULL);
	ckfs_error_clear(&f->err);
	atomic_init(&f->failed, 0);
}

void ckfs_first_error_set(struct ckfs_first_error *f, const struct ckfs_error *e)
{
	pthread_mutex_lock(&f->lock);
	if (f->err.code == CKFS_OK)
		f->err = *e;
	pthread_mutex_unlock(&f->lock);
	atomic_store(&f->failed, 1);
}

void ckfs_first_error_no_thread(struct ckfs_first_error *f)
{
	struct ckfs_error e;

	ckfs_error_clear(&e);
	ckfs_fail(&e, CKFS_E_NOMEM, "out of memory (cannot start a thread)");
	ckfs_first_error_set(f, &e);
}

void ckfs_first_error_destroy(struct ckfs_first_error *f)
{
	pthread_mutex_destroy(&f->lock);
}
