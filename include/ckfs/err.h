/* SPDX-License-Identifier: MIT */
/*
 * Error reporting shared by every ckfs module.
 *
 * Functions that can fail return an enum ckfs_code (CKFS_OK is zero) and, when
 * given a struct ckfs_error, fill it with one human-readable line in git's
 * style: lower case, subject first, no trailing period, for example
 *   "'model_world_size_2_rank_0.pt': zip central directory truncated".
 * The first failure recorded wins; callers may add context with
 * ckfs_error_prefix(). Only the FUSE front end turns codes into errno values.
 */
#ifndef CKFS_ERR_H
#define CKFS_ERR_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* Numeric values are stable: tests and scripts assert them. */
enum ckfs_code {
	CKFS_OK = 0,
	CKFS_E_IO = 1,          /* a system call failed (errno kept) */
	CKFS_E_NOMEM = 2,       /* an allocation failed */
	CKFS_E_FORMAT = 3,      /* input bytes are malformed */
	CKFS_E_TRUNCATED = 4,   /* input ends before a structure does */
	CKFS_E_LIMIT = 5,       /* input exceeds a limit in limits.h */
	CKFS_E_UNSUPPORTED = 6, /* valid input ckfs does not handle */
	CKFS_E_NOTFOUND = 7,    /* a file, record or key is missing */
	CKFS_E_INVALID = 8,     /* bad arguments or inconsistent checkpoint */
	CKFS_E_CHANGED = 9,     /* a source file changed after it was opened */
	CKFS_E_EXISTS = 10,     /* refusing to overwrite */
	CKFS_E_MISMATCH = 11,   /* verify found different values */
};

struct ckfs_error {
	enum ckfs_code code;
	int sys_errno; /* errno snapshot for CKFS_E_IO, else 0 */
	char msg[1024];
};

#if defined(__GNUC__)
#define CKFS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define CKFS_WARN_UNUSED __attribute__((warn_unused_result))
#else
#define CKFS_PRINTF(a, b)
#define CKFS_WARN_UNUSED
#endif

/* Reset to CKFS_OK with an empty message. */
void ckfs_error_clear(struct ckfs_error *err);

/*
 * Record a failure (only if none is recorded yet) and return code, so that
 * call sites read "return ckfs_fail(err, CKFS_E_FORMAT, ...)". err may be NULL.
 */
enum ckfs_code ckfs_fail(struct ckfs_error *err, enum ckfs_code code,
			 const char *fmt, ...) CKFS_PRINTF(3, 4);

/* A read from an object store failed for this reason (the store's words;
 * NULL forgets it: every ckfs_file_pread starts so): the next
 * ckfs_fail_errno of this thread for EIO or ESTALE says it instead of
 * strerror, so the last line of a failed command carries the cause. */
void ckfs_error_note_cause(const char *why);
/* Like ckfs_fail with CKFS_E_IO, appending ": strerror(errno)". */
enum ckfs_code ckfs_fail_errno(struct ckfs_error *err, const char *fmt, ...)
	CKFS_PRINTF(2, 3);

/* ckfs_fail(err, CKFS_E_NOMEM, "out of memory"): the one out-of-memory
 * report. */
enum ckfs_code ckfs_nomem(struct ckfs_error *err);

/* Prepend "prefix: " to the recorded message (no-op when none). */
void ckfs_error_prefix(struct ckfs_error *err, const char *fmt, ...)
	CKFS_PRINTF(2, 3);

/* Short name of a code, e.g. "format error". */
const char *ckfs_strerror(enum ckfs_code code);

/* The first failure among a job's threads: each reports what it hit, the
 * first report is kept, and `failed` lets the others stop early without
 * taking the lock. */
struct ckfs_first_error {
	pthread_mutex_t lock;
	struct ckfs_error err; /* the first failure reported, under lock */
	atomic_int failed;
};
void ckfs_first_error_init(struct ckfs_first_error *f);
void ckfs_first_error_set(struct ckfs_first_error *f, const struct ckfs_error *e);
/* A worker thread could not be started: recorded as running out of memory. */
void ckfs_first_error_no_thread(struct ckfs_first_error *f);
void ckfs_first_error_destroy(struct ckfs_first_error *f);

/* Forward a failure: evaluate expr once, return its code when not CKFS_OK. */
#define CKFS_TRY(expr)                                                     \
	do {                                                               \
		enum ckfs_code ckfs_try_rc_ = (expr);                      \
		if (ckfs_try_rc_ != CKFS_OK)                               \
			return ckfs_try_rc_;                               \
	} while (0)

#endif
