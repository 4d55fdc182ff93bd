/* SPDX-License-Identifier: MIT */
/*
 * The low-level FUSE handlers, written once over the mount's tree
 * (src/fuse/tree.h): each asks the tree what its inode is (resolve), then
 * answers from the served folder or from what the tree filled in.
 *
 * Inodes. No handler allocates per lookup, so there is no lookup count to
 * keep: include/fuse_lowlevel.h only requires that an inode stay valid
 * while the kernel holds references to it, and a tree's inode numbers are
 * never given to anything else (a checkpoint's are indices fixed at mount,
 * a run's carry a serial never reused: an old one answers ENOENT, never
 * other bytes). forget is therefore a no-op (squashfuse's ll.c does the
 * same for its 64-bit inode mode).
 *
 * Caching. What is fixed (tree.h) the kernel keeps a day: entries,
 * negative entries and attributes; opens set keep_cache so the page cache
 * survives close/open (N tensor-parallel ranks and repeated loads share
 * one copy), and fixed listings are cached too. No direct_io: mmap must
 * work, and -o preload's stores (src/fuse/preload.c) land in the page
 * cache these opens keep.
 *
 * Permissions are fixed at open of each served folder (src/fuse/served.c)
 * and enforced by the kernel (default_permissions is always on), so
 * access is never asked of the daemon.
 *
 * Errors. Only write attempts (EROFS), missing inodes and reads can fail.
 * A failed read is answered with ckfs_err_to_errno() of the cause and
 * logged with the file name and the cause (ckfs_served_log_read_error).
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "ckfs/strbuf.h"
#include "fuse/counters.h"
#include "fuse/tree.h"

/* ---- what an inode is ---- */

static struct ckfs_fs *req_fs(fuse_req_t req)
{
	struct ckfs_fs *fs = fuse_req_userdata(req);

	ckfs_fs_apply_kernel_readahead(fs);
	return fs;
}

/* Resolve ino into *at; on failure the errno is replied. */
static bool resolve(fuse_req_t req, struct ckfs_fs *fs, fuse_ino_t ino, struct ckfs_at *at)
{
	int rc = fs->ops->resolve(fs, ino, at);

	if (rc)
		fuse_reply_err(req, rc);
	return rc == 0;
}

static void put(struct ckfs_fs *fs, const struct ckfs_at *at)
{
	if (at->kind == CKFS_AT_SERVED)
		ckfs_fs_put(fs, at->served);
}

static bool is_dir(const struct ckfs_at *at)
{
	if (at->kind == CKFS_AT_SERVED)
		return !at->node || at->node->kind == CKFS_NODE_DIR;
	return at->kind == CKFS_AT_DIR;
}

static double timeout(bool fixed)
{
	return fixed ? CKFS_TIMEOUT_FIXED : CKFS_TIMEOUT_CHANGING;
}

/* Node i of the served folder dir is in (no reference of its own). */
static struct ckfs_at served_child(const struct ckfs_at *dir, size_t i)
{
	return (struct ckfs_at){
		.kind = CKFS_AT_SERVED, .ino = dir->top + 1 + i, .fixed = dir->fixed,
		.served = dir->served, .node = &dir->served->f->nodes[i], .top = dir->top,
	};
}

/* The ".." of folder dir. */
static fuse_ino_t parent_ino(const struct ckfs_at *dir)
{
	if (dir->kind == CKFS_AT_SERVED && dir->node)
		return dir->top + dir->node->parent; /* parent: index + 1, 0: top */
	return dir->parent;
}

static void at_stat(const struct ckfs_fs *fs, const struct ckfs_at *at, struct stat *st)
{
	if (at->kind == CKFS_AT_SERVED)
		ckfs_fs_stat_served(fs, at->served, at->node, at->ino, st);
	else
		*st = at->st;
}

/* ---- names and attributes ---- */

static void ckfs_ll_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	/* Parallel reads on one handle (several threads, or the kernel's
	 * readahead and an application read at once). */
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	/* Nothing is ever written back. */
	conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	/* Attributes never change: no need to drop pages on getattr. */
	conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
	/* Requests of up to 1 MiB. max_read must match the max_read= mount
	 * option (session.c passes it); libfuse derives max_pages from
	 * max_write. */
	conn->max_read = CKFS_FUSE_MAX_REQUEST;
	conn->max_write = CKFS_FUSE_MAX_REQUEST;
	/* conn->max_readahead arrives holding the largest value the kernel
	 * accepts (the bdi's read_ahead_kb); a reply can only lower it, so it
	 * is left as offered. Raising it needs root: see docs/mount.md. */
	/* The kernel's readahead and async reads are "background" requests,
	 * 12 in flight by default; allow more so the workers stay busy. */
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->time_gran = 1;
}

/* The entry of ino (0: a negative one) found in folder dir. */
static void reply_entry(fuse_req_t req, struct ckfs_fs *fs, const struct ckfs_at *dir,
			fuse_ino_t ino)
{
	struct fuse_entry_param e;
	struct ckfs_at at;

	memset(&e, 0, sizeof(e));
	e.entry_timeout = timeout(dir->fixed);
	if (ino == 0) {
		/* Cached too: loaders probe for files that will never exist
		 * here (pytorch_model.bin, ...). */
		fuse_reply_entry(req, &e);
		return;
	}
	if (dir->kind == CKFS_AT_SERVED) {
		at = served_child(dir, ino - dir->top - 1);
		at_stat(fs, &at, &e.attr);
	} else {
		int rc = fs->ops->resolve(fs, ino, &at);
		if (rc == ENOENT) {
			/* Gone between the name and its attributes. */
			e.entry_timeout = CKFS_TIMEOUT_CHANGING;
			fuse_reply_entry(req, &e);
			return;
		}
		if (rc) {
			fuse_reply_err(req, rc);
			return;
		}
		at_stat(fs, &at, &e.attr);
		put(fs, &at);
	}
	e.ino = ino;
	e.generation = 1;
	e.attr_timeout = e.entry_timeout;
	fuse_reply_entry(req, &e);
}

static void ckfs_ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_list l = { 0 };
	struct ckfs_at dir;
	uint64_t ino = 0;
	int rc = 0;

	if (!resolve(req, fs, parent, &dir))
		return;
	if (!is_dir(&dir)) {
		rc = ENOTDIR;
	} else if (dir.kind == CKFS_AT_SERVED) {
		const struct ckfs_node *n = ckfs_folder_lookup(dir.served->f, dir.node, name);
		ino = n ? dir.top + 1 + (uint64_t)(n - dir.served->f->nodes) : 0;
	} else if (!(rc = fs->ops->list(fs, &dir, &l))) {
		for (size_t i = 0; i < l.n && !ino; i++)
			ino = strcmp(l.e[i].name, name) == 0 ? l.e[i].ino : 0;
	}
	if (rc)
		fuse_reply_err(req, rc);
	else
		reply_entry(req, fs, &dir, ino);
	ckfs_list_free(&l);
	put(fs, &dir);
}

/* See the comment at the top of the file: dropped references free
 * nothing. */
static void ckfs_ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	(void)ino;
	(void)nlookup;
	fuse_reply_none(req);
}

static void ckfs_ll_forget_multi(fuse_req_t req, size_t count,
				 struct fuse_forget_data *forgets)
{
	(void)count;
	(void)forgets;
	fuse_reply_none(req);
}

static void ckfs_ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_at at;
	struct stat st;

	(void)fi;
	if (!resolve(req, fs, ino, &at))
		return;
	at_stat(fs, &at, &st);
	put(fs, &at);
	fuse_reply_attr(req, &st, timeout(at.fixed));
}

static void ckfs_ll_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_at at;

	if (!resolve(req, fs, ino, &at))
		return;
	put(fs, &at);
	if (at.kind == CKFS_AT_LINK)
		fuse_reply_readlink(req, at.link);
	else
		fuse_reply_err(req, EINVAL);
}

/* ---- files ---- */

static void ckfs_ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_handle *h;
	struct ckfs_at at;
	int rc = 0;

	if (!resolve(req, fs, ino, &at))
		return;
	if (at.kind == CKFS_AT_LINK)
		rc = ELOOP;
	else if (is_dir(&at))
		rc = EISDIR;
	else if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_APPEND)))
		rc = EROFS;
	else if (!(h = calloc(1, sizeof(*h))))
		rc = ENOMEM;
	if (rc) {
		put(fs, &at);
		fuse_reply_err(req, rc);
		return;
	}
	h->served = at.served; /* the reference travels with the handle */
	h->node = (size_t)(at.node - at.served->f->nodes);
	h->file_id = at.served->file_base + h->node;
	h->direct = (fi->flags & O_DIRECT) != 0;
	h->ino = ino;
	pthread_mutex_init(&h->lock, NULL);
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->keep_cache = 1; /* content is immutable: keep the page cache */
	fi->noflush = 1;    /* nothing to flush on close */
	ckfs_fs_count(fs, h->served, CKFS_IO_OPENS, 1);
	/* When the reply cannot be sent (the open was interrupted) release
	 * will never come for this handle. */
	if (fuse_reply_open(req, fi) != 0) {
		pthread_mutex_destroy(&h->lock);
		ckfs_fs_put(fs, h->served);
		free(h);
	}
}

static void ckfs_ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_handle *h = (struct ckfs_handle *)(uintptr_t)fi->fh;

	(void)ino;
	if (h) {
		pthread_mutex_destroy(&h->lock);
		ckfs_fs_put(fs, h->served);
		free(h);
	}
	fuse_reply_err(req, 0);
}

static void ckfs_ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			 struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_handle *h = (struct ckfs_handle *)(uintptr_t)fi->fh;
	uint64_t file_size = h->served->f->nodes[h->node].size;
	struct ckfs_error err;

	(void)ino;
	ckfs_fs_count(fs, h->served, CKFS_IO_READS, 1);
	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if ((uint64_t)off >= file_size || size == 0) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	size_t len = file_size - (uint64_t)off < size ? (size_t)(file_size - (uint64_t)off)
						      : size;
	ckfs_error_clear(&err);
	atomic_fetch_add_explicit(&fs->reads_in_flight, 1, memory_order_relaxed);
	enum ckfs_code rc = ckfs_fs_reply_read(req, fs, h, (uint64_t)off, len, &err);
	atomic_fetch_sub_explicit(&fs->reads_in_flight, 1, memory_order_relaxed);
	if (rc == CKFS_OK)
		return;
	ckfs_fs_count(fs, h->served, CKFS_IO_ERRORS, 1);
	ckfs_served_log_read_error(h->served, h->node, (uint64_t)off, len, &err);
	fuse_reply_err(req, ckfs_err_to_errno(&err));
}

/* ---- folders ---- */

static void ckfs_ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_at at;

	if (!resolve(req, fs, ino, &at))
		return;
	put(fs, &at);
	if (!is_dir(&at)) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	fi->cache_readdir = at.fixed;
	fi->keep_cache = at.fixed;
	fuse_reply_open(req, fi);
}

/* Entry k >= 2 of folder dir (the served folder's children, or the tree's
 * list l): its name, and its inode and attributes in *e (e->ino 0: only
 * the inode and type in e->attr). */
static const char *dir_entry(struct ckfs_fs *fs, const struct ckfs_at *dir,
			     const struct ckfs_list *l, size_t k, struct fuse_entry_param *e,
			     bool plus)
{
	const struct ckfs_list_entry *le = NULL;
	const char *name;
	struct ckfs_at c;

	memset(e, 0, sizeof(*e));
	if (dir->kind == CKFS_AT_SERVED) {
		const struct ckfs_folder *f = dir->served->f;
		size_t i = (dir->node ? dir->node->children : f->top)[k - 2];
		c = served_child(dir, i);
		at_stat(fs, &c, &e->attr);
		name = f->nodes[i].base;
	} else {
		le = &l->e[k - 2];
		name = le->name;
		if (!plus || le->lazy || fs->ops->resolve(fs, le->ino, &c) != 0) {
			e->attr.st_ino = le->ino;
			e->attr.st_mode = le->type;
			return name;
		}
		at_stat(fs, &c, &e->attr);
		put(fs, &c);
	}
	e->ino = e->attr.st_ino;
	e->generation = 1;
	e->attr_timeout = e->entry_timeout = timeout(dir->fixed);
	return name;
}

/* Directory offsets: 0 ".", 1 "..", k >= 2 the folder's entry k - 2. */
static void reply_dir(fuse_req_t req, struct ckfs_fs *fs, const struct ckfs_at *dir,
		      const struct ckfs_list *l, size_t size, off_t off, bool plus)
{
	const size_t n_entries = 2 + (dir->kind == CKFS_AT_SERVED
			? (dir->node ? dir->node->n_children : dir->served->f->n_top) : l->n);
	size_t pos = 0;
	char *buf;

	if (off < 0 || (uint64_t)off >= n_entries) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	for (size_t k = (size_t)off; k < n_entries; k++) {
		struct fuse_entry_param e;
		const char *name;
		size_t want;
		if (k < 2) {
			/* "." and "..": only their numbers (the kernel looks
			 * neither up from a listing). */
			memset(&e, 0, sizeof(e));
			e.attr.st_ino = k == 0 ? dir->ino : parent_ino(dir);
			e.attr.st_mode = S_IFDIR;
			name = k == 0 ? "." : "..";
		} else {
			name = dir_entry(fs, dir, l, k, &e, plus);
		}
		if (plus)
			want = fuse_add_direntry_plus(req, buf + pos, size - pos, name, &e,
						      (off_t)k + 1);
		else
			want = fuse_add_direntry(req, buf + pos, size - pos, name, &e.attr,
						 (off_t)k + 1);
		if (want > size - pos)
			break;
		pos += want;
	}
	fuse_reply_buf(req, buf, pos);
	free(buf);
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_list l = { 0 };
	struct ckfs_at dir;
	int rc = 0;

	if (!resolve(req, fs, ino, &dir))
		return;
	if (!is_dir(&dir))
		rc = ENOTDIR;
	else if (dir.kind != CKFS_AT_SERVED)
		rc = fs->ops->list(fs, &dir, &l);
	if (rc)
		fuse_reply_err(req, rc);
	else
		reply_dir(req, fs, &dir, &l, size, off, plus);
	ckfs_list_free(&l);
	put(fs, &dir);
}

static void ckfs_ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	(void)fi;
	readdir_common(req, ino, size, off, false);
}

static void ckfs_ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
				off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	readdir_common(req, ino, size, off, true);
}

static void ckfs_ll_releasedir(fuse_req_t req, fuse_ino_t ino,
			       struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

/* ---- the file system ---- */

static void ckfs_ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct ckfs_fs *fs = req_fs(req);
	struct statvfs st;
	const unsigned frsize = 4096;

	(void)ino;
	memset(&st, 0, sizeof(st));
	st.f_bsize = CKFS_BLKSIZE;
	st.f_frsize = frsize;
	st.f_blocks = (fsblkcnt_t)((fs->statfs_bytes + frsize - 1) / frsize);
	st.f_files = (fsfilcnt_t)fs->statfs_files;
	st.f_namemax = NAME_MAX;
	st.f_flag = ST_RDONLY;
	fuse_reply_statfs(req, &st);
}

/* Answer a getxattr of value (len bytes) asked with size: size 0 gets
 * size_hint, a smaller size ERANGE. */
static void reply_xattr(fuse_req_t req, const char *value, size_t len, size_t size,
			size_t size_hint)
{
	if (size == 0)
		fuse_reply_xattr(req, size_hint);
	else if (size < len)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, value, len);
}

/* Root xattrs: user.ckfs.stats (counters, JSON: src/fuse/counters.h) and
 * user.ckfs.source. They are not listed by listxattr so that cp -a or
 * rsync -X of the folder do not copy them. */
static void ckfs_ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			     size_t size)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_strbuf b = { 0 };
	struct ckfs_at at;

	if (!resolve(req, fs, ino, &at))
		return;
	put(fs, &at);
	if (ino == FUSE_ROOT_ID && strcmp(name, CKFS_STATS_XATTR) == 0) {
		ckfs_stats_json(fs, &b);
		if (b.failed || !b.p)
			fuse_reply_err(req, ENOMEM);
		else /* an upper bound: counters move between the query and the read */
			reply_xattr(req, b.p, b.len, size, b.len + 4096);
		free(b.p);
	} else if (ino == FUSE_ROOT_ID && strcmp(name, CKFS_SOURCE_XATTR) == 0) {
		size_t len = strlen(fs->opt->src);
		reply_xattr(req, fs->opt->src, len, size, len);
	} else {
		fuse_reply_err(req, ENODATA);
	}
}

static void ckfs_ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_at at;

	if (!resolve(req, fs, ino, &at))
		return;
	put(fs, &at);
	if (size == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

static void ckfs_ll_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_at at;

	if (!resolve(req, fs, ino, &at))
		return;
	put(fs, &at);
	fuse_reply_err(req, (mask & W_OK) ? EROFS : 0);
}

/* ---- everything that would modify the tree: EROFS ---- */

static void ckfs_ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			    int to_set, struct fuse_file_info *fi)
{
	(void)ino;
	(void)attr;
	(void)to_set;
	(void)fi;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			     const char *value, size_t size, int flags)
{
	(void)ino;
	(void)name;
	(void)value;
	(void)size;
	(void)flags;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)ino;
	(void)name;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
			  mode_t mode, dev_t rdev)
{
	(void)parent;
	(void)name;
	(void)mode;
	(void)rdev;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
			  mode_t mode)
{
	(void)parent;
	(void)name;
	(void)mode;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)parent;
	(void)name;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
			    const char *name)
{
	(void)link;
	(void)parent;
	(void)name;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			   fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	(void)parent;
	(void)name;
	(void)newparent;
	(void)newname;
	(void)flags;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
			 const char *newname)
{
	(void)ino;
	(void)newparent;
	(void)newname;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_create(fuse_req_t req, fuse_ino_t parent, const char *name,
			   mode_t mode, struct fuse_file_info *fi)
{
	(void)parent;
	(void)name;
	(void)mode;
	(void)fi;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
			  size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)ino;
	(void)buf;
	(void)size;
	(void)off;
	(void)fi;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
			      off_t length, struct fuse_file_info *fi)
{
	(void)ino;
	(void)mode;
	(void)offset;
	(void)length;
	(void)fi;
	fuse_reply_err(req, EROFS);
}

const struct fuse_lowlevel_ops ckfs_ll_ops = {
	.init = ckfs_ll_init,
	.lookup = ckfs_ll_lookup,
	.forget = ckfs_ll_forget,
	.forget_multi = ckfs_ll_forget_multi,
	.getattr = ckfs_ll_getattr,
	.setattr = ckfs_ll_setattr,
	.readlink = ckfs_ll_readlink,
	.open = ckfs_ll_open,
	.read = ckfs_ll_read,
	.release = ckfs_ll_release,
	.opendir = ckfs_ll_opendir,
	.readdir = ckfs_ll_readdir,
	.readdirplus = ckfs_ll_readdirplus,
	.releasedir = ckfs_ll_releasedir,
	.statfs = ckfs_ll_statfs,
	.getxattr = ckfs_ll_getxattr,
	.listxattr = ckfs_ll_listxattr,
	.access = ckfs_ll_access,
	.setxattr = ckfs_ll_setxattr,
	.removexattr = ckfs_ll_removexattr,
	.mknod = ckfs_ll_mknod,
	.mkdir = ckfs_ll_mkdir,
	.unlink = ckfs_ll_unlink,
	.rmdir = ckfs_ll_unlink,
	.symlink = ckfs_ll_symlink,
	.rename = ckfs_ll_rename,
	.link = ckfs_ll_link,
	.create = ckfs_ll_create,
	.write = ckfs_ll_write,
	.fallocate = ckfs_ll_fallocate,
};
