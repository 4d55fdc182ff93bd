/* SPDX-License-Identifier: MIT */
/*
 * ckfs export --since PREV: see export_since.h.
 *
 * A weight file is cut into blocks of SINCE_BLOCK bytes, and each block
 * into pieces at the tensors' boundaries (the header is one piece). Worker
 * threads take blocks in turn: each assembles its block from the sources
 * (ckfs_folder_read, exactly what a full export writes), reads the same
 * range of PREV's file, and compares piece by piece. A piece that differs
 * is written at once; a piece that is equal is only recorded. Once every
 * block is done:
 *
 *   - nothing differed: the new file is PREV's. It is reflinked whole
 *     (FICLONE) where the file system shares blocks, else hard-linked
 *     (the open descriptor's inode, through /proc/self/fd, so it is the
 *     file compared) when PREV's file has the mode and owner the export
 *     gives, else copied in the kernel (copy_file_range);
 *   - something differed: the equal pieces, merged into ranges, are
 *     reflinked (FICLONERANGE) over their whole file-system blocks where
 *     that works and copied in the kernel elsewhere.
 *
 * PREV is trusted for nothing but its bytes: its headers must equal this
 * export's (same tensors, dtypes, shapes and offsets: another model or
 * other options are refused), its files must stay the same (size, mtime,
 * inode) from the comparison to the end of the copy, and every range taken
 * from it was found equal to the freshly assembled bytes. So the folder is
 * byte for byte what a full export writes. Memory: two blocks per thread.
 */
#include "cli/export_since.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/io.h"
#include "ckfs/weights.h"

#define SINCE_BLOCK (8u << 20)
#define FS_BLOCK 4096u /* reflinks move whole blocks of this size at most */

struct prev_file {
	int fd;                 /* -1: not a weight file */
	struct stat st;         /* when opened */
	char path[PATH_MAX];
};

struct export_since {
	const char *prev;
	struct prev_file *files; /* per node of the folder */
	size_t n_files;
	bool no_clone;          /* a reflink was refused: do not try again */
	struct export_since_totals t;
};

/* A range of the new file that PREV holds the same. */
struct range {
	uint64_t off, len;
};

static enum ckfs_code refuse(struct ckfs_error *err, const char *path, const char *why)
{
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': %s; --since needs an earlier export of "
			 "this model with the same options", path, why);
}

/* PREV's file of weight node n: there, the same size, the same header. */
static enum ckfs_code open_prev_file(struct export_since *s, const struct ckfs_node *n,
				     struct prev_file *p, struct ckfs_error *err)
{
	const struct ckfs_st_file *st = n->st;
	unsigned char *head;

	if (snprintf(p->path, sizeof(p->path), "%s/%s", s->prev, n->name) >= (int)sizeof(p->path))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': path too long", s->prev);
	p->fd = open(p->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (p->fd < 0)
		return errno == ENOENT ? refuse(err, p->path, "not found")
				       : ckfs_fail_errno(err, "'%s': cannot open", p->path);
	if (fstat(p->fd, &p->st) != 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", p->path);
	if (!S_ISREG(p->st.st_mode))
		return refuse(err, p->path, "not a regular file");
	/* the header first: it says what differs (tensors, dtypes, shapes) */
	if (!(head = malloc(st->header_len ? st->header_len : 1)))
		return ckfs_nomem(err);
	ssize_t got = pread(p->fd, head, st->header_len, 0);
	bool same = got == (ssize_t)st->header_len && memcmp(head, st->header, st->header_len) == 0;
	free(head);
	if (got < 0)
		return ckfs_fail_errno(err, "'%s': cannot read", p->path);
	if (!same)
		return refuse(err, p->path, "its header differs from this export's (other "
			      "tensors, dtypes or shapes)");
	if ((uint64_t)p->st.st_size != n->size)
		return refuse(err, p->path, "its size differs from this export's");
	return CKFS_OK;
}

enum ckfs_code export_since_open(const char *prev, const char *src, const struct ckfs_folder *f,
				 struct export_since **out, struct ckfs_error *err)
{
	struct export_since *s = calloc(1, sizeof(*s));
	struct stat ps, ss;
	enum ckfs_code rc = CKFS_OK;

	*out = NULL;
	if (!s || !(s->files = calloc(f->n_nodes + 1, sizeof(*s->files)))) {
		free(s);
		return ckfs_nomem(err);
	}
	s->prev = prev;
	s->n_files = f->n_nodes;
	for (size_t i = 0; i < f->n_nodes; i++)
		s->files[i].fd = -1;
	if (stat(prev, &ps) != 0)
		rc = errno == ENOENT ? ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found", prev)
				     : ckfs_fail_errno(err, "'%s': cannot stat", prev);
	else if (!S_ISDIR(ps.st_mode))
		rc = refuse(err, prev, "not a folder");
	else if (stat(src, &ss) == 0 && ss.st_dev == ps.st_dev && ss.st_ino == ps.st_ino)
		/* a Hugging Face checkpoint is a folder of weights: never link
		 * the checkpoint's own files into an export */
		rc = refuse(err, prev, "the checkpoint itself");
	for (size_t i = 0; rc == CKFS_OK && i < f->n_nodes; i++) {
		const struct ckfs_node *n = &f->nodes[i];
		if (n->kind != CKFS_NODE_DIR)
			s->t.full += n->size;
		if (n->kind == CKFS_NODE_WEIGHTS)
			rc = open_prev_file(s, n, &s->files[i], err);
		else if (n->kind != CKFS_NODE_DIR)
			s->t.written += n->size; /* small files: written as they are */
		if (n->kind == CKFS_NODE_WEIGHTS)
			s->t.tensors += n->st->n_tensors;
	}
	if (rc != CKFS_OK) {
		export_since_close(s);
		return rc;
	}
	*out = s;
	return CKFS_OK;
}

void export_since_close(struct export_since *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n_files; i++)
		if (s->files[i].fd >= 0)
			close(s->files[i].fd);
	free(s->files);
	free(s);
}

const struct export_since_totals *export_since_totals(const struct export_since *s)
{
	return &s->t;
}

/* ---- comparing and writing a file ---- */

struct job {
	const struct ckfs_folder *f;
	const struct ckfs_node *n;
	const struct prev_file *prev;
	int fd;
	const char *path;
	uint64_t n_blocks;
	volatile sig_atomic_t *stop;
	atomic_uint_fast64_t next_block, written;
	struct ckfs_first_error fail;
	_Atomic unsigned char *changed; /* per tensor */
	pthread_mutex_t lock;           /* guards the ranges */
	struct range *equal;
	size_t n_equal, cap;
};

static enum ckfs_code pwrite_all(int fd, const unsigned char *buf, size_t len, uint64_t off,
				 const char *path, struct ckfs_error *err)
{
	if (ckfs_pwrite_full(fd, buf, len, off) != (ssize_t)len)
		return ckfs_fail_errno(err, "'%s': write failed", path);
	return CKFS_OK;
}

static enum ckfs_code pread_all(int fd, unsigned char *buf, size_t len, uint64_t off,
				const char *path, struct ckfs_error *err)
{
	ssize_t r = ckfs_pread_full(fd, buf, len, off);

	if (r < 0)
		return ckfs_fail_errno(err, "'%s': cannot read", path);
	if ((size_t)r < len)
		return ckfs_fail(err, CKFS_E_CHANGED,
				 "'%s': changed during the export "
				 "(shorter than when it was opened)",
				 path);
	return CKFS_OK;
}

/* The piece holding byte off of the file: 0 the header, i + 1 tensor i. */
static size_t piece_of(const struct ckfs_st_file *st, uint64_t off)
{
	return off < st->header_len ? 0 : ckfs_st_tensor_at(st, off) + 1;
}

static uint64_t piece_end(const struct ckfs_st_file *st, size_t p)
{
	return p == 0 ? st->header_len : st->offsets[p];
}

/* Compare block b; write the pieces that differ, record the equal ones. */
static enum ckfs_code do_block(struct job *j, uint64_t b, unsigned char *mine,
			       unsigned char *theirs, struct range *local, size_t *n_local,
			       struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const struct ckfs_st_file *st = j->n->st;
	uint64_t off = b * SINCE_BLOCK;
	size_t got;

	*n_local = 0;
	CKFS_TRY(ckfs_folder_read(j->f, j->n, off, SINCE_BLOCK, mine, &got, scratch, err));
	CKFS_TRY(pread_all(j->prev->fd, theirs, got, off, j->prev->path, err));
	for (uint64_t x = off; x < off + got;) {
		size_t p = piece_of(st, x);
		uint64_t end = piece_end(st, p) < off + got ? piece_end(st, p) : off + got;
		/* the last piece starting at or before x: never an empty one */
		size_t len = (size_t)(end - x);
		if (memcmp(mine + (x - off), theirs + (x - off), len) == 0) {
			if (*n_local && local[*n_local - 1].off + local[*n_local - 1].len == x)
				local[*n_local - 1].len += len;
			else
				local[(*n_local)++] = (struct range){ x, len };
		} else {
			CKFS_TRY(pwrite_all(j->fd, mine + (x - off), len, x, j->path, err));
			atomic_fetch_add(&j->written, len);
			if (p > 0)
				atomic_store(&j->changed[p - 1], 1);
		}
		x = end;
	}
	return CKFS_OK;
}

static void *worker(void *arg)
{
	struct job *j = arg;
	struct ckfs_read_scratch scratch = { 0 };
	struct ckfs_error err;
	unsigned char *mine = malloc(SINCE_BLOCK), *theirs = malloc(SINCE_BLOCK);
	/* at most one range per tensor piece in a block, and the header */
	size_t cap = j->n->st->n_tensors + 2;
	struct range *local = calloc(cap, sizeof(*local));
	size_t n_local;

	ckfs_error_clear(&err);
	if (!mine || !theirs || !local) {
		ckfs_nomem(&err);
		ckfs_first_error_set(&j->fail, &err);
	}
	while (mine && theirs && local && !atomic_load(&j->fail.failed) && !*j->stop) {
		uint64_t b = atomic_fetch_add(&j->next_block, 1);
		if (b >= j->n_blocks)
			break;
		if (do_block(j, b, mine, theirs, local, &n_local, &scratch, &err) != CKFS_OK) {
			ckfs_first_error_set(&j->fail, &err);
			break;
		}
		pthread_mutex_lock(&j->lock);
		if (j->n_equal + n_local > j->cap) {
			size_t want = (j->n_equal + n_local) * 2;
			struct range *grown = realloc(j->equal, want * sizeof(*grown));
			if (grown) {
				j->equal = grown;
				j->cap = want;
			}
		}
		bool room = j->n_equal + n_local <= j->cap;
		if (room) {
			memcpy(j->equal + j->n_equal, local, n_local * sizeof(*local));
			j->n_equal += n_local;
		}
		pthread_mutex_unlock(&j->lock);
		if (!room) {
			ckfs_nomem(&err);
			ckfs_first_error_set(&j->fail, &err);
			break;
		}
	}
	free(mine);
	free(theirs);
	free(local);
	ckfs_read_scratch_release(&scratch);
	return NULL;
}

static int cmp_range(const void *x, const void *y)
{
	const struct range *a = x, *b = y;
	return a->off < b->off ? -1 : a->off > b->off;
}

/* Sort and merge the equal ranges; returns the bytes they cover. */
static uint64_t merge_ranges(struct job *j)
{
	uint64_t total = 0;
	size_t n = 0;

	qsort(j->equal, j->n_equal, sizeof(*j->equal), cmp_range);
	for (size_t i = 0; i < j->n_equal; i++) {
		if (n && j->equal[n - 1].off + j->equal[n - 1].len == j->equal[i].off)
			j->equal[n - 1].len += j->equal[i].len;
		else
			j->equal[n++] = j->equal[i];
		total += j->equal[i].len;
	}
	j->n_equal = n;
	return total;
}

/* Copy [off, off + len) from PREV in the kernel (pread/pwrite where
 * copy_file_range cannot). */
static enum ckfs_code copy_range(struct export_since *s, struct job *j, uint64_t off,
				 uint64_t len, struct ckfs_error *err)
{
	loff_t in = (loff_t)off, out = (loff_t)off;
	unsigned char *buf = NULL;

	s->t.copied += len;
	s->t.written += len;
	while (len > 0) {
		ssize_t c = copy_file_range(j->prev->fd, &in, j->fd, &out, len, 0);
		if (c < 0 && errno == EINTR)
			continue;
		if (c > 0) {
			len -= (uint64_t)c;
			continue;
		}
		if (c == 0)
			return ckfs_fail(err, CKFS_E_CHANGED, "'%s': changed during the export "
					 "(shorter than when it was opened)", j->prev->path);
		if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
			return ckfs_fail_errno(err, "'%s': cannot copy from '%s'", j->path,
					       j->prev->path);
		break; /* not between these two: copy through a buffer */
	}
	if (len > 0 && !(buf = malloc(SINCE_BLOCK)))
		return ckfs_nomem(err);
	while (len > 0) {
		size_t k = len < SINCE_BLOCK ? (size_t)len : SINCE_BLOCK;
		enum ckfs_code rc = pread_all(j->prev->fd, buf, k, (uint64_t)in, j->prev->path, err);
		if (rc == CKFS_OK)
			rc = pwrite_all(j->fd, buf, k, (uint64_t)out, j->path, err);
		if (rc != CKFS_OK) {
			free(buf);
			return rc;
		}
		in += (loff_t)k;
		out += (loff_t)k;
		len -= k;
	}
	free(buf);
	return CKFS_OK;
}

/* A range PREV holds the same: its whole file-system blocks reflinked
 * where the file system can (offsets are the same in both files), the
 * rest copied. */
static enum ckfs_code take_range(struct export_since *s, struct job *j, const struct range *r,
				 struct ckfs_error *err)
{
	uint64_t a = (r->off + FS_BLOCK - 1) / FS_BLOCK * FS_BLOCK;
	uint64_t b = (r->off + r->len) / FS_BLOCK * FS_BLOCK;

	if (r->off + r->len == j->n->size)
		b = r->off + r->len; /* a range ending at the end may end anywhere */
	if (!s->no_clone && b > a) {
		struct file_clone_range fcr = { .src_fd = j->prev->fd, .src_offset = a,
						.src_length = b - a, .dest_offset = a };
		if (ioctl(j->fd, FICLONERANGE, &fcr) == 0) {
			s->t.cloned += b - a;
			if (a > r->off)
				CKFS_TRY(copy_range(s, j, r->off, a - r->off, err));
			if (r->off + r->len > b)
				CKFS_TRY(copy_range(s, j, b, r->off + r->len - b, err));
			return CKFS_OK;
		}
		s->no_clone = true; /* ext4, tmpfs, another file system: copies */
	}
	return copy_range(s, j, r->off, r->len, err);
}

/* PREV's file is still the one compared. */
static enum ckfs_code prev_unchanged(const struct prev_file *p, struct ckfs_error *err)
{
	struct stat now;

	if (fstat(p->fd, &now) != 0)
		return ckfs_fail_errno(err, "'%s': cannot stat", p->path);
	if (now.st_size != p->st.st_size || now.st_ino != p->st.st_ino ||
	    now.st_mtim.tv_sec != p->st.st_mtim.tv_sec || now.st_mtim.tv_nsec != p->st.st_mtim.tv_nsec)
		return ckfs_fail(err, CKFS_E_CHANGED, "'%s': changed during the export", p->path);
	return CKFS_OK;
}

/* Nothing differed: the new file (empty, open as j->fd) becomes PREV's. */
static enum ckfs_code take_whole(struct export_since *s, struct job *j, mode_t mode, gid_t gid,
				 bool *closed, struct ckfs_error *err)
{
	char proc[64];

	if (!s->no_clone && ioctl(j->fd, FICLONE, j->prev->fd) == 0) {
		s->t.cloned += j->n->size;
		s->t.files_cloned++;
		return CKFS_OK;
	}
	s->no_clone = true;
	const struct stat *st = &j->prev->st;
	/* A hard link shares PREV's mode and owner: only when they are the
	 * ones this export gives. */
	if ((st->st_mode & 07777) == mode && st->st_uid == geteuid() && st->st_gid == gid) {
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", j->prev->fd);
		close(j->fd);
		*closed = true;
		if (unlink(j->path) != 0)
			return ckfs_fail_errno(err, "'%s': cannot replace", j->path);
		if (linkat(AT_FDCWD, proc, AT_FDCWD, j->path, AT_SYMLINK_FOLLOW) == 0) {
			s->t.linked += j->n->size;
			s->t.files_linked++;
			return CKFS_OK;
		}
		if (errno != EXDEV && errno != EPERM && errno != EMLINK && errno != ENOENT)
			return ckfs_fail_errno(err, "'%s': cannot link to '%s'", j->path,
					       j->prev->path);
		/* another file system (or no /proc): copy after all */
		int fd = open(j->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
		if (fd < 0)
			return ckfs_fail_errno(err, "'%s': cannot create", j->path);
		j->fd = fd;
		*closed = false;
	}
	return copy_range(s, j, 0, j->n->size, err);
}

enum ckfs_code export_since_write(struct export_since *s, const struct ckfs_folder *f,
				  const struct ckfs_node *n, const char *path, mode_t mode,
				  gid_t gid, int threads, volatile sig_atomic_t *stop,
				  struct ckfs_error *err)
{
	struct job j = { .f = f, .n = n, .prev = &s->files[n - f->nodes], .path = path,
			 .stop = stop };
	pthread_t tids[256];
	int started = 0;
	bool closed = false;
	enum ckfs_code rc = CKFS_OK;

	struct stat st;

	j.fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
	if (j.fd < 0)
		return ckfs_fail_errno(err, "'%s': cannot create", path);
	/* as a full export: group read was carried for the folder's group, so
	 * a file given another one keeps it closed */
	if ((mode & 0040) && (fstat(j.fd, &st) != 0 || st.st_gid != gid) &&
	    fchmod(j.fd, mode & ~0070) != 0) {
		close(j.fd);
		return ckfs_fail_errno(err, "'%s': cannot set its mode", path);
	}
	if (fstat(j.fd, &st) != 0) {
		close(j.fd);
		return ckfs_fail_errno(err, "'%s': cannot stat", path);
	}
	mode = st.st_mode & 07777; /* what the umask left: a link must have it too */
	gid = st.st_gid;
	j.changed = calloc(n->st->n_tensors + 1, sizeof(*j.changed));
	if (!j.changed) {
		close(j.fd);
		return ckfs_nomem(err);
	}
	j.n_blocks = (n->size + SINCE_BLOCK - 1) / SINCE_BLOCK;
	pthread_mutex_init(&j.lock, NULL);
	ckfs_first_error_init(&j.fail);
	if (threads > 256)
		threads = 256;
	if ((uint64_t)threads > j.n_blocks)
		threads = j.n_blocks ? (int)j.n_blocks : 1;
	for (int i = 0; i < threads; i++) {
		if (pthread_create(&tids[i], NULL, worker, &j) != 0) {
			ckfs_first_error_no_thread(&j.fail);
			break;
		}
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	if (j.fail.err.code != CKFS_OK) {
		*err = j.fail.err;
		rc = err->code;
	} else if (*stop) {
		rc = ckfs_fail(err, CKFS_E_IO, "interrupted");
	}
	if (rc == CKFS_OK) {
		uint64_t equal = merge_ranges(&j);
		s->t.written += atomic_load(&j.written);
		for (size_t i = 0; i < n->st->n_tensors; i++)
			s->t.tensors_unchanged += !atomic_load(&j.changed[i]);
		if (equal == n->size) {
			rc = take_whole(s, &j, mode, gid, &closed, err);
		} else {
			for (size_t i = 0; i < j.n_equal && rc == CKFS_OK; i++)
				rc = take_range(s, &j, &j.equal[i], err);
		}
	}
	if (rc == CKFS_OK)
		rc = prev_unchanged(j.prev, err);
	if (rc == CKFS_OK && !closed && fsync(j.fd) != 0)
		rc = ckfs_fail_errno(err, "'%s': fsync failed", path);
	if (!closed && close(j.fd) != 0 && rc == CKFS_OK)
		rc = ckfs_fail_errno(err, "'%s': close failed", path);
	pthread_mutex_destroy(&j.lock);
	ckfs_first_error_destroy(&j.fail);
	free(j.equal);
	free(j.changed);
	return rc;
}
