/* SPDX-License-Identifier: MIT */
/*
 * The low-level FUSE handlers: a read-only tree of the files and folders a
 * struct ckfs_folder describes (src/fuse/fs.h).
 *
 * Inodes. The tree is built once at mount and never changes, so inode
 * numbers are plain indices: the root is 1 (FUSE_ROOT_ID) and node i of the
 * folder's sorted node array is i + 2. Nothing is allocated per lookup, so
 * there is no lookup count to keep: include/fuse_lowlevel.h only requires
 * that an inode stay valid while the kernel holds references to it, and
 * every number stays valid until unmount. forget is therefore a no-op
 * (squashfuse's ll.c does the same for its 64-bit inode mode). Because the
 * numbers derive from the sorted names of an immutable folder, a remount of
 * the same checkpoint reports the same inodes, sizes and times.
 *
 * Caching. Content never changes while mounted, so entries, negative
 * entries and attributes are cached by the kernel for a day, and every open
 * sets keep_cache so the page cache survives close/open (N tensor-parallel
 * ranks and repeated loads share one copy). No direct_io: mmap must work.
 *
 * Permissions. Modes are fixed at mount (init_modes): carried from the
 * sources (include/ckfs/perm.h), or 0444/0555 less umask= when given.
 * The kernel enforces them (default_permissions is always on), so access
 * is never asked of the daemon.
 *
 * Reads. Weight files are read through the slice cache (file id = node
 * index): the slices a request covers are pinned, the reply is one iovec
 * pointing into them, then they are unpinned. Rendered files are replied
 * from memory and passthrough side files are read directly (both small).
 * Every reply carries exactly the bytes asked for, short only at EOF.
 *
 * Read-ahead. Each open file handle watches its own reads. A read that
 * starts near where the previous one ended (within two slices, which
 * tolerates the kernel's own readahead requests arriving out of order) is
 * sequential: the window opens at 2 slices, doubles each time the reader
 * enters a new slice, up to opt->readahead, and the slices ahead of the
 * reader are queued with ckfs_cache_prefetch. Any other read closes the
 * window. Slices already queued for the handle are not queued again, nor
 * slices already replied to the kernel in full (fs->replied).
 *
 * Errors. Only write attempts (EROFS) and reads can fail. A failed read is
 * answered with ckfs_err_to_errno() of the cause and logged with the file
 * name and the cause, at most once per file every ten seconds.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckfs/perm.h"
#include "ckfs/strbuf.h"
#include "fuse/counters.h"
#include "fuse/fs.h"

/* Nothing changes while mounted: let the kernel keep names and
 * attributes for a day. */
#define CKFS_TIMEOUT 86400.0
/* st_blksize: cp and friends size their buffers from it. */
#define CKFS_BLKSIZE (1u << 20)
/* Read-ahead: first window, in slices. */
#define CKFS_RA_MIN 2u
/* Seconds between two error lines about the same file. */
#define CKFS_ERR_LOG_INTERVAL 10

/* ---- per-thread scratch for the core read path ---- */

static void scratch_free(void *p)
{
	struct ckfs_read_scratch *s = p;

	ckfs_read_scratch_release(s);
	free(s);
}

struct ckfs_read_scratch *ckfs_fs_scratch(struct ckfs_fs *fs)
{
	struct ckfs_read_scratch *s = pthread_getspecific(fs->scratch_key);

	if (!s) {
		s = calloc(1, sizeof(*s));
		if (s && pthread_setspecific(fs->scratch_key, s) != 0) {
			free(s);
			s = NULL;
		}
	}
	return s;
}

/* ---- the cache's fill callback ---- */

static enum ckfs_code fill_slice(void *ctx, uint64_t file_id, uint64_t offset,
				 size_t len, void *buf, struct ckfs_error *err)
{
	struct ckfs_fs *fs = ctx;
	struct ckfs_read_scratch *scratch;
	size_t got = 0;

	if (file_id >= fs->folder->n_nodes)
		return ckfs_fail(err, CKFS_E_INVALID, "no file with id %" PRIu64,
				 file_id);
	const struct ckfs_node *n = &fs->folder->nodes[file_id];
	scratch = ckfs_fs_scratch(fs);
	if (!scratch)
		return ckfs_nomem(err);
	CKFS_TRY(ckfs_folder_read(fs->folder, n, offset, len, buf, &got, scratch, err));
	if (got != len)
		return ckfs_fail(err, CKFS_E_TRUNCATED,
				 "'%s': %zu bytes at %" PRIu64 " read as %zu", n->name,
				 len, offset, got);
	return CKFS_OK;
}

/* ---- set-up ---- */

/* The modes shown: umask= as given, or carried from the sources for the
 * owner shown. */
enum ckfs_code ckfs_fs_modes(const struct ckfs_mount_options *opt, uid_t uid, gid_t gid,
			     const struct ckfs_folder *f, mode_t **modes, mode_t *root_mode,
			     struct ckfs_error *err)
{
	struct ckfs_owner owner;
	enum ckfs_code rc;

	*modes = calloc(f->n_nodes ? f->n_nodes : 1, sizeof(**modes));
	if (!*modes)
		return ckfs_nomem(err);
	if (opt->has_umask) {
		for (size_t i = 0; i < f->n_nodes; i++)
			(*modes)[i] = 0444 & ~opt->umask;
		*root_mode = 0555 & ~opt->umask;
		return CKFS_OK;
	}
	CKFS_TRY(ckfs_owner_init(&owner, uid, gid, err));
	rc = ckfs_folder_modes(f, &owner, *modes, root_mode, err);
	ckfs_owner_release(&owner);
	return rc;
}

static enum ckfs_code init_modes(struct ckfs_fs *fs, struct ckfs_error *err)
{
	return ckfs_fs_modes(fs->opt, fs->uid, fs->gid, fs->folder, &fs->node_modes,
			     &fs->root_mode, err);
}

/* With allow_other, say how many files others cannot read because their
 * sources are closed to them, and how to publish them anyway. */
static void note_closed_files(const struct ckfs_fs *fs)
{
	size_t closed = 0;

	if (!fs->opt->allow_other || fs->opt->has_umask)
		return;
	for (size_t i = 0; i < fs->folder->n_nodes; i++)
		closed += (fs->node_modes[i] & 0004) == 0;
	if (closed || !(fs->root_mode & 0001))
		ckfs_log(CKFS_LOG_NOTICE, "allow_other: %zu of %zu files%s are not open "
			 "to other users because their sources are not; -o umask=0222 "
			 "publishes them", closed, fs->folder->n_nodes,
			 (fs->root_mode & 0001) ? "" : " and the folder");
}

/* A uint32 per slice: slice sizes are far below 4 GiB (cli/mount.c bounds
 * them). */
enum ckfs_code ckfs_fs_replied_new(const struct ckfs_folder *f, uint64_t slice_size,
				   _Atomic uint32_t ***out, struct ckfs_error *err)
{
	_Atomic uint32_t **r = calloc(f->n_nodes ? f->n_nodes : 1, sizeof(*r));

	*out = r;
	if (!r)
		return ckfs_nomem(err);
	for (size_t i = 0; i < f->n_nodes; i++) {
		if (f->nodes[i].kind != CKFS_NODE_WEIGHTS)
			continue;
		uint64_t n = (f->nodes[i].size + slice_size - 1) / slice_size;
		r[i] = calloc(n ? n : 1, sizeof(**r));
		if (!r[i])
			return ckfs_nomem(err);
	}
	return CKFS_OK;
}

void ckfs_fs_replied_free(const struct ckfs_folder *f, _Atomic uint32_t **r)
{
	if (!r)
		return;
	for (size_t i = 0; i < f->n_nodes; i++)
		free((void *)r[i]);
	free(r);
}

enum ckfs_code ckfs_fs_init(struct ckfs_fs *fs, const struct ckfs_mount_options *opt,
			    const struct ckfs_model *model,
			    const struct ckfs_folder *folder, struct ckfs_error *err)
{
	memset(fs, 0, sizeof(*fs));
	fs->opt = opt;
	fs->model = model;
	fs->folder = folder;
	fs->slice_size = opt->slice_size;
	fs->uid = opt->has_uid ? opt->uid : getuid();
	fs->gid = opt->has_gid ? opt->gid : getgid();
	CKFS_TRY(init_modes(fs, err));
	note_closed_files(fs);
	fs->err_logged_at = calloc(folder->n_nodes ? folder->n_nodes : 1,
				   sizeof(*fs->err_logged_at));
	if (!fs->err_logged_at)
		return ckfs_nomem(err);
	CKFS_TRY(ckfs_fs_replied_new(folder, opt->slice_size, &fs->replied, err));
	return ckfs_fs_init_shared(fs, opt, fill_slice, fs, err);
}

enum ckfs_code ckfs_fs_init_shared(struct ckfs_fs *fs, const struct ckfs_mount_options *opt,
				   ckfs_cache_fill_fn fill, void *ctx, struct ckfs_error *err)
{
	fs->opt = opt;
	fs->slice_size = opt->slice_size;
	if (pthread_key_create(&fs->scratch_key, scratch_free) != 0)
		return ckfs_fail(err, CKFS_E_NOMEM, "cannot create a thread key");
	fs->scratch_key_made = true;

	int ra_threads = opt->readahead > 0 ? opt->prefetch_threads : 0;
	int queue = opt->readahead * 8;
	struct ckfs_cache_options co = {
		.slice_size = opt->slice_size,
		.budget_bytes = opt->cache_size,
		.prefetch_threads = ra_threads,
		.prefetch_queue = queue < 64 ? 64 : queue,
	};
	return ckfs_cache_new(&co, fill, ctx, &fs->cache, err);
}

void ckfs_fs_release(struct ckfs_fs *fs)
{
	if (fs->cache)
		ckfs_cache_free(fs->cache);
	fs->cache = NULL;
	if (fs->scratch_key_made) {
		/* Worker threads freed theirs on exit; this thread's, if any,
		 * is freed here since destructors do not run for it. */
		struct ckfs_read_scratch *s = pthread_getspecific(fs->scratch_key);
		if (s) {
			pthread_setspecific(fs->scratch_key, NULL);
			scratch_free(s);
		}
		pthread_key_delete(fs->scratch_key);
		fs->scratch_key_made = false;
	}
	free(fs->err_logged_at);
	fs->err_logged_at = NULL;
	if (fs->replied)
		ckfs_fs_replied_free(fs->folder, fs->replied);
	fs->replied = NULL;
	free(fs->node_modes);
	fs->node_modes = NULL;
}

/*
 * Kernel readahead. A FUSE mount's readahead (the bdi's read_ahead_kb)
 * starts at 128 KiB, and the INIT reply can only lower it; mmap readers
 * (safetensors, transformers) fault pages in that many at a time. Root can
 * raise it through sysfs, but only after the kernel has processed the INIT
 * reply, which happens once the loop runs. Every request the kernel sends
 * after INIT comes after that, so the first one to reach req_fs() applies
 * it. Its device comes from mountinfo, read now, before any request.
 */
void ckfs_fs_mark_ready(struct ckfs_fs *fs, const char *mnt)
{
	char dev[32] = "";

	fs->source_bytes_at_ready = ckfs_source_bytes_read();
	clock_gettime(CLOCK_MONOTONIC, &fs->ready_at);
	if (fs->opt->kernel_readahead_kb == 0 || geteuid() != 0)
		return;
	if (ckfs_mountinfo_lookup(mnt, NULL, 0, dev, sizeof(dev)) != 1 || !dev[0]) {
		ckfs_log(CKFS_LOG_INFO, "'%s': not in mountinfo; kernel readahead left as is",
			 mnt);
		return;
	}
	snprintf(fs->bdi_ra_path, sizeof(fs->bdi_ra_path),
		 "/sys/class/bdi/%s/read_ahead_kb", dev);
	atomic_store(&fs->ra_pending, true);
}

static void apply_kernel_readahead(struct ckfs_fs *fs)
{
	char text[16];
	int fd, n, ok;

	if (!atomic_exchange(&fs->ra_pending, false))
		return;
	n = snprintf(text, sizeof(text), "%u\n", fs->opt->kernel_readahead_kb);
	fd = open(fs->bdi_ra_path, O_WRONLY | O_CLOEXEC);
	ok = fd >= 0 && write(fd, text, (size_t)n) == n;
	if (!ok)
		ckfs_log(CKFS_LOG_WARNING, "cannot set '%s' to %u: %s; kernel readahead "
			 "left as is", fs->bdi_ra_path, fs->opt->kernel_readahead_kb,
			 strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* ---- inodes and attributes ---- */

static struct ckfs_fs *req_fs(fuse_req_t req)
{
	struct ckfs_fs *fs = fuse_req_userdata(req);

	if (atomic_load_explicit(&fs->ra_pending, memory_order_relaxed))
		apply_kernel_readahead(fs);
	return fs;
}

static const struct ckfs_node *ino_node(const struct ckfs_fs *fs, fuse_ino_t ino)
{
	if (ino < 2 || ino - 2 >= fs->folder->n_nodes)
		return NULL;
	return &fs->folder->nodes[ino - 2];
}

static int ino_valid(const struct ckfs_fs *fs, fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID || ino_node(fs, ino) != NULL;
}

void ckfs_fs_stat_node(const struct ckfs_folder *f, const struct ckfs_node *n, mode_t mode,
		       uid_t uid, gid_t gid, uint64_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = uid;
	st->st_gid = gid;
	st->st_blksize = CKFS_BLKSIZE;
	st->st_atim = f->mtime;
	st->st_mtim = f->mtime;
	st->st_ctim = f->mtime;
	if (!n || n->kind == CKFS_NODE_DIR) {
		const size_t *list = n ? n->children : f->top;
		size_t n_list = n ? n->n_children : f->n_top;
		st->st_mode = S_IFDIR | mode;
		st->st_nlink = 2; /* and one per folder inside: find(1) counts on it */
		for (size_t i = 0; i < n_list; i++)
			st->st_nlink += f->nodes[list[i]].kind == CKFS_NODE_DIR;
		st->st_size = 4096;
		st->st_blocks = 8;
		return;
	}
	st->st_mode = S_IFREG | mode;
	st->st_nlink = 1;
	st->st_size = (off_t)n->size;
	/* Fully allocated: cp must not take the file for sparse. */
	st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
}

static void fill_stat(const struct ckfs_fs *fs, fuse_ino_t ino, struct stat *st)
{
	const struct ckfs_node *n = ino_node(fs, ino);

	ckfs_fs_stat_node(fs->folder, n, n ? fs->node_modes[ino - 2] : fs->root_mode, fs->uid,
			  fs->gid, ino, st);
}

/* The folder node of a directory inode: NULL for the root (*ok set), or
 * a DIR node; *ok is 0 for anything else. */
static const struct ckfs_node *dir_node(const struct ckfs_fs *fs, fuse_ino_t ino, int *ok)
{
	const struct ckfs_node *n = ino_node(fs, ino);

	*ok = ino == FUSE_ROOT_ID || (n && n->kind == CKFS_NODE_DIR);
	return n;
}

/* The inode of a node's folder ("..": the root's is the root). */
static fuse_ino_t parent_ino(const struct ckfs_node *dir)
{
	return dir && dir->parent ? (fuse_ino_t)dir->parent + 1 : FUSE_ROOT_ID;
}

/* ---- handlers ---- */

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

static void ckfs_ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ckfs_fs *fs = req_fs(req);
	struct fuse_entry_param e;
	int is_dir;
	const struct ckfs_node *dir = dir_node(fs, parent, &is_dir);

	memset(&e, 0, sizeof(e));
	if (!is_dir) {
		fuse_reply_err(req, ino_valid(fs, parent) ? ENOTDIR : ENOENT);
		return;
	}
	const struct ckfs_node *n = ckfs_folder_lookup(fs->folder, dir, name);
	e.entry_timeout = CKFS_TIMEOUT;
	if (!n) {
		/* A negative entry (ino 0) the kernel caches too: loaders probe
		 * for files that will never exist here (pytorch_model.bin, ...). */
		fuse_reply_entry(req, &e);
		return;
	}
	e.ino = (fuse_ino_t)(n - fs->folder->nodes) + 2;
	e.generation = 1;
	e.attr_timeout = CKFS_TIMEOUT;
	fill_stat(fs, e.ino, &e.attr);
	fuse_reply_entry(req, &e);
}

/* See the comment at the top of the file: inode numbers are array indices
 * that live as long as the mount, so dropped references free nothing. */
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
	struct stat st;

	(void)fi;
	if (!ino_valid(fs, ino)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_stat(fs, ino, &st);
	fuse_reply_attr(req, &st, CKFS_TIMEOUT);
}

static void ckfs_ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
			    int to_set, struct fuse_file_info *fi)
{
	(void)ino;
	(void)attr;
	(void)to_set;
	(void)fi;
	fuse_reply_err(req, EROFS);
}

static void ckfs_ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	const struct ckfs_node *n = ino_node(fs, ino);
	struct ckfs_handle *h;

	if (!n || n->kind == CKFS_NODE_DIR) {
		fuse_reply_err(req, ino == FUSE_ROOT_ID || n ? EISDIR : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_APPEND))) {
		fuse_reply_err(req, EROFS);
		return;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	h->node = (size_t)(n - fs->folder->nodes);
	pthread_mutex_init(&h->lock, NULL);
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->keep_cache = 1; /* content is immutable: keep the page cache */
	fi->noflush = 1;    /* nothing to flush on close */
	atomic_fetch_add(&fs->stats.opens, 1);
	/* When the reply cannot be sent (the open was interrupted) release
	 * will never come for this handle. */
	if (fuse_reply_open(req, fi) != 0) {
		pthread_mutex_destroy(&h->lock);
		free(h);
	}
}

static void ckfs_ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_handle *h = (struct ckfs_handle *)(uintptr_t)fi->fh;

	(void)ino;
	if (h) {
		pthread_mutex_destroy(&h->lock);
		free(h);
	}
	fuse_reply_err(req, 0);
}

static uint64_t slice_len(const struct ckfs_fs *fs, uint64_t size, uint64_t index)
{
	uint64_t start = index * fs->slice_size;
	uint64_t rest = size - start;
	return rest < fs->slice_size ? rest : fs->slice_size;
}

/* Update h's read-ahead state for a read of [off, end) and queue the
 * slices ahead of it. */
static void read_ahead(struct ckfs_fs *fs, struct ckfs_handle *h, uint64_t file_id,
		       _Atomic uint32_t *replied, uint64_t size, uint64_t off, uint64_t end)
{
	const uint64_t S = fs->slice_size, tol = 2 * S;
	const unsigned max = (unsigned)fs->opt->readahead;
	uint64_t n_slices = (size + S - 1) / S, cur = (end - 1) / S;
	uint64_t from = 0, to = 0;
	bool seq;

	if (max == 0 || fs->opt->prefetch_threads <= 0)
		return;
	pthread_mutex_lock(&h->lock);
	seq = h->seen && off + tol >= h->prev_end && off <= h->prev_end + tol;
	if (!seq) {
		h->window = 0;
		h->ra_next = 0;
		h->prev_end = end;
		h->slice = cur;
	} else {
		if (h->window == 0)
			h->window = CKFS_RA_MIN < max ? CKFS_RA_MIN : max;
		else if (cur > h->slice && h->window < max)
			h->window = h->window * 2 < max ? h->window * 2 : max;
		if (end > h->prev_end)
			h->prev_end = end;
		if (cur > h->slice)
			h->slice = cur;
		from = h->ra_next > cur + 1 ? h->ra_next : cur + 1;
		to = cur + 1 + h->window;
		if (to > n_slices)
			to = n_slices;
		if (from < to)
			h->ra_next = to;
		else
			from = to;
	}
	h->seen = true;
	pthread_mutex_unlock(&h->lock);
	if (seq)
		atomic_fetch_add(&fs->stats.ra_sequential, 1);
	for (uint64_t s = from; s < to; s++) {
		uint64_t len = slice_len(fs, size, s);
		/* Replied in full: other readers of the file (tensor-parallel
		 * ranks) got it from the kernel's page cache; filling it again
		 * would read its sources twice. */
		if (replied && atomic_load_explicit(&replied[s], memory_order_relaxed) >= len) {
			atomic_fetch_add(&fs->stats.ra_skipped, 1);
			continue;
		}
		ckfs_cache_prefetch(fs->cache, file_id, s, (size_t)len);
		atomic_fetch_add(&fs->stats.ra_slices, 1);
	}
}

static void log_read_error(struct ckfs_fs *fs, size_t node, uint64_t off,
			   size_t len, const struct ckfs_error *err)
{
	struct timespec now;
	int_fast64_t last, sec;

	clock_gettime(CLOCK_MONOTONIC, &now);
	sec = (int_fast64_t)now.tv_sec + 1; /* 0 means "never logged" */
	last = atomic_load(&fs->err_logged_at[node]);
	if (last && sec - last < CKFS_ERR_LOG_INTERVAL)
		return;
	if (!atomic_compare_exchange_strong(&fs->err_logged_at[node], &last, sec))
		return;
	ckfs_log(CKFS_LOG_ERR, "'%s': read of %zu bytes at %" PRIu64 " failed (%s): %s",
		 fs->folder->nodes[node].name, len, off,
		 strerror(ckfs_err_to_errno(err)),
		 err->msg[0] ? err->msg : ckfs_strerror(err->code));
}

static void reply_read_error(fuse_req_t req, struct ckfs_fs *fs, size_t node,
			     uint64_t off, size_t len, const struct ckfs_error *err)
{
	atomic_fetch_add(&fs->stats.errors, 1);
	log_read_error(fs, node, off, len, err);
	fuse_reply_err(req, ckfs_err_to_errno(err));
}

/* Count the bytes of [off, end) replied, per slice. A request for bytes
 * of a slice already replied in full means the kernel dropped them: start
 * counting again, so read-ahead fills that slice again. */
static void note_replied(struct ckfs_fs *fs, _Atomic uint32_t *replied, uint64_t size,
			 uint64_t off, uint64_t end)
{
	const uint64_t S = fs->slice_size;

	for (uint64_t idx = off / S; idx * S < end; idx++) {
		uint64_t a = off > idx * S ? off : idx * S;
		uint64_t b = end < (idx + 1) * S ? end : (idx + 1) * S;
		_Atomic uint32_t *r = &replied[idx];
		uint32_t was = atomic_fetch_add_explicit(r, (uint32_t)(b - a),
							 memory_order_relaxed);
		if (was >= slice_len(fs, size, idx))
			atomic_store_explicit(r, (uint32_t)(b - a), memory_order_relaxed);
	}
}

/* A weight file: pin the slices covering [off, off + len), reply with one
 * iovec into them, unpin. */
static void read_weights(fuse_req_t req, struct ckfs_fs *fs, struct ckfs_handle *h,
			 const struct ckfs_node *n, uint64_t off, size_t len)
{
	struct ckfs_error err;

	ckfs_error_clear(&err);
	if (ckfs_fs_read_cached(req, fs, h, h->node, fs->replied[h->node], n->size, off, len,
				&err) != CKFS_OK)
		reply_read_error(req, fs, h->node, off, len, &err);
}

enum ckfs_code ckfs_fs_read_cached(fuse_req_t req, struct ckfs_fs *fs, struct ckfs_handle *h,
				   uint64_t file_id, _Atomic uint32_t *replied, uint64_t size,
				   uint64_t off, size_t len, struct ckfs_error *err)
{
	enum { STACK_SLICES = 8 };
	struct ckfs_slice *stack_sl[STACK_SLICES], **sl = stack_sl;
	struct iovec stack_iov[STACK_SLICES], *iov = stack_iov;
	const uint64_t S = fs->slice_size, end = off + len;
	uint64_t first = off / S, count = (end - 1) / S - first + 1, got = 0;

	read_ahead(fs, h, file_id, replied, size, off, end);
	if (count > STACK_SLICES) {
		sl = calloc(count, sizeof(*sl));
		iov = calloc(count, sizeof(*iov));
		if (!sl || !iov) {
			ckfs_nomem(err);
			goto out;
		}
	}
	for (; got < count; got++) {
		uint64_t idx = first + got, base = idx * S;
		if (ckfs_cache_get(fs->cache, file_id, idx, (size_t)slice_len(fs, size, idx),
				   &sl[got], err) != CKFS_OK)
			goto out;
		const char *data = ckfs_slice_data(sl[got]);
		uint64_t a = off > base ? off - base : 0;
		uint64_t b = end - base < ckfs_slice_len(sl[got]) ? end - base
								  : ckfs_slice_len(sl[got]);
		iov[got].iov_base = (void *)(data + a);
		iov[got].iov_len = (size_t)(b - a);
	}
	atomic_fetch_add(&fs->stats.bytes_read, len);
	/* Counted first: once replied, the handle may be released (and h
	 * freed) by another thread at any moment. */
	if (replied)
		note_replied(fs, replied, size, off, end);
	fuse_reply_iov(req, iov, (int)count);
out:
	for (uint64_t i = 0; i < got; i++)
		ckfs_cache_put_served(fs->cache, sl[i],
				      err->code == CKFS_OK ? iov[i].iov_len : 0);
	if (sl != stack_sl)
		free(sl);
	if (iov != stack_iov)
		free(iov);
	return err->code;
}

static void ckfs_ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			 struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	struct ckfs_handle *h = (struct ckfs_handle *)(uintptr_t)fi->fh;
	const struct ckfs_node *n = &fs->folder->nodes[h->node];
	struct ckfs_error err;

	(void)ino;
	atomic_fetch_add(&fs->stats.reads, 1);
	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if ((uint64_t)off >= n->size || size == 0) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	size_t len = n->size - (uint64_t)off < size ? (size_t)(n->size - (uint64_t)off)
						      : size;
	switch (n->kind) {
	case CKFS_NODE_WEIGHTS:
		read_weights(req, fs, h, n, (uint64_t)off, len);
		return;
	case CKFS_NODE_RENDERED:
		atomic_fetch_add(&fs->stats.bytes_read, len);
		fuse_reply_buf(req, n->data + off, len);
		return;
	case CKFS_NODE_PASSTHROUGH:
		break;
	case CKFS_NODE_DIR: /* never opened as a file */
		fuse_reply_err(req, EISDIR);
		return;
	}
	/* A side file (tokenizer, generation config): small, read directly. */
	struct ckfs_read_scratch *scratch = ckfs_fs_scratch(fs);
	char *buf = malloc(len);
	size_t got = 0;
	ckfs_error_clear(&err);
	if (!buf || !scratch) {
		ckfs_nomem(&err);
	} else if (ckfs_folder_read(fs->folder, n, (uint64_t)off, len, buf, &got, scratch,
				    &err) == CKFS_OK) {
		atomic_fetch_add(&fs->stats.bytes_read, got);
		fuse_reply_buf(req, buf, got);
		free(buf);
		return;
	}
	free(buf);
	reply_read_error(req, fs, h->node, (uint64_t)off, len, &err);
}

static void ckfs_ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs_fs *fs = req_fs(req);
	int is_dir;

	dir_node(fs, ino, &is_dir);
	if (!is_dir) {
		fuse_reply_err(req, ino_valid(fs, ino) ? ENOTDIR : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	fi->cache_readdir = 1; /* the listing never changes */
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

/* Directory offsets: 0 ".", 1 "..", k >= 2 the folder's entry k - 2. */
static void reply_dir(fuse_req_t req, fuse_ino_t dir_ino, size_t size, off_t off, int plus)
{
	struct ckfs_fs *fs = req_fs(req);
	const struct ckfs_folder *f = fs->folder;
	int is_dir;
	const struct ckfs_node *dir = dir_node(fs, dir_ino, &is_dir);
	const size_t *list = dir ? dir->children : f->top;
	const size_t n_entries = (dir ? dir->n_children : f->n_top) + 2;
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
		const char *name = k == 0 ? "." : k == 1 ? ".." : f->nodes[list[k - 2]].base;
		fuse_ino_t ino = k == 0 ? dir_ino : k == 1 ? parent_ino(dir)
				 : (fuse_ino_t)list[k - 2] + 2;
		size_t want;
		if (plus) {
			struct fuse_entry_param e;
			memset(&e, 0, sizeof(e));
			e.ino = ino;
			e.generation = 1;
			e.attr_timeout = CKFS_TIMEOUT;
			e.entry_timeout = CKFS_TIMEOUT;
			fill_stat(fs, ino, &e.attr);
			want = fuse_add_direntry_plus(req, buf + pos, size - pos, name, &e,
						      (off_t)k + 1);
		} else {
			struct stat st;
			fill_stat(fs, ino, &st);
			want = fuse_add_direntry(req, buf + pos, size - pos, name, &st,
						 (off_t)k + 1);
		}
		if (want > size - pos)
			break;
		pos += want;
	}
	fuse_reply_buf(req, buf, pos);
	free(buf);
}

static void ckfs_ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	(void)fi;
	reply_dir(req, ino, size, off, 0);
}

static void ckfs_ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
				off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	reply_dir(req, ino, size, off, 1);
}

static void ckfs_ll_releasedir(fuse_req_t req, fuse_ino_t ino,
			       struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void ckfs_ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct ckfs_fs *fs = req_fs(req);
	struct statvfs st;
	uint64_t total = 0;
	const unsigned frsize = 4096;

	(void)ino;
	for (size_t i = 0; i < fs->folder->n_nodes; i++)
		total += fs->folder->nodes[i].size;
	memset(&st, 0, sizeof(st));
	st.f_bsize = CKFS_BLKSIZE;
	st.f_frsize = frsize;
	st.f_blocks = (fsblkcnt_t)((total + frsize - 1) / frsize);
	st.f_files = (fsfilcnt_t)(fs->folder->n_nodes + 1);
	st.f_namemax = NAME_MAX;
	st.f_flag = ST_RDONLY;
	fuse_reply_statfs(req, &st);
}

/* The counters as one JSON object (src/fuse/counters.h). */
static void stats_json(struct ckfs_fs *fs, struct ckfs_strbuf *b)
{
	uint64_t v[CKFS_STAT_COUNTERS];

	ckfs_strbuf_str(b, "{\"source\":");
	ckfs_strbuf_json(b, fs->opt->src);
	ckfs_strbuf_fmt(b, ",\"pid\":%ld,\"%s\":%zu", (long)getpid(), CKFS_KEY(FILES),
			fs->folder->n_nodes);
	ckfs_stats_put_uptime(fs, b);
	ckfs_stats_counters(fs, v);
	ckfs_stats_put(b, ckfs_stat_rows, CKFS_STAT_COUNTERS, v);
	ckfs_strbuf_str(b, "}\n");
}

void ckfs_fs_reply_xattr(fuse_req_t req, const char *value, size_t len, size_t size,
			 size_t size_hint)
{
	if (size == 0)
		fuse_reply_xattr(req, size_hint);
	else if (size < len)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, value, len);
}

/* Root xattrs: user.ckfs.stats (counters, JSON) and user.ckfs.source.
 * They are not listed by listxattr so that cp -a or rsync -X of the
 * folder do not copy them. */
static void ckfs_ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			     size_t size)
{
	struct ckfs_fs *fs = req_fs(req);

	if (!ino_valid(fs, ino)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	if (ino == FUSE_ROOT_ID && strcmp(name, CKFS_STATS_XATTR) == 0) {
		struct ckfs_strbuf b = { 0 };
		stats_json(fs, &b);
		if (b.failed || !b.p)
			fuse_reply_err(req, ENOMEM);
		else /* the size query answers an upper bound: counters move
		      * between the query and the read */
			ckfs_fs_reply_xattr(req, b.p, b.len, size, b.len + 4096);
		free(b.p);
		return;
	}
	if (ino == FUSE_ROOT_ID && strcmp(name, CKFS_SOURCE_XATTR) == 0) {
		size_t len = strlen(fs->opt->src);
		ckfs_fs_reply_xattr(req, fs->opt->src, len, size, len);
		return;
	}
	fuse_reply_err(req, ENODATA);
}

static void ckfs_ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct ckfs_fs *fs = req_fs(req);

	if (!ino_valid(fs, ino)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	if (size == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

static void ckfs_ll_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct ckfs_fs *fs = req_fs(req);

	if (!ino_valid(fs, ino))
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_err(req, (mask & W_OK) ? EROFS : 0);
}

/* ---- everything that would modify the tree: EROFS ---- */

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
