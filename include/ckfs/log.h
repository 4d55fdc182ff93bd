/* SPDX-License-Identifier: MIT */
/*
 * Logging with syslog-mirroring levels. The sink is stderr by default and
 * can be replaced (the daemon switches to syslog). Thread-safe: each message
 * is formatted into one buffer and written with one call. No per-request
 * info logging on hot paths: count instead.
 */
#ifndef CKFS_LOG_H
#define CKFS_LOG_H

enum ckfs_log_level {
	CKFS_LOG_ERR = 3,
	CKFS_LOG_WARNING = 4,
	CKFS_LOG_NOTICE = 5,
	CKFS_LOG_INFO = 6,
	CKFS_LOG_DEBUG = 7,
};

typedef void (*ckfs_log_sink)(enum ckfs_log_level level, const char *line);

void ckfs_log_set_level(enum ckfs_log_level level);
enum ckfs_log_level ckfs_log_get_level(void);
void ckfs_log_set_sink(ckfs_log_sink sink); /* NULL restores stderr */

void ckfs_log(enum ckfs_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif
