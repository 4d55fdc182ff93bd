/* SPDX-License-Identifier: MIT */
/*
 * The mount daemon's sandbox, entered once it serves (src/fuse/sandbox.c,
 * docs/reliability.md): the uid= user instead of root, no_new_privs,
 * Landlock rules that let it read its sources and write its caches only,
 * and a system-call allow-list. A forked helper does the unmount a
 * Landlock domain may not do.
 */
#ifndef CKFS_FUSE_SANDBOX_H
#define CKFS_FUSE_SANDBOX_H

#include <stdbool.h>
#include <sys/types.h>

#include "ckfs/err.h"

struct ckfs_sandbox_rules {
	const char *mountpoint;
	bool drop;              /* started as root with -o uid=: become that user */
	uid_t uid;
	gid_t gid;              /* with has_gid (-o gid=); else the user's own */
	bool has_gid;
	const char *read[8];    /* folders or files read beneath (NULL skipped) */
	size_t n_read;
	const char *write[4];   /* caches: read and written beneath */
	size_t n_write;
	bool network;           /* a source in an object store: /etc, /usr, /lib read */
};

struct ckfs_sandbox {
	pid_t helper;
	int helper_fd;          /* -1: no helper */
	int landlock_abi;       /* 0: Landlock not applied (no kernel support) */
	bool syscall_filter;    /* the seccomp allow-list applied */
};

/* Fork the unmount helper (it stays root), then confine this process
 * (and its threads:
 * call it before any thread starts that must stay free, or accept that
 * every thread is confined, as here). */
enum ckfs_code ckfs_sandbox_enter(const struct ckfs_sandbox_rules *p, struct ckfs_sandbox *sb,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The loop has ended, /dev/fuse still open: the helper unmounts (unmount:
 * the daemon was stopped, its mount is still there; false: the kernel
 * unmounted it) and is waited for; libfuse's fuse_session_unmount then
 * finds the connection gone and only frees. A mount id can be reused by a
 * mount made on the same point at once (before kernel 6.8's unique ids),
 * so the helper is told rather than left to guess. */
void ckfs_sandbox_leave(struct ckfs_sandbox *sb, bool unmount);

#endif
