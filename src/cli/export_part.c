/* SPDX-License-Identifier: MIT */
/*
 * --part I/N of `ckfs export` (export_part.h): which part writes which
 * file, and the staging folder's records. Every part builds the same
 * folder from the same SRC and options, so each computes the same
 * assignment alone; the plan record in the staging folder makes that a
 * checked fact rather than a hope (a part started with other options is
 * refused in one line), and a marker per finished part tells part 0 when
 * the weights are all there.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/dtype.h"
#include "ckfs/hash.h"
#include "ckfs/io.h"
#include "ckfs/model.h"
#include "ckfs/weights.h"
#include "cli/export_part.h"

#define PLAN_NAME  ".ckfs-plan"
#define MAX_PARTS  4096u
#define PLAN_LIMIT (64u << 20)

/* A whole number in [lo, hi] spelled in full, else -1. */
static long whole(const char *s, long lo, long hi)
{
	char *end;
	long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	return errno || *end || v < lo || v > hi ? -1 : v;
}

/* I from the launcher's environment; its N too where it has one. */
static int from_environment(long *index, long *count)
{
	static const char *const pairs[][2] = {
		{ "RANK", "WORLD_SIZE" },                            /* torchrun, mpirun */
		{ "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT" }, /* a Slurm array */
		{ "JOB_COMPLETION_INDEX", NULL },                    /* a Kubernetes Indexed Job */
	};

	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		long v = whole(getenv(pairs[i][0]), 0, MAX_PARTS - 1);
		if (v < 0)
			continue;
		/* an array need not start at 0 (--array=1-4) */
		long min = i == 1 ? whole(getenv("SLURM_ARRAY_TASK_MIN"), 0, LONG_MAX) : 0;
		*index = v - (min > 0 && min <= v ? min : 0);
		*count = pairs[i][1] ? whole(getenv(pairs[i][1]), 1, MAX_PARTS) : -1;
		return 1;
	}
	return 0;
}

int export_part_parse(const char *text, struct export_part *p, const char **why)
{
	const char *slash = strchr(text, '/');
	char first[32];
	long index = -1, count = -1;

	if (slash && (size_t)(slash - text) < sizeof(first))
		snprintf(first, sizeof(first), "%.*s", (int)(slash - text), text);
	else
		snprintf(first, sizeof(first), "%s", slash ? "" : text);
	if (slash)
		count = whole(slash + 1, 1, MAX_PARTS);
	if (strcmp(first, "auto") == 0) {
		long env_count = -1;
		if (!from_environment(&index, &env_count)) {
			*why = "auto: none of RANK, SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX is set";
			return 0;
		}
		if (!slash)
			count = env_count;
		if (count < 0) {
			*why = "auto: the launcher's environment has no part count; give it as auto/N";
			return 0;
		}
	} else {
		index = slash ? whole(first, 0, MAX_PARTS - 1) : -1;
	}
	if (index < 0 || count < 1) {
		*why = "I/N, auto or auto/N, with 0 <= I < N <= 4096";
		return 0;
	}
	if (index >= count) {
		*why = "the part index is not below the count";
		return 0;
	}
	p->index = (unsigned)index;
	p->count = (unsigned)count;
	return 1;
}

/* The source bytes reading t takes: its chunks, and what a view computes
 * it from (a view's later parts reuse its first's: none). */
static uint64_t read_bytes(const struct ckfs_tensor *t)
{
	uint64_t n = t->n_chunks ? t->numel * ckfs_dtype_size(t->stored_dtype) : 0;
	const struct ckfs_tensor *in[2];

	if (t->view && t->view_part == 0)
		for (size_t i = 0, k = t->view->inputs(t, in); i < k; i++)
			n += read_bytes(in[i]);
	return n;
}

static uint64_t node_bytes(const struct ckfs_node *n)
{
	uint64_t b = 0;

	if (!n->st)
		return n->size; /* GGUF: its own size, as good a measure as any */
	for (size_t i = 0; i < n->st->n_tensors; i++)
		b += read_bytes(n->st->tensors[i]);
	return b;
}

bool export_part_file(const struct ckfs_folder *f, size_t i)
{
	return f->nodes[i].kind == CKFS_NODE_WEIGHTS && !f->nodes[i].parent;
}

void export_part_assign(const struct ckfs_folder *f, unsigned count, unsigned *owner,
			uint64_t *bytes)
{
	memset(bytes, 0, count * sizeof(*bytes));
	for (size_t i = 0; i < f->n_nodes; i++)
		owner[i] = 0;
	/* Largest first to the least loaded (ties: the lower index): within
	 * the largest file of an even split. Top-level weight files only:
	 * their folder exists before part 0 writes the rest. */
	for (;;) {
		size_t pick = f->n_nodes;
		uint64_t most = 0;
		for (size_t i = 0; i < f->n_nodes; i++) {
			const struct ckfs_node *n = &f->nodes[i];
			if (!export_part_file(f, i) || owner[i] != 0)
				continue;
			uint64_t b = node_bytes(n) + 1; /* + 1: an empty file is still one */
			if (pick == f->n_nodes || b > most) {
				pick = i;
				most = b;
			}
		}
		if (pick == f->n_nodes)
			break;
		unsigned least = 0;
		for (unsigned p = 1; p < count; p++)
			least = bytes[p] < bytes[least] ? p : least;
		owner[pick] = least + 1; /* 1-based while picking: 0 is "not yet" */
		bytes[least] += most - 1;
	}
	for (size_t i = 0; i < f->n_nodes; i++)
		owner[i] = owner[i] ? owner[i] - 1 : 0;
}

/* The plan as text: N, then each node's kind, size, a hash of what
 * decides its bytes (a weight file's header, a rendered file's text) and
 * name. malloc'd, or NULL. */
static char *plan_text(const struct ckfs_folder *f, unsigned count, size_t *len)
{
	size_t cap = 64 + f->n_nodes * (PATH_MAX + 64), n = 0;
	char *s = malloc(cap);

	if (!s)
		return NULL;
	n += (size_t)snprintf(s + n, cap - n, "ckfs export parts 1\ncount %u\n", count);
	for (size_t i = 0; i < f->n_nodes && n < cap; i++) {
		const struct ckfs_node *nd = &f->nodes[i];
		uint64_t h = 0;
		if (nd->st)
			h = ckfs_fnv1a(CKFS_FNV1A_START, nd->st->header, nd->st->header_len);
		else if (nd->data)
			h = ckfs_fnv1a(CKFS_FNV1A_START, nd->data, nd->size);
		n += (size_t)snprintf(s + n, cap - n, "%d %llu %016llx %s\n", (int)nd->kind,
				      (unsigned long long)nd->size, (unsigned long long)h,
				      nd->name);
	}
	if (n >= cap) {
		free(s);
		return NULL;
	}
	*len = n;
	return s;
}

/* Whether the file at path holds exactly len bytes of text. */
static bool holds(const char *path, const char *text, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	char *buf = len < PLAN_LIMIT ? malloc(len + 1) : NULL;
	bool same = false;

	if (fd >= 0 && buf)
		same = ckfs_read_full(fd, buf, len + 1) == (ssize_t)len &&
		       memcmp(buf, text, len) == 0;
	free(buf);
	if (fd >= 0)
		close(fd);
	return same;
}

enum ckfs_code export_part_plan(const char *stage, const struct ckfs_folder *f, unsigned count,
				struct ckfs_error *err)
{
	char path[PATH_MAX], tmp[PATH_MAX];
	size_t len = 0;
	char *text = plan_text(f, count, &len);
	enum ckfs_code rc = CKFS_OK;

	if (!text)
		return ckfs_nomem(err);
	snprintf(path, sizeof(path), "%s/" PLAN_NAME, stage);
	snprintf(tmp, sizeof(tmp), "%s/" PLAN_NAME ".tmp-%ld", stage, (long)getpid());
	/* Written whole under a private name, then linked: link() never
	 * replaces, so the first part's plan is the one all compare with. */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || ckfs_write_full(fd, text, len) != (ssize_t)len || fsync(fd) != 0)
		rc = ckfs_fail_errno(err, "'%s': cannot write", tmp);
	if (fd >= 0)
		close(fd);
	if (rc == CKFS_OK && link(tmp, path) != 0 && errno != EEXIST)
		rc = ckfs_fail_errno(err, "'%s': cannot create", path);
	unlink(tmp);
	if (rc == CKFS_OK && !holds(path, text, len))
		rc = ckfs_fail(err, CKFS_E_EXISTS,
			       "'%s': left by an export of another SRC, "
			       "other options or another part count; remove it to start over",
			       stage);
	free(text);
	return rc;
}

static void marker(char *out, size_t size, const char *stage, unsigned index, unsigned count)
{
	snprintf(out, size, "%s/.ckfs-part-%u-of-%u", stage, index, count);
}

enum ckfs_code export_part_mark_done(const char *stage, const struct export_part *p,
				     struct ckfs_error *err)
{
	char path[PATH_MAX];

	marker(path, sizeof(path), stage, p->index, p->count);
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || fsync(fd) != 0) {
		if (fd >= 0)
			close(fd);
		return ckfs_fail_errno(err, "'%s': cannot create", path);
	}
	close(fd);
	return CKFS_OK;
}

bool export_part_is_done(const char *stage, unsigned index, unsigned count)
{
	char path[PATH_MAX];
	struct stat st;

	marker(path, sizeof(path), stage, index, count);
	return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void export_part_forget(const char *stage, unsigned count)
{
	char path[PATH_MAX];

	for (unsigned i = 0; i < count; i++) {
		marker(path, sizeof(path), stage, i, count);
		unlink(path);
		snprintf(path, sizeof(path), "%s/.ckfs-part-%u.lock", stage, i);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/" PLAN_NAME, stage);
	unlink(path);
}
