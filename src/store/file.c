/* SPDX-License-Identifier: MIT */
/* Opening checkpoint files: see include/ckfs/file.h. */
#include "ckfs/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "ckfs/io.h"
#include "ckfs/remote.h"

bool ckfs_path_under(const char *path, const char *root)
{
	size_t n = strlen(root);

	if (n == 1 && root[0] == '/')
		return path[0] == '/';
	return strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Walk up from the folder fd (an O_PATH descriptor, closed here) by "..",
 * until dir or the top (where ".." is the folder itself). */
static int walk_up(int fd, const struct stat *dir)
{
	struct stat st, up;

	if (fstat(fd, &st) != 0)
		goto fail;
	/* PATH_MAX / 2 steps: no real path is deeper ("a/" per level). */
	for (int depth = 0; depth < PATH_MAX / 2; depth++) {
		if (same_file(&st, dir)) {
			close(fd);
			return 1;
		}
		int parent = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (parent < 0)
			goto fail;
		close(fd);
		fd = parent;
		if (fstat(fd, &up) != 0)
			goto fail;
		if (same_file(&up, &st)) {
			close(fd);
			return 0;
		}
		st = up;
	}
	errno = ELOOP;
fail:;
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}

int ckfs_path_within(const char *path, const struct stat *dir)
{
	struct stat st;
	int fd = open(path, O_PATH | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
		return walk_up(fd, dir);
	close(fd);
	/* A file: from the folder that really holds it. */
	char *real = realpath(path, NULL);
	if (!real)
		return -1;
	char *slash = strrchr(real, '/');
	if (slash == real)
		slash[1] = '\0';
	else
		*slash = '\0';
	fd = open(real, O_PATH | O_DIRECTORY | O_CLOEXEC);
	free(real);
	return fd < 0 ? -1 : walk_up(fd, dir);
}

/* Inside the folder root (a real path): under it by name, or, where names
 * differ (a bind mount, one export mounted twice), by identity. */
static bool inside(const char *real, const char *root)
{
	struct stat st;

	if (ckfs_path_under(real, root))
		return true;
	return stat(root, &st) == 0 && ckfs_path_within(real, &st) == 1;
}

/* A path that does not resolve: missing, or a link to nothing. */
static enum ckfs_code not_found(const char *path, struct ckfs_error *err)
{
	struct stat lst;

	if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': dangling symlink", path);
	return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found", path);
}

/* Resolve path and apply the policy; *real (malloc'd) is NULL when no
 * policy applies. */
static enum ckfs_code resolve(const struct ckfs_file_policy *pol, const char *path,
			      char **real, struct ckfs_error *err)
{
	*real = NULL;
	if (!pol || !pol->root || pol->follow_symlinks || ckfs_s3_is_url(path))
		return CKFS_OK; /* a store has no links */
	char *r = realpath(path, NULL);
	if (!r)
		return errno == ENOENT || errno == ENOTDIR
			       ? not_found(path, err)
			       : ckfs_fail_errno(err, "'%s': cannot open", path);
	if (!inside(r, pol->root) && !(pol->alt_root && inside(r, pol->alt_root))) {
		free(r);
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': symlink leads outside the "
				 "checkpoint; use --follow-symlinks", path);
	}
	*real = r;
	return CKFS_OK;
}

enum ckfs_code ckfs_file_check_policy(const struct ckfs_file_policy *pol, const char *path,
				      struct ckfs_error *err)
{
	char *real;

	CKFS_TRY(resolve(pol, path, &real, err));
	free(real);
	return CKFS_OK;
}

enum ckfs_code ckfs_file_open(const struct ckfs_file_policy *pol, const char *path,
			      struct ckfs_file *f, struct stat *st_out, struct ckfs_error *err)
{
	struct stat looked, opened, resolved;
	char *real;
	enum ckfs_code rc = CKFS_OK;

	*f = CKFS_FILE_NONE;
	if (ckfs_s3_is_url(path))
		return ckfs_remote_open(path, &f->remote, st_out, err);
	CKFS_TRY(resolve(pol, path, &real, err));
	/* Its type before opening it: opening a FIFO blocks, opening a
	 * device may act on it. */
	if (stat(path, &looked) != 0) {
		rc = errno == ENOENT || errno == ENOTDIR ? not_found(path, err)
							 : ckfs_fail_errno(err, "'%s': cannot open", path);
		goto out;
	}
	if (!S_ISREG(looked.st_mode)) {
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': not a regular file", path);
		goto out;
	}
	/* O_NONBLOCK and O_NOCTTY: should the name be swapped for a FIFO or
	 * a terminal right now, the open neither blocks nor adopts it. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		rc = errno == ENOENT ? not_found(path, err)
				     : ckfs_fail_errno(err, "'%s': cannot open", path);
		goto out;
	}
	if (fstat(fd, &opened) != 0) {
		rc = ckfs_fail_errno(err, "'%s': cannot stat", path);
	} else if (!S_ISREG(opened.st_mode) || !same_file(&opened, &looked) ||
		   (real && (stat(real, &resolved) != 0 || !same_file(&opened, &resolved)))) {
		rc = ckfs_fail(err, CKFS_E_CHANGED, "'%s': replaced while it was opened",
			       path);
	}
	if (rc != CKFS_OK) {
		close(fd);
		goto out;
	}
	f->fd = fd;
	if (st_out)
		*st_out = opened;
out:
	free(real);
	return rc;
}

void ckfs_file_close(struct ckfs_file *f)
{
	if (f->fd >= 0)
		close(f->fd);
	ckfs_remote_close(f->remote);
	*f = CKFS_FILE_NONE;
}

void ckfs_file_metadata_done(struct ckfs_file f)
{
	if (f.remote)
		ckfs_remote_forget(f.remote);
}

int ckfs_file_stat(struct ckfs_file f, struct stat *st)
{
	if (!f.remote)
		return fstat(f.fd, st);
	ckfs_remote_fstat(f.remote, st);
	return 0;
}

int64_t ckfs_file_size(struct ckfs_file f)
{
	struct stat st;

	return ckfs_file_stat(f, &st) == 0 ? (int64_t)st.st_size : -1;
}

enum ckfs_code ckfs_file_dup(struct ckfs_file f, struct ckfs_file *out, struct ckfs_error *err)
{
	*out = CKFS_FILE_NONE;
	if (f.remote)
		return ckfs_remote_dup(f.remote, &out->remote, err);
	if ((out->fd = fcntl(f.fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return ckfs_fail_errno(err, "cannot keep a file open");
	return CKFS_OK;
}

void ckfs_file_ahead(struct ckfs_file_range *v, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		if (v[i].f.remote && v[i].len)
			v[k++] = v[i];
	ckfs_remote_ahead(v, k);
}

void ckfs_file_ahead_drop(void)
{
	ckfs_remote_ahead_drop();
}

ssize_t ckfs_file_pread(struct ckfs_file f, void *buf, size_t len, uint64_t off)
{
	if (f.remote) {
		ckfs_error_note_cause(NULL); /* only this read's failure is told */
		return ckfs_remote_pread(f.remote, buf, len, off);
	}
	return ckfs_pread_full(f.fd, buf, len, off);
}

enum ckfs_code ckfs_file_read_small(const struct ckfs_file_policy *pol, const char *path,
				    size_t max, char **out, size_t *len,
				    struct ckfs_file_access *access, struct ckfs_error *err)
{
	struct stat st;
	struct ckfs_file f;

	CKFS_TRY(ckfs_file_open(pol, path, &f, &st, err));
	if ((uint64_t)st.st_size > max) {
		ckfs_file_close(&f);
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': larger than %zu bytes", path, max);
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		ckfs_file_close(&f);
		return ckfs_nomem(err);
	}
	ssize_t got = ckfs_file_pread(f, buf, (size_t)st.st_size, 0);
	if (got != (ssize_t)st.st_size) {
		int e = errno;
		free(buf);
		ckfs_file_close(&f);
		errno = e;
		return got < 0 ? ckfs_fail_errno(err, "'%s': read failed", path)
			       : ckfs_fail(err, CKFS_E_CHANGED, "'%s': shrank while "
					   "being read", path);
	}
	size_t done = (size_t)got;
	if (access) {
		access->mode = st.st_mode;
		access->uid = st.st_uid;
		access->gid = st.st_gid;
		access->acl = f.fd >= 0 && ckfs_fd_has_acl(f.fd);
	}
	ckfs_file_close(&f);
	buf[done] = '\0';
	*out = buf;
	*len = done;
	return CKFS_OK;
}

/* The attributes ACLs are kept in: POSIX ACLs, and NFSv4 ACLs as an NFS
 * client shows them. Only "no such attribute" and "no attributes here"
 * mean no ACL; any other answer counts as one (fail closed). */
static const char *const acl_attrs[] = { "system.posix_acl_access", "system.nfs4_acl" };

static bool acl_attr_present(ssize_t r)
{
	return r >= 0 || (errno != ENODATA && errno != ENOTSUP && errno != EOPNOTSUPP);
}

bool ckfs_fd_has_acl(int fd)
{
	for (size_t i = 0; i < sizeof(acl_attrs) / sizeof(acl_attrs[0]); i++)
		if (acl_attr_present(fgetxattr(fd, acl_attrs[i], NULL, 0)))
			return true;
	return false;
}

bool ckfs_path_has_acl(const char *path)
{
	for (size_t i = 0; i < sizeof(acl_attrs) / sizeof(acl_attrs[0]); i++)
		if (acl_attr_present(getxattr(path, acl_attrs[i], NULL, 0)))
			return true;
	return false;
}

int ckfs_stat(const char *path, struct stat *st)
{
	return ckfs_s3_is_url(path) ? ckfs_remote_stat(path, st) : stat(path, st);
}

int ckfs_lstat(const char *path, struct stat *st)
{
	return ckfs_s3_is_url(path) ? ckfs_remote_stat(path, st) : lstat(path, st);
}

char *ckfs_realpath(const char *path)
{
	if (!ckfs_s3_is_url(path))
		return realpath(path, NULL);
	size_t n = strlen(path);
	while (n > 5 && path[n - 1] == '/')
		n--;
	char *r = strndup(path, n);
	if (!r)
		errno = ENOMEM;
	return r;
}

bool ckfs_path_is_dir(const char *path)
{
	struct stat st;
	return ckfs_stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool ckfs_path_exists(const char *path)
{
	struct stat st;
	return ckfs_stat(path, &st) == 0;
}

struct ckfs_dir {
	DIR *local;
	struct ckfs_remote_dir *remote;
};

struct ckfs_dir *ckfs_opendir(const char *path)
{
	struct ckfs_dir *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	if (ckfs_s3_is_url(path) ? !(d->remote = ckfs_remote_opendir(path))
				 : !(d->local = opendir(path))) {
		free(d);
		return NULL;
	}
	return d;
}

const char *ckfs_readdir(struct ckfs_dir *d, bool *is_dir)
{
	struct dirent *de;
	struct stat st;

	if (d->remote)
		return ckfs_remote_readdir(d->remote, is_dir);
	do {
		if (!(de = readdir(d->local)))
			return NULL;
	} while (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0);
	/* The file system's type when it says, else stat's (links followed). */
	if (de->d_type != DT_UNKNOWN && de->d_type != DT_LNK)
		*is_dir = de->d_type == DT_DIR;
	else
		*is_dir = fstatat(dirfd(d->local), de->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
	return de->d_name;
}

void ckfs_closedir(struct ckfs_dir *d)
{
	if (!d)
		return;
	if (d->local)
		closedir(d->local);
	ckfs_remote_closedir(d->remote);
	free(d);
}
