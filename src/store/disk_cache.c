/* SPDX-License-Identifier: MIT */
/* Objects' bytes kept on disk: src/store/disk_cache.h. */
#include "store/disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/file.h"
#include "ckfs/hash.h"
#include "ckfs/log.h"

#include <xxhash.h>

/* blk1 files (no checksum) are not read: a miss, refetched, replaced. */
#define MAGIC "ckfsblk2"

struct ckfs_disk_cache {
	char dir[PATH_MAX - 64];
	uint64_t budget;
	pthread_mutex_t lock;
	uint64_t held;        /* bytes in the folder, as last counted plus added */
};

/* A block file's header: its identity, checked on read, and the
 * payload's XXH3-64, so that a damaged block is refetched, not served. */
struct header {
	char magic[8];
	uint64_t block, len;
	uint64_t sum;
	uint32_t id_len;
};

static int block_path(const struct ckfs_disk_cache *c, const char *id, uint64_t block,
		      char *out, size_t size)
{
	uint64_t h = ckfs_fnv1a(CKFS_FNV1A_START, id, strlen(id));

	return snprintf(out, size, "%s/%02x/%016llx-%llu", c->dir, (unsigned)(h >> 56),
			(unsigned long long)h, (unsigned long long)block) >= (int)size
		       ? -1 : 0;
}

/* Bytes of the regular files in the folder's subfolders; with evict, the
 * oldest removed until at most keep remain. */
struct entry {
	struct timespec mtime;
	uint64_t size;
	char path[PATH_MAX];
};

static int by_age(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;

	if (x->mtime.tv_sec != y->mtime.tv_sec)
		return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
	return (x->mtime.tv_nsec > y->mtime.tv_nsec) - (x->mtime.tv_nsec < y->mtime.tv_nsec);
}

static uint64_t scan(const struct ckfs_disk_cache *c, bool evict, uint64_t keep)
{
	struct entry *all = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;

	for (unsigned sub = 0; sub < 256; sub++) {
		char d[PATH_MAX];
		snprintf(d, sizeof(d), "%s/%02x", c->dir, sub);
		DIR *dir = opendir(d);
		struct dirent *de;
		while (dir && (de = readdir(dir))) {
			struct stat st;
			if (de->d_name[0] == '.' ||
			    fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
			    !S_ISREG(st.st_mode))
				continue;
			total += (uint64_t)st.st_size;
			if (!evict)
				continue;
			if (n == cap) {
				size_t nc = cap ? 2 * cap : 256;
				struct entry *p = realloc(all, nc * sizeof(*p));
				if (!p)
					break;
				all = p;
				cap = nc;
			}
			all[n].mtime = st.st_mtim;
			all[n].size = (uint64_t)st.st_size;
			if (snprintf(all[n].path, sizeof(all[n].path), "%s/%s", d, de->d_name) <
			    (int)sizeof(all[n].path))
				n++;
		}
		if (dir)
			closedir(dir);
	}
	if (evict) {
		if (n)
			qsort(all, n, sizeof(*all), by_age);
		for (size_t i = 0; i < n && total > keep; i++)
			if (unlink(all[i].path) == 0)
				total -= all[i].size;
	}
	free(all);
	return total;
}

enum ckfs_code ckfs_disk_cache_open(const char *dir, uint64_t budget,
				    struct ckfs_disk_cache **out, struct ckfs_error *err)
{
	struct stat st;
	struct ckfs_disk_cache *c;

	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return ckfs_fail_errno(err, "'%s': cannot make the object cache folder", dir);
	if (lstat(dir, &st) != 0)
		return ckfs_fail_errno(err, "'%s'", dir);
	/* Others who could write here could plant bytes for us to serve. */
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': the object cache must be a folder "
				 "of this user that others cannot write to", dir);
	if (!(c = calloc(1, sizeof(*c))))
		return ckfs_nomem(err);
	if (snprintf(c->dir, sizeof(c->dir), "%s", dir) >= (int)sizeof(c->dir)) {
		free(c);
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': path too long", dir);
	}
	for (unsigned sub = 0; sub < 256; sub++) {
		char d[PATH_MAX];
		snprintf(d, sizeof(d), "%s/%02x", c->dir, sub);
		if (mkdir(d, 0700) != 0 && errno != EEXIST) {
			free(c);
			return ckfs_fail_errno(err, "'%s': cannot make", d);
		}
	}
	c->budget = budget;
	c->held = scan(c, false, 0);
	if (c->held > budget) /* a smaller budget than the last process's */
		c->held = scan(c, true, budget / 8 * 7);
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return CKFS_OK;
}

const char *ckfs_disk_cache_dir(const struct ckfs_disk_cache *c)
{
	return c->dir;
}

void ckfs_disk_cache_free(struct ckfs_disk_cache *c)
{
	if (!c)
		return;
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int ckfs_disk_cache_get(struct ckfs_disk_cache *c, const char *id, uint64_t block,
			void *buf, size_t len)
{
	char path[PATH_MAX], got_id[1024];
	struct header h;
	size_t id_len = strlen(id);
	int hit = 0;

	if (id_len >= sizeof(got_id) || block_path(c, id, block, path, sizeof(path)) != 0)
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return 0;
	struct ckfs_file f = ckfs_file_of_fd(fd);
	if (ckfs_file_pread(f, &h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
	    memcmp(h.magic, MAGIC, 8) == 0 && h.block == block && h.len == len &&
	    h.id_len == id_len &&
	    ckfs_file_pread(f, got_id, id_len, sizeof(h)) == (ssize_t)id_len &&
	    memcmp(got_id, id, id_len) == 0 &&
	    ckfs_file_pread(f, buf, len, sizeof(h) + id_len) == (ssize_t)len) {
		hit = XXH3_64bits(buf, len) == h.sum;
		if (hit)
			(void)futimens(fd, NULL); /* recently used */
		else
			ckfs_log(CKFS_LOG_WARNING, "'%s': a damaged cache block (checksum), "
				 "fetched again", path);
	}
	close(fd);
	return hit;
}

void ckfs_disk_cache_put(struct ckfs_disk_cache *c, const char *id, uint64_t block,
			 const void *buf, size_t len)
{
	char path[PATH_MAX], tmp[PATH_MAX + 32];
	struct header h;

	memset(&h, 0, sizeof(h)); /* no stray padding bytes on disk */
	memcpy(h.magic, MAGIC, 8);
	h.block = block;
	h.len = len;
	h.sum = XXH3_64bits(buf, len);
	h.id_len = (uint32_t)strlen(id);
	if (block_path(c, id, block, path, sizeof(path)) != 0)
		return;
	snprintf(tmp, sizeof(tmp), "%s.%ld.%lx", path, (long)getpid(),
		 (unsigned long)pthread_self());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return;
	bool ok = write(fd, &h, sizeof(h)) == (ssize_t)sizeof(h) &&
		  write(fd, id, h.id_len) == (ssize_t)h.id_len &&
		  write(fd, buf, len) == (ssize_t)len;
	ok = close(fd) == 0 && ok && rename(tmp, path) == 0;
	if (!ok) {
		unlink(tmp);
		return;
	}
	pthread_mutex_lock(&c->lock);
	c->held += sizeof(h) + h.id_len + len;
	if (c->held > c->budget) {
		/* Counted again, others' files included; down to 7/8 of the
		 * budget so that eviction is not every block. */
		c->held = scan(c, true, c->budget / 8 * 7);
		if (c->held > c->budget)
			ckfs_log(CKFS_LOG_WARNING, "'%s': the object cache holds more than its "
				 "%llu bytes and none can be removed", c->dir,
				 (unsigned long long)c->budget);
	}
	pthread_mutex_unlock(&c->lock);
}
