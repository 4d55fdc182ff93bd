/* SPDX-License-Identifier: MIT */
/*
 * The plan cache (src/layouts/layouts.h): what checking a checkpoint's
 * rank files found (for verl FSDP, the file position of every block of
 * ranks 1 .. W-1), kept on disk under the identity of all its sources, so
 * that opening the same files again need not parse them again.
 *
 * The identity is, for every source in order, its name, device, inode,
 * size, mtime and ctime (ctime changes with any write or chmod and cannot
 * be set back), plus the checkpoint folder, the kind of record and this
 * format's number and ckfs's version. A record is used only when that
 * text is equal byte for byte, the value count is the one asked for and
 * the checksum over both matches; the file must be a regular file owned
 * by this user and writable by nobody else, in a folder made 0700 (an
 * existing folder not owned by this user, or writable by others, turns
 * the cache off with one warning). Any other miss is silent: the caller checks the files itself and stores what it
 * found. Writes go to a temporary name renamed into place. The folder is
 * kept under PLAN_CACHE_BUDGET bytes: after a store, the records used
 * least recently (a hit touches its record's mtime) are removed.
 *
 * Where: $CKFS_PLAN_CACHE (a folder; "off" or empty disables it), else
 * $XDG_CACHE_HOME/ckfs/plans, else $HOME/.cache/ckfs/plans.
 *
 * Trust: the checksum catches damage, not forgery. A record is as
 * trusted as the user's own files: whoever can write this user's files
 * can write a record with a checksum that matches (and could as well
 * change the user's shell startup files); its positions are then used
 * without the rank checks. Records and folders others may write are not
 * used.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/hash.h"
#include "ckfs/io.h"
#include "ckfs/log.h"
#include "ckfs/remote.h"
#include "ckfs/strbuf.h"
#include "layouts/layouts.h"

#define PLAN_CACHE_FORMAT 1
/* A 235B-parameter MoE actor at world size 64 takes 19 MB. */
#define PLAN_CACHE_BUDGET (256ull << 20)

/* The folder is used only when it is ours and nobody else may write in
 * it: others could otherwise remove, swap or plant records. Else no cache,
 * said once per process. */
static int folder_usable(const char *dir)
{
	static atomic_flag warned = ATOMIC_FLAG_INIT;
	struct stat st;

	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return 0;
	if (st.st_uid == geteuid() && !(st.st_mode & 022))
		return 1;
	if (!atomic_flag_test_and_set(&warned))
		ckfs_log(CKFS_LOG_WARNING, "warning: '%s': plan cache folder %s (mode %04o, "
			 "owner %u); plan cache off: chmod go-w it, or set CKFS_PLAN_CACHE",
			 dir, st.st_uid != geteuid() ? "not owned by this user"
						    : "writable by others",
			 (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
	return 0;
}

/* The cache folder (created 0700 when missing), or NULL: none. */
int ckfs_plan_cache_dir(char *out, size_t size)
{
	const char *env = getenv("CKFS_PLAN_CACHE");
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	int n;

	if (env)
		n = !*env || strcmp(env, "off") == 0 ? -1 : snprintf(out, size, "%s", env);
	else if (xdg && *xdg)
		n = snprintf(out, size, "%s/ckfs/plans", xdg);
	else if (home && *home)
		n = snprintf(out, size, "%s/.cache/ckfs/plans", home);
	else
		n = -1;
	if (n < 0 || (size_t)n >= size)
		return 0;
	/* mkdir -p, each new level 0700 */
	for (char *p = out + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(out, 0700) != 0 && errno != EEXIST)
			return 0;
		*p = '/';
	}
	if (mkdir(out, 0700) != 0 && errno != EEXIST)
		return 0;
	return folder_usable(out);
}

/* The identity text of m's sources for records of `kind`. */
static int identity(const struct ckfs_model *m, const char *kind, struct ckfs_strbuf *b)
{
	ckfs_strbuf_fmt(b, "ckfs plan cache %d, ckfs %s\n%s\n%s\n%zu sources\n",
			   PLAN_CACHE_FORMAT, CKFS_VERSION, kind, m->src_dir, m->n_sources);
	for (size_t i = 0; i < m->n_sources; i++) {
		const struct ckfs_source *s = &m->sources[i];
		struct stat st;
		if (s->f.remote) { /* an object's version is its ETag */
			ckfs_strbuf_fmt(b, "%s %llu %s\n", s->name, (unsigned long long)s->size,
					ckfs_remote_etag(s->f.remote));
			continue;
		}
		if (fstat(s->f.fd, &st) != 0 || (uint64_t)st.st_size != s->size ||
		    st.st_ino != s->ino || st.st_dev != s->dev)
			return 0; /* changed since it was opened: no record */
		ckfs_strbuf_fmt(b, "%s %llu %llu %llu %lld.%09ld %lld.%09ld\n", s->name,
				   (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
				   (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec,
				   st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec,
				   st.st_ctim.tv_nsec);
	}
	return !b->failed;
}

/* The record's path for identity text id. */
static int record_path(const char *id, size_t id_len, char *out, size_t size)
{
	char dir[4096];

	if (!ckfs_plan_cache_dir(dir, sizeof(dir)))
		return 0;
	int n = snprintf(out, size, "%s/%016llx.plan", dir,
			 (unsigned long long)ckfs_fnv1a(CKFS_FNV1A_START, id, id_len));
	return n > 0 && (size_t)n < size;
}

/* The checksum a record ends with: of its identity text and values. */
static uint64_t record_sum(const struct ckfs_strbuf *id, const uint64_t *v, size_t n)
{
	return ckfs_fnv1a(ckfs_fnv1a(CKFS_FNV1A_START, id->p, id->len), v, n * 8);
}

/* All n bytes, or false: a failure or an early end of file. */
static bool read_all(int fd, void *buf, size_t n)
{
	return ckfs_read_full(fd, buf, n) == (ssize_t)n;
}

static bool write_all(int fd, const void *buf, size_t n)
{
	return ckfs_write_full(fd, buf, n) == (ssize_t)n;
}

/* The record of kind for m: n values (exactly want, or any number from
 * min when want is SIZE_MAX) into *v (v, or a new array when *v is NULL). */
static bool load(const struct ckfs_model *m, const char *kind, size_t want, size_t min,
		 uint64_t **v, size_t *n_out)
{
	struct ckfs_strbuf id = { 0 };
	char path[4200];
	bool hit = false, mine = !*v;
	int fd = -1;
	size_t n = want;

	if (!identity(m, kind, &id) || !record_path(id.p, id.len, path, sizeof(path)))
		goto out;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 022) || (uint64_t)st.st_size < id.len + 16 ||
	    (uint64_t)st.st_size > id.len + 16 + PLAN_CACHE_BUDGET)
		goto out;
	if (want == SIZE_MAX) {
		uint64_t body = (uint64_t)st.st_size - id.len - 16;
		n = (size_t)(body / 8);
		if (body % 8 || n < min || !(*v = malloc((n + 1) * 8)))
			goto out;
	}
	if ((uint64_t)st.st_size != id.len + 8 + (uint64_t)n * 8 + 8)
		goto out;
	char *stored = malloc(id.len + 1);
	uint64_t count = 0, sum = 0;
	if (!stored)
		goto out;
	hit = read_all(fd, stored, id.len) && memcmp(stored, id.p, id.len) == 0 &&
	      read_all(fd, &count, 8) && count == n && read_all(fd, *v, n * 8) &&
	      read_all(fd, &sum, 8) &&
	      sum == record_sum(&id, *v, n);
	free(stored);
	if (hit)
		futimens(fd, NULL); /* recently used: kept by prune */
out:
	if (!hit && mine && want == SIZE_MAX) {
		free(*v);
		*v = NULL;
	}
	if (fd >= 0)
		close(fd);
	free(id.p);
	if (hit) {
		*n_out = n;
		ckfs_log(CKFS_LOG_INFO, "'%s': %s from the plan cache", m->src_dir, kind);
	}
	return hit;
}

bool ckfs_plan_cache_load(const struct ckfs_model *m, const char *kind, uint64_t *v, size_t n)
{
	size_t got;

	return load(m, kind, n, n, &v, &got);
}

bool ckfs_plan_cache_load_any(const struct ckfs_model *m, const char *kind, size_t min,
			      uint64_t **v, size_t *n)
{
	*v = NULL;
	*n = 0;
	return load(m, kind, SIZE_MAX, min, v, n);
}

struct record {
	char name[64];
	off_t size;
	struct timespec mtime;
};

static int cmp_oldest(const void *a, const void *b)
{
	const struct timespec *x = &((const struct record *)a)->mtime;
	const struct timespec *y = &((const struct record *)b)->mtime;
	if (x->tv_sec != y->tv_sec)
		return x->tv_sec < y->tv_sec ? -1 : 1;
	return (x->tv_nsec > y->tv_nsec) - (x->tv_nsec < y->tv_nsec);
}

/* Remove the least recently used records of folder dir until the rest
 * fit PLAN_CACHE_BUDGET. Best effort: a failure leaves the folder as is. */
static void prune(const char *dir)
{
	DIR *d = opendir(dir);
	struct record *r = NULL;
	size_t n = 0, cap = 0;
	unsigned long long total = 0;
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		struct stat st;
		if (len < 6 || len >= sizeof(r->name) || strcmp(de->d_name + len - 5, ".plan") ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		if (n == cap) {
			struct record *g = realloc(r, (cap = cap ? 2 * cap : 64) * sizeof(*r));
			if (!g)
				goto out;
			r = g;
		}
		memcpy(r[n].name, de->d_name, len + 1);
		r[n].size = st.st_size;
		r[n].mtime = st.st_mtim;
		total += (unsigned long long)st.st_size;
		n++;
	}
	qsort(r, n, sizeof(*r), cmp_oldest);
	for (size_t i = 0; i < n && total > PLAN_CACHE_BUDGET; i++)
		if (unlinkat(dirfd(d), r[i].name, 0) == 0)
			total -= (unsigned long long)r[i].size;
out:
	free(r);
	closedir(d);
}

void ckfs_plan_cache_store(const struct ckfs_model *m, const char *kind, const uint64_t *v,
			   size_t n)
{
	struct ckfs_strbuf id = { 0 };
	char path[4200], tmp[4300];
	int fd = -1;

	if (!identity(m, kind, &id) || !record_path(id.p, id.len, path, sizeof(path)))
		goto out;
	snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		goto out;
	uint64_t count = n, sum = record_sum(&id, v, n);
	int ok = write_all(fd, id.p, id.len) && write_all(fd, &count, 8) &&
		 write_all(fd, v, n * 8) && write_all(fd, &sum, 8);
	ok &= close(fd) == 0;
	fd = -1;
	if (!ok || rename(tmp, path) != 0) {
		unlink(tmp);
	} else {
		*strrchr(path, '/') = '\0';
		prune(path);
	}
out:
	free(id.p);
}
