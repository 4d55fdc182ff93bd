/* SPDX-License-Identifier: MIT */
/*
 * A mount's front end (src/fuse/tree.h): which tree serves SRC, the slice
 * cache and per-thread scratch the handlers share, the kernel readahead,
 * counting, attributes, and the life cycle the session drives.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/remote.h"
#include "ckfs/s3.h"
#include "ckfs/run.h"
#include "fuse/tree.h"

void ckfs_fs_init(struct ckfs_fs *fs, const struct ckfs_tree_ops *ops,
		  const struct ckfs_mount_options *opt)
{
	fs->ops = ops;
	fs->opt = opt;
	fs->slice_size = opt->slice_size;
	fs->uid = opt->has_uid ? opt->uid : getuid();
	fs->gid = opt->has_gid ? opt->gid : getgid();
	fs->bdi_ra_fd = -1;
	/* Reads from a store cost requests and bytes: follow each reader
	 * (read_stream.c) unless read-ahead was tuned by hand. */
	fs->stream = ckfs_s3_is_url(opt->src) && !opt->kernel_readahead_set && opt->readahead > 0 &&
		     opt->prefetch_threads > 0;
}

enum ckfs_code ckfs_fs_open(const struct ckfs_mount_options *opt, struct ckfs_fs **out,
			    struct ckfs_error *err)
{
	const char *stores[] = { opt->src, opt->model.base_path, opt->model.config_path };
	enum ckfs_code rc;

	*out = NULL;
	/* Listed here, in the daemon: its connections are its own. */
	CKFS_TRY(ckfs_remote_attach_urls(stores, 3, err));
	enum ckfs_run_kind kind = ckfs_run_kind(opt->src);
	if (kind == CKFS_RUN_NOT)
		rc = ckfs_checkpoint_tree_open(opt, out, err);
	else
		rc = ckfs_run_tree_open(opt, kind == CKFS_RUN_STEP, out, err);
	if (rc == CKFS_OK && kind != CKFS_RUN_NOT && opt->preload)
		ckfs_log(CKFS_LOG_NOTICE, "preload: a run's steps are built on first use; "
			 "nothing preloaded");
	/* Steps of a run share what did not change between them; one
	 * checkpoint rarely holds two equal slices, so it skips the hashing. */
	if (rc == CKFS_OK)
		(*out)->share_slices = opt->share_slices == CKFS_SHARE_ON ||
				       (opt->share_slices == CKFS_SHARE_AUTO && kind != CKFS_RUN_NOT);
	return rc;
}

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

enum ckfs_code ckfs_fs_start_cache(struct ckfs_fs *fs, struct ckfs_error *err)
{
	const struct ckfs_mount_options *opt = fs->opt;

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
		.share = fs->share_slices,
	};
	return ckfs_cache_new(&co, ckfs_fs_fill, fs, &fs->cache, err);
}

/* ---- kernel readahead ---- */

/*
 * A FUSE mount's readahead (the bdi's read_ahead_kb) starts at 128 KiB,
 * and the INIT reply can only lower it; mmap readers (safetensors,
 * transformers) fault pages in that many at a time. Root can raise it
 * through sysfs, but only after the kernel has processed the INIT reply,
 * which happens once the loop runs. Every request the kernel sends after
 * INIT comes after that, so the first one applies it. Its device comes
 * from mountinfo, read now, before any request.
 */
void ckfs_fs_plan_kernel_readahead(struct ckfs_fs *fs, const char *mnt)
{
	char dev[32] = "";

	if ((fs->opt->kernel_readahead_kb == 0 && !fs->stream) || geteuid() != 0)
		return;
	if (ckfs_mountinfo_lookup(mnt, NULL, 0, dev, sizeof(dev)) != 1 || !dev[0]) {
		ckfs_log(CKFS_LOG_INFO, "'%s': not in mountinfo; kernel readahead left as is",
			 mnt);
		return;
	}
	snprintf(fs->bdi_ra_path, sizeof(fs->bdi_ra_path),
		 "/sys/class/bdi/%s/read_ahead_kb", dev);
	/* opened now: the sandboxed daemon may not open it later */
	fs->bdi_ra_fd = open(fs->bdi_ra_path, O_WRONLY | O_CLOEXEC);
	if (fs->bdi_ra_fd < 0) {
		ckfs_log(CKFS_LOG_WARNING, "cannot open '%s': %s; kernel readahead left as is",
			 fs->bdi_ra_path, strerror(errno));
		return;
	}
	atomic_store(&fs->ra_pending, true);
}

void ckfs_fs_apply_kernel_readahead(struct ckfs_fs *fs)
{
	char text[16];
	int fd, n, ok;

	if (!atomic_load_explicit(&fs->ra_pending, memory_order_relaxed) ||
	    !atomic_exchange(&fs->ra_pending, false))
		return;
	/* A streaming mount: none, the daemon stores ahead of sequential
	 * readers itself and other readers get the pages they ask for. */
	unsigned kb = fs->stream ? 0 : fs->opt->kernel_readahead_kb;
	n = snprintf(text, sizeof(text), "%u\n", kb);
	fd = fs->bdi_ra_fd;
	ok = fd >= 0 && write(fd, text, (size_t)n) == n;
	if (!ok)
		ckfs_log(CKFS_LOG_WARNING,
			 "cannot set '%s' to %u: %s; kernel readahead "
			 "left as is",
			 fs->bdi_ra_path, kb, strerror(errno));
	if (fd >= 0)
		close(fd);
	fs->bdi_ra_fd = -1;
}

/* ---- life cycle ---- */

enum ckfs_code ckfs_fs_start(struct ckfs_fs *fs, struct fuse_session *se,
			     struct ckfs_error *err)
{
	fs->se = se;
	fs->source_bytes_at_ready = ckfs_source_bytes_read();
	clock_gettime(CLOCK_MONOTONIC, &fs->ready_at);
	return fs->ops->start ? fs->ops->start(fs, se, err) : CKFS_OK;
}

void ckfs_fs_stop(struct ckfs_fs *fs)
{
	if (fs && fs->ops->stop)
		fs->ops->stop(fs);
	if (fs)
		ckfs_preload_stop(fs->preload);
}

void ckfs_fs_free(struct ckfs_fs *fs)
{
	if (!fs)
		return;
	ckfs_fs_stop(fs);
	if (fs->bdi_ra_fd >= 0)
		close(fs->bdi_ra_fd); /* no request came */
	fs->bdi_ra_fd = -1;
	/* The preload and the workers first: their fills may still be asking
	 * the tree for a file. */
	ckfs_preload_free(fs->preload);
	fs->preload = NULL;
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
	fs->ops->free(fs);
}

void ckfs_fs_put(struct ckfs_fs *fs, struct ckfs_served *s)
{
	if (s && fs->ops->put)
		fs->ops->put(fs, s);
}

void ckfs_fs_count(struct ckfs_fs *fs, const struct ckfs_served *s, enum ckfs_io io,
		   uint64_t n)
{
	atomic_fetch_add_explicit(&fs->stats.io.n[io], n, memory_order_relaxed);
	if (s && s->counters)
		atomic_fetch_add_explicit(&s->counters->n[io], n, memory_order_relaxed);
}

/* ---- attributes ---- */

static void stat_base(const struct ckfs_fs *fs, uint64_t ino, struct timespec mtime,
		      struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = fs->uid;
	st->st_gid = fs->gid;
	st->st_blksize = CKFS_BLKSIZE;
	st->st_atim = mtime;
	st->st_mtim = mtime;
	st->st_ctim = mtime;
}

void ckfs_fs_stat_dir(const struct ckfs_fs *fs, uint64_t ino, mode_t mode, nlink_t subdirs,
		      struct timespec mtime, struct stat *st)
{
	stat_base(fs, ino, mtime, st);
	st->st_mode = S_IFDIR | mode;
	st->st_nlink = 2 + subdirs; /* find(1) counts on one per folder inside */
	st->st_size = 4096;
	st->st_blocks = 8;
}

void ckfs_fs_stat_link(const struct ckfs_fs *fs, uint64_t ino, size_t len,
		       struct timespec mtime, struct stat *st)
{
	stat_base(fs, ino, mtime, st);
	st->st_mode = S_IFLNK | 0777;
	st->st_nlink = 1;
	st->st_size = (off_t)len;
}

void ckfs_fs_stat_served(const struct ckfs_fs *fs, const struct ckfs_served *s,
			 const struct ckfs_node *n, uint64_t ino, struct stat *st)
{
	const struct ckfs_folder *f = s->f;

	if (!n || n->kind == CKFS_NODE_DIR) {
		const size_t *list = n ? n->children : f->top;
		size_t n_list = n ? n->n_children : f->n_top;
		nlink_t subdirs = 0;
		for (size_t i = 0; i < n_list; i++)
			subdirs += f->nodes[list[i]].kind == CKFS_NODE_DIR;
		ckfs_fs_stat_dir(fs, ino, n ? s->modes[n - f->nodes] : s->root_mode, subdirs,
				 f->mtime, st);
		return;
	}
	stat_base(fs, ino, f->mtime, st);
	st->st_mode = S_IFREG | s->modes[n - f->nodes];
	st->st_nlink = 1;
	st->st_size = (off_t)n->size;
	/* Fully allocated: cp must not take the file for sparse. */
	st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
}

/* ---- listings of a tree's own folders ---- */

int ckfs_list_add(struct ckfs_list *l, const char *name, uint64_t ino, mode_t type, bool lazy)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct ckfs_list_entry *e = realloc(l->e, cap * sizeof(*e));
		if (!e)
			return ENOMEM;
		l->e = e;
		l->cap = cap;
	}
	char *copy = strdup(name);
	if (!copy)
		return ENOMEM;
	l->e[l->n++] = (struct ckfs_list_entry){ copy, ino, type, lazy };
	return 0;
}

void ckfs_list_free(struct ckfs_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->e[i].name);
	free(l->e);
	memset(l, 0, sizeof(*l));
}
