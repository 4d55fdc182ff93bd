/* SPDX-License-Identifier: MIT */
/*
 * Opening the files of a checkpoint, the one way every reader does it.
 *
 * A checkpoint may come from someone else, so a file is checked before
 * anything is opened or read: it must resolve inside the checkpoint
 * folder (the symlink policy, unless --follow-symlinks: under its real
 * path, or below it by identity where a bind mount gives it another
 * name), and be a regular file (a FIFO would block the open or the read,
 * a device could do anything on open, a folder is not a file). The open
 * itself cannot block (O_NONBLOCK) and the opened file must be the one
 * checked, so a link swapped in between is noticed. Readers then keep
 * the descriptor, and src/model/source.c records its identity to detect
 * later changes.
 */
#ifndef CKFS_FILE_H
#define CKFS_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "ckfs/err.h"

/* Who may read a file: recorded when it is read, so that what is served
 * from it is never shown more widely (include/ckfs/perm.h). */
struct ckfs_file_access {
	const char *path;      /* NULL: nothing recorded */
	mode_t mode;
	uid_t uid;
	gid_t gid;
	bool acl;              /* it has an access ACL */
};

/* Where files may come from. */
struct ckfs_file_policy {
	const char *root;      /* real path files must resolve inside; NULL: anywhere */
	const char *alt_root;  /* a second such folder (a --config folder outside
				* root), or NULL */
	bool follow_symlinks;  /* accept files that resolve anywhere */
};

/*
 * The symlink policy alone, for a file or a folder: path must resolve
 * inside pol's roots, else CKFS_E_INVALID "'<path>': symlink leads outside
 * the checkpoint; use --follow-symlinks". pol NULL, no root or
 * follow_symlinks: always CKFS_OK. A missing path is CKFS_E_NOTFOUND
 * ("not found", or "dangling symlink").
 */
enum ckfs_code ckfs_file_check_policy(const struct ckfs_file_policy *pol, const char *path,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;

/*
 * Open path read-only as a regular file under pol (NULL: no symlink
 * policy): the policy first, then the file's type (CKFS_E_INVALID "not a
 * regular file" without opening it), then the open, then a check that
 * the opened file is the one looked at (CKFS_E_CHANGED). On success *fd
 * is the caller's, and *st (when not NULL) its fstat.
 */
enum ckfs_code ckfs_file_open(const struct ckfs_file_policy *pol, const char *path,
			      int *fd, struct stat *st,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* A whole regular file of at most max bytes (CKFS_E_LIMIT beyond), opened
 * as ckfs_file_open does, into a malloc'd NUL-terminated buffer; who may
 * read it into *access when not NULL (its path left to the caller). */
enum ckfs_code ckfs_file_read_small(const struct ckfs_file_policy *pol, const char *path,
				    size_t max, char **out, size_t *len,
				    struct ckfs_file_access *access,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;

/* pread(2) until len bytes at off are read, again after EINTR and short
 * reads: the bytes read, fewer than len only at end of file; -1 with
 * errno when a read fails. */
ssize_t ckfs_pread_full(int fd, void *buf, size_t len, uint64_t off);

/* Whether a file has an access ACL (POSIX or NFSv4), whose entries may
 * deny users its mode bits let in. */
bool ckfs_fd_has_acl(int fd);
bool ckfs_path_has_acl(const char *path);

/* path names root or something under it (both real paths). */
bool ckfs_path_under(const char *path, const char *root);

/*
 * Whether the folder dir (its stat) is path (a folder) or a folder above
 * what path names, following symlinks: walked up from path's folder by
 * "..", comparing (st_dev, st_ino). Names cannot tell: a bind mount, or
 * an export mounted twice, shows one folder under two paths. 1: it is;
 * 0: it is not; -1 (errno): path cannot be resolved.
 */
int ckfs_path_within(const char *path, const struct stat *dir);

/* stat(2) says: a folder; anything that exists. */
bool ckfs_path_is_dir(const char *path);
bool ckfs_path_exists(const char *path);

#endif
