/* SPDX-License-Identifier: MIT */
/*
 * Preload (src/fuse/preload.h): the weight files pushed into the kernel's
 * page cache ahead of the loader. One thread stores, in file order; the
 * read-ahead workers assemble the next prefetch_threads slices for it
 * meanwhile (ckfs_cache_prefetch), so assembly runs on as many cores as
 * read-ahead does.
 *
 * Why. Without it every page a loader faults in is a FUSE round trip: the
 * first load through a mount runs at 1.4-2.8x the exported copy while the
 * second, served from the page cache, runs at 1.0x. The kernel lets a
 * server store data into an inode's page cache unasked
 * (fuse_lowlevel_notify_store); pages stored are up to date, so an mmap
 * fault or a read(2) finds them and never reaches the daemon.
 *
 * Exactly the bytes a read returns. A slice is taken from the slice cache
 * (ckfs_cache_get: the same fill, the same source checks, the same bytes a
 * READ of it replies) and stored whole; the handles keep_cache and never
 * use direct_io (ll_ops.c), so the page cache is the one reads are served
 * from, and opens do not drop it. A fill that fails (a source changed,
 * CKFS_E_CHANGED) stores nothing and stops the preload: those bytes are
 * then read as without preload and fail with EIO the same way.
 *
 * The inode must be known to the kernel (notify_store answers ENOENT
 * otherwise), so the thread looks each file up itself, a stat(2) of its
 * path under the mount point, answered by this daemon's own workers; the
 * inode number the stat returns is checked to be the node's. The stat pins
 * nothing, so unmounting is never refused because of the preload. When the
 * kernel has dropped the inode since (memory pressure, drop_caches), a
 * store answers ENOENT and the file is looked up again once.
 *
 * Memory. The kernel owns the pages stored: they are ordinary clean page
 * cache, reclaimed under pressure or by drop_caches like any other. Pages
 * dropped are read again through FUSE on the next access (the read path,
 * its read-ahead and its checks, as without preload); the preload does not
 * store them a second time. What it stores is bounded by the budget it is
 * given (preload_max, by default half of MemAvailable at mount): the
 * first budget bytes of the weight files in file order. Slices stored are marked replied in full (served->replied, as a
 * READ does), so read-ahead does not fill them again, and their cache
 * buffers are done and recycled by the next fill.
 *
 * The loader first. The thread starts no slice while READ requests are in
 * flight (fs->reads_in_flight), polling every 100 us until they are
 * answered, and it skips slices a READ has already sent to the kernel. A
 * READ for a slice the thread is filling waits for that fill rather than
 * computing it twice (the cache's protocol), so it never waits longer
 * than it would have alone.
 *
 * Stopping. ckfs_preload_stop takes the lock every store holds, so no
 * store reaches the session once the front end is stopping; the thread is
 * joined after the unmount, which also ends a lookup of its own pending in
 * the kernel.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/units.h"
#include "fuse/preload.h"
#include "fuse/tree.h"

struct ckfs_preload {
	struct ckfs_fs *fs;
	struct fuse_session *se;
	struct ckfs_served *s;
	uint64_t top;               /* node i is inode top + 1 + i */
	uint64_t ahead_max;         /* slices queued to the read-ahead workers */
	char *mnt;
	uint64_t target;
	pthread_t thread;
	pthread_mutex_t lock;       /* held by every store; protects stopped */
	bool stopped;
	atomic_bool stopping;       /* stopped, read without the lock */
	atomic_bool done;
	atomic_uint_fast64_t stored, skipped, errors;
	int gate_fd;                /* tests only, see gate_open; -1: none */
	struct timespec started;
};

static bool stopping(struct ckfs_preload *p)
{
	return atomic_load_explicit(&p->stopping, memory_order_relaxed);
}

/*
 * Tests only: CKFS_PRELOAD_GATE names a FIFO the thread reads one byte
 * from before each slice (EOF: it runs free), so a test stops it at a
 * slice of its choosing without timing anything. The test holds the FIFO
 * open for writing before the mount, so this open does not block.
 */
static int gate_open(void)
{
	const char *path = getenv("CKFS_PRELOAD_GATE");
	int fd;

	if (!path || !*path)
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		ckfs_log(CKFS_LOG_WARNING, "preload: cannot open gate '%s': %s", path,
			 strerror(errno));
	return fd;
}

static void gate_pass(struct ckfs_preload *p)
{
	char c;
	ssize_t r;

	if (p->gate_fd < 0)
		return;
	do
		r = read(p->gate_fd, &c, 1);
	while (r < 0 && errno == EINTR);
	if (r <= 0) {
		close(p->gate_fd);
		p->gate_fd = -1;
	}
}

/* Wait for the loader's reads to be answered; false once stopping. */
static bool wait_turn(struct ckfs_preload *p)
{
	const struct timespec pause = { 0, 100 * 1000 };

	gate_pass(p);
	while (atomic_load_explicit(&p->fs->reads_in_flight, memory_order_relaxed) > 0 &&
	       !stopping(p))
		nanosleep(&pause, NULL);
	return !stopping(p);
}

/* Make the kernel know node n's inode: 0, or -1 (noted). */
static int look_up(struct ckfs_preload *p, const struct ckfs_node *n, uint64_t ino)
{
	char path[PATH_MAX];
	struct stat st;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", p->mnt, n->name) >= sizeof(path)) {
		ckfs_log(CKFS_LOG_NOTICE, "preload: '%s/%s': path too long", p->mnt, n->name);
		return -1;
	}
	if (stat(path, &st) != 0) {
		if (!stopping(p))
			ckfs_log(CKFS_LOG_NOTICE, "preload: cannot look up '%s': %s", path,
				 strerror(errno));
		return -1;
	}
	if ((uint64_t)st.st_ino != ino) {
		ckfs_log(CKFS_LOG_NOTICE, "preload: '%s' is inode %" PRIu64 ", not this mount's "
			 "%" PRIu64 " (something mounted over it?)", path, (uint64_t)st.st_ino, ino);
		return -1;
	}
	return 0;
}

/* Store slice sl at off of inode ino: 0, or a negative errno. */
static int store(struct ckfs_preload *p, uint64_t ino, uint64_t off, const struct ckfs_slice *sl)
{
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(ckfs_slice_len(sl));
	int rc;

	bv.buf[0].mem = (void *)ckfs_slice_data(sl);
	pthread_mutex_lock(&p->lock);
	rc = p->stopped ? -ESHUTDOWN
			: fuse_lowlevel_notify_store(p->se, (fuse_ino_t)ino, (off_t)off, &bv, 0);
	pthread_mutex_unlock(&p->lock);
	return rc;
}

/* Queue slices of node i from *ahead on, up to ahead_max slices past idx
 * and within left bytes from idx, to the read-ahead workers: they assemble
 * while this thread stores. Slices a READ has sent are left out. */
static void queue_ahead(struct ckfs_preload *p, size_t i, uint64_t idx, uint64_t left,
			uint64_t *ahead)
{
	const struct ckfs_node *n = &p->s->f->nodes[i];
	const uint64_t S = p->fs->slice_size;
	_Atomic uint32_t *replied = p->s->replied[i];

	if (*ahead <= idx)
		*ahead = idx + 1;
	for (; *ahead <= idx + p->ahead_max && *ahead * S < n->size; ++*ahead) {
		uint64_t len = n->size - *ahead * S < S ? n->size - *ahead * S : S;
		if (*ahead * S + len - idx * S > left)
			break;
		if (atomic_load_explicit(&replied[*ahead], memory_order_relaxed) < len)
			ckfs_cache_prefetch(p->fs->cache, p->s->file_base + i, *ahead, (size_t)len);
	}
}

/* Node i's slices into the page cache while *left allows: 0, or -1 when
 * the preload is to stop. */
static int preload_file(struct ckfs_preload *p, size_t i, uint64_t *left)
{
	const struct ckfs_node *n = &p->s->f->nodes[i];
	const uint64_t S = p->fs->slice_size, ino = p->top + 1 + i;
	const uint64_t file_id = p->s->file_base + i;
	_Atomic uint32_t *replied = p->s->replied[i];
	uint64_t ahead = 0;

	if (look_up(p, n, ino) != 0)
		return -1;
	for (uint64_t idx = 0; idx * S < n->size; idx++) {
		uint64_t len = n->size - idx * S < S ? n->size - idx * S : S;
		struct ckfs_slice *sl;
		struct ckfs_error err;
		int rc;

		if (len > *left || !wait_turn(p))
			return -1;
		queue_ahead(p, i, idx, *left, &ahead);
		*left -= len;
		if (atomic_load_explicit(&replied[idx], memory_order_relaxed) >= len) {
			atomic_fetch_add(&p->skipped, len);
			continue;
		}
		ckfs_error_clear(&err);
		if (ckfs_cache_get(p->fs->cache, file_id, idx, (size_t)len, &sl, &err) != CKFS_OK) {
			atomic_fetch_add(&p->errors, 1);
			ckfs_log(CKFS_LOG_NOTICE, "preload of '%s' stopped at byte %" PRIu64 ": %s",
				 n->name, idx * S, err.msg[0] ? err.msg : ckfs_strerror(err.code));
			return -1;
		}
		rc = store(p, ino, idx * S, sl);
		if (rc == -ENOENT && look_up(p, n, ino) == 0)
			rc = store(p, ino, idx * S, sl); /* the kernel had dropped the inode */
		ckfs_cache_put_served(p->fs->cache, sl, rc == 0 ? (size_t)len : 0);
		if (rc != 0) {
			if (rc != -ESHUTDOWN) {
				atomic_fetch_add(&p->errors, 1);
				ckfs_log(CKFS_LOG_NOTICE, "preload of '%s' stopped at byte %" PRIu64
					 ": cannot store: %s", n->name, idx * S, strerror(-rc));
			}
			return -1;
		}
		/* In the page cache now, as after a READ of all of it. */
		atomic_store_explicit(&replied[idx], (uint32_t)len, memory_order_relaxed);
		atomic_fetch_add(&p->stored, len);
	}
	return 0;
}

static void *preload_main(void *arg)
{
	struct ckfs_preload *p = arg;
	const struct ckfs_folder *f = p->s->f;
	uint64_t left = p->target;
	struct timespec now;
	char size_text[32];

	for (size_t i = 0; i < f->n_nodes && left; i++) {
		if (f->nodes[i].kind == CKFS_NODE_WEIGHTS && f->nodes[i].size &&
		    preload_file(p, i, &left) != 0)
			break;
	}
	clock_gettime(CLOCK_MONOTONIC, &now);
	ckfs_format_bytes((double)atomic_load(&p->stored), size_text, sizeof(size_text));
	ckfs_log(CKFS_LOG_INFO, "preload: %s stored in %.2f s", size_text,
		 (double)(now.tv_sec - p->started.tv_sec) +
			 (double)(now.tv_nsec - p->started.tv_nsec) / 1e9);
	if (p->gate_fd >= 0)
		close(p->gate_fd);
	p->gate_fd = -1;
	atomic_store(&p->done, true);
	return NULL;
}

enum ckfs_code ckfs_preload_start(struct ckfs_fs *fs, struct fuse_session *se,
				  struct ckfs_served *s, uint64_t top, const char *mnt,
				  uint64_t budget, struct ckfs_preload **out,
				  struct ckfs_error *err)
{
	struct ckfs_preload *p;
	uint64_t total = 0;
	int rc;

	*out = NULL;
	for (size_t i = 0; i < s->f->n_nodes; i++)
		if (s->f->nodes[i].kind == CKFS_NODE_WEIGHTS)
			total += s->f->nodes[i].size;
	if (total == 0 || budget == 0)
		return CKFS_OK;
	if (strncmp(mnt, "/dev/fd/", 8) == 0) {
		/* mount.fuse3 -o drop_privileges: no path to look files up by */
		ckfs_log(CKFS_LOG_NOTICE, "preload: the mount point is a file descriptor; "
			 "nothing preloaded");
		return CKFS_OK;
	}
	if (!(p = calloc(1, sizeof(*p))) || !(p->mnt = strdup(mnt))) {
		free(p);
		return ckfs_nomem(err);
	}
	p->fs = fs;
	p->se = se;
	p->s = s;
	p->top = top;
	p->target = total < budget ? total : budget;
	p->ahead_max = fs->opt->readahead > 0 && fs->opt->prefetch_threads > 0
			       ? (uint64_t)fs->opt->prefetch_threads : 0;
	p->gate_fd = gate_open();
	clock_gettime(CLOCK_MONOTONIC, &p->started);
	pthread_mutex_init(&p->lock, NULL);
	rc = pthread_create(&p->thread, NULL, preload_main, p);
	if (rc != 0) {
		if (p->gate_fd >= 0)
			close(p->gate_fd);
		pthread_mutex_destroy(&p->lock);
		free(p->mnt);
		free(p);
		return ckfs_fail(err, CKFS_E_IO, "cannot start the preload thread: %s",
				 strerror(rc));
	}
	*out = p;
	return CKFS_OK;
}

void ckfs_preload_stop(struct ckfs_preload *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stopped = true;
	atomic_store(&p->stopping, true);
	pthread_mutex_unlock(&p->lock);
}

void ckfs_preload_free(struct ckfs_preload *p)
{
	if (!p)
		return;
	ckfs_preload_stop(p);
	pthread_join(p->thread, NULL);
	pthread_mutex_destroy(&p->lock);
	free(p->mnt);
	free(p);
}

void ckfs_preload_get_stats(struct ckfs_preload *p, struct ckfs_preload_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!p)
		return;
	out->target = p->target;
	out->stored = atomic_load(&p->stored);
	out->skipped = atomic_load(&p->skipped);
	out->errors = atomic_load(&p->errors);
	out->done = atomic_load(&p->done);
}

uint64_t ckfs_preload_default_budget(void)
{
	char line[256];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024 / 2;
}
