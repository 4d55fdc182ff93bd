/* SPDX-License-Identifier: MIT */
/*
 * Run discovery (include/ckfs/run.h): which global_step_<N> folders a run
 * folder holds, which of them are complete, and a fingerprint of a role
 * folder. Names, the tracker file and stat(2) only (and verl's manifest,
 * when a layout's detect reads it): mounting a run of a hundred steps
 * opens no rank file. Everything here is a pure function of
 * the folder's listing, so the FUSE side (src/fuse/run_tree.c) and inspect
 * decide the same way.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/file.h"
#include "ckfs/hash.h"
#include "ckfs/layouts.h"
#include "ckfs/run.h"
#include "ckfs/text.h"
#include "layouts/layouts.h"

/* The tracker holds a number: a few bytes; more is not a tracker. */
#define TRACKER_MAX 64
/* Folder depth the fingerprint walks (role/huggingface/..., role/model/
 * dist_ckpt/...). */
#define FP_DEPTH 8

/* Digits to a number: no sign, no leading zero, at most CKFS_RUN_MAX_STEP. */
static const char *parse_number(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;

	if (n == 0)
		return "no step number";
	if (n > 1 && s[0] == '0')
		return "leading zero in the step number";
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return "step number is not decimal digits";
		if (v > (CKFS_RUN_MAX_STEP - (uint64_t)(s[i] - '0')) / 10)
			return "step number too large";
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return NULL;
}

enum ckfs_step_name ckfs_run_step_name(const char *name, uint64_t *step, const char **why)
{
	const size_t k = sizeof(CKFS_RUN_STEP_PREFIX) - 1;

	if (strncmp(name, CKFS_RUN_STEP_PREFIX, k) != 0)
		return CKFS_STEP_NAME_NONE;
	*why = parse_number(name + k, strlen(name + k), step);
	return *why ? CKFS_STEP_NAME_BAD : CKFS_STEP_NAME_OK;
}

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

enum ckfs_code ckfs_run_parse_tracker(const char *label, const char *text, size_t len,
				      uint64_t *step, struct ckfs_error *err)
{
	size_t a = 0, b = len;
	const char *why;

	while (a < b && is_space(text[a]))
		a++;
	while (b > a && is_space(text[b - 1]))
		b--;
	if (a == b)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': empty (no step number)", label);
	why = parse_number(text + a, b - a, step);
	if (why)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': %s", label, why);
	return CKFS_OK;
}

/* Does a layout claim dir, as ckfs_model_open would ask (table.c)? Then
 * a folder named global_step_<N> is that checkpoint, not a step of roles.
 * When that cannot be told, it is left to the reader to say why. */
static bool is_checkpoint(const char *dir)
{
	const struct ckfs_layout *layout;
	char *real = ckfs_realpath(dir);

	if (!real)
		return true;
	const struct ckfs_file_policy pol = { .root = real };
	bool found = ckfs_layout_find(real, &pol, &layout) != 0;
	free(real);
	return found;
}

enum ckfs_run_kind ckfs_run_kind(const char *src)
{
	const char *base = strrchr(src, '/');
	enum ckfs_run_kind kind = CKFS_RUN_NOT;
	const char *name, *why;
	bool is_dir;
	uint64_t step;
	struct ckfs_dir *d;

	base = base ? base + 1 : src;
	d = ckfs_opendir(src);
	if (!d)
		return CKFS_RUN_NOT;
	while (kind == CKFS_RUN_NOT && (name = ckfs_readdir(d, &is_dir))) {
		if (strcmp(name, CKFS_RUN_TRACKER) == 0 ||
		    (ckfs_run_step_name(name, &step, &why) != CKFS_STEP_NAME_NONE && is_dir))
			kind = CKFS_RUN_RUN;
	}
	ckfs_closedir(d);
	if (kind == CKFS_RUN_NOT && ckfs_run_step_name(base, &step, &why) == CKFS_STEP_NAME_OK &&
	    !is_checkpoint(src))
		kind = CKFS_RUN_STEP;
	return kind;
}

const char *ckfs_step_state_name(enum ckfs_step_state s)
{
	switch (s) {
	case CKFS_STEP_SHOWN: return "complete";
	case CKFS_STEP_AHEAD: return "newer than the tracker (being saved)";
	case CKFS_STEP_NO_TRACKER: return "hidden: the tracker file never held a step number";
	case CKFS_STEP_WRITING: return "newest, changed in the last 10 s (being saved)";
	case CKFS_STEP_EMPTY: return "no role folder (rotated away)";
	}
	return "?";
}

static int cmp_step(const void *a, const void *b)
{
	const struct ckfs_run_step *x = a, *y = b;

	return x->step < y->step ? -1 : x->step > y->step;
}

static enum ckfs_code read_tracker(const char *src, const struct ckfs_run_scan *prev,
				   struct ckfs_run_scan *out, struct ckfs_error *err)
{
	char path[4096], *text = NULL;
	size_t len = 0;
	struct ckfs_error e;
	enum ckfs_code rc;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", src, CKFS_RUN_TRACKER) >= sizeof(path))
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': path too long", src);
	if (prev && prev->tracker_ok) {
		out->tracker_ok = true;
		out->tracker = prev->tracker;
	}
	ckfs_error_clear(&e);
	/* The policy of a run: the tracker must be a regular file in it (the
	 * root a real path, as the policy compares real paths). */
	char *real = ckfs_realpath(src);
	if (!real)
		return ckfs_fail_errno(err, "'%s': cannot resolve", src);
	struct ckfs_file_policy pol = { .root = real };
	rc = ckfs_file_read_small(&pol, path, TRACKER_MAX, &text, &len, NULL, &e);
	free(real);
	if (rc == CKFS_E_NOMEM)
		return ckfs_nomem(err);
	if (rc == CKFS_E_NOTFOUND)
		return CKFS_OK;
	out->has_tracker = true;
	if (rc == CKFS_OK) {
		uint64_t v;
		rc = ckfs_run_parse_tracker(path, text, len, &v, &e);
		if (rc == CKFS_OK) {
			out->tracker_ok = true;
			out->tracker = v;
		}
	}
	free(text);
	if (rc != CKFS_OK)
		snprintf(out->tracker_error, sizeof(out->tracker_error), "%s", e.msg);
	return CKFS_OK;
}

static enum ckfs_code add_ignored(struct ckfs_run_scan *s, size_t *cap, const char *name,
				  const char *why, struct ckfs_error *err)
{
	if (s->n_ignored == *cap) {
		size_t c = *cap ? *cap * 2 : 8;
		void *p = realloc(s->ignored, c * sizeof(*s->ignored));
		if (!p)
			return ckfs_nomem(err);
		s->ignored = p;
		*cap = c;
	}
	struct ckfs_run_ignored *g = &s->ignored[s->n_ignored++];
	ckfs_text_escape(g->name, sizeof(g->name), name);
	g->why = why;
	return CKFS_OK;
}


/* A step's role folders, counted and hashed by name; one that cannot be
 * listed (being removed) has none. */
static enum ckfs_code count_roles(const char *src, struct ckfs_run_step *s,
				  struct ckfs_error *err)
{
	char path[4096], **names;
	size_t n;
	struct ckfs_error e;
	uint64_t h = CKFS_FNV1A_START;

	snprintf(path, sizeof(path), "%s/%s", src, s->name);
	struct stat st;
	if (ckfs_stat(path, &st) == 0)
		s->mtime = st.st_mtim;
	ckfs_error_clear(&e);
	if (ckfs_run_roles(path, &names, &n, &e) != CKFS_OK)
		return e.code == CKFS_E_NOMEM ? ckfs_nomem(err) : CKFS_OK;
	for (size_t i = 0; i < n; i++) {
		/* A role folder removed and saved again (same name, new
		 * folder; file systems reuse inode numbers) makes another
		 * step: its inode and modification time count too. */
		char role[4400];
		struct stat rst;
		uint64_t id[3] = { 0, 0, 0 };
		snprintf(role, sizeof(role), "%s/%s", path, names[i]);
		if (ckfs_stat(role, &rst) == 0) {
			id[0] = (uint64_t)rst.st_ino;
			id[1] = (uint64_t)rst.st_mtim.tv_sec;
			id[2] = (uint64_t)rst.st_mtim.tv_nsec;
		}
		h = ckfs_fnv1a(h, names[i], strlen(names[i]) + 1);
		h = ckfs_fnv1a(h, id, sizeof(id));
	}
	s->n_roles = n;
	s->roles_hash = h;
	ckfs_run_roles_free(names, n);
	return CKFS_OK;
}

enum ckfs_code ckfs_run_scan(const char *src, const struct ckfs_run_scan *prev,
			     struct ckfs_run_scan *out, struct ckfs_error *err)
{
	size_t cap = 0, icap = 0;
	const char *name;
	bool is_dir;
	enum ckfs_code rc = CKFS_OK;
	struct ckfs_dir *d;

	memset(out, 0, sizeof(*out));
	struct stat st;
	if (ckfs_stat(src, &st) == 0)
		out->mtime = st.st_mtim;
	d = ckfs_opendir(src);
	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot list the run folder", src);
	errno = 0;
	while (rc == CKFS_OK && (name = ckfs_readdir(d, &is_dir))) {
		uint64_t step;
		const char *why;
		enum ckfs_step_name k = ckfs_run_step_name(name, &step, &why);
		if (k == CKFS_STEP_NAME_NONE || !is_dir)
			continue;
		if (k == CKFS_STEP_NAME_BAD) {
			rc = add_ignored(out, &icap, name, why, err);
			continue;
		}
		if (out->n_steps == cap) {
			size_t c = cap ? cap * 2 : 16;
			void *p = realloc(out->steps, c * sizeof(*out->steps));
			if (!p) {
				rc = ckfs_nomem(err);
				break;
			}
			out->steps = p;
			cap = c;
		}
		struct ckfs_run_step *s = &out->steps[out->n_steps++];
		memset(s, 0, sizeof(*s));
		s->step = step;
		snprintf(s->name, sizeof(s->name), CKFS_RUN_STEP_PREFIX "%" PRIu64, step);
	}
	ckfs_closedir(d);
	if (rc == CKFS_OK && out->n_steps)
		qsort(out->steps, out->n_steps, sizeof(*out->steps), cmp_step);
	for (size_t i = 0; rc == CKFS_OK && i < out->n_steps; i++)
		rc = count_roles(src, &out->steps[i], err);
	if (rc == CKFS_OK)
		rc = read_tracker(src, prev, out, err);
	if (rc == CKFS_OK && !out->has_tracker && out->n_steps) {
		/* Only the newest step of a run without tracker may be in the
		 * middle of its save: its newest mtime decides. */
		struct ckfs_run_step *s = &out->steps[out->n_steps - 1];
		char path[4096];
		uint64_t fp;
		struct ckfs_error e;
		ckfs_error_clear(&e);
		snprintf(path, sizeof(path), "%s/%s", src, s->name);
		if (ckfs_run_fingerprint(path, &fp, &s->newest, &e) == CKFS_E_NOMEM)
			rc = ckfs_nomem(err);
		else if (e.code != CKFS_OK)
			/* Unlistable now (being removed?): count it as just changed. */
			clock_gettime(CLOCK_REALTIME, &s->newest);
	}
	if (rc != CKFS_OK)
		ckfs_run_scan_release(out);
	return rc;
}

long ckfs_run_classify(struct ckfs_run_scan *s, const struct timespec *now)
{
	long pending = 0;

	for (size_t i = 0; i < s->n_steps; i++) {
		struct ckfs_run_step *st = &s->steps[i];
		if (s->has_tracker || s->tracker_ok) {
			if (!s->tracker_ok)
				st->state = CKFS_STEP_NO_TRACKER;
			else
				st->state = st->step <= s->tracker ? CKFS_STEP_SHOWN
								   : CKFS_STEP_AHEAD;
			continue;
		}
		st->state = CKFS_STEP_SHOWN;
		if (i + 1 == s->n_steps) {
			/* Whole seconds, rounded up, so the timer never fires
			 * early. */
			long age = (long)(now->tv_sec - st->newest.tv_sec) -
				   (now->tv_nsec < st->newest.tv_nsec);
			if (age < 0)
				age = 0;
			if (age < CKFS_RUN_QUIET_S) {
				st->state = CKFS_STEP_WRITING;
				pending = CKFS_RUN_QUIET_S - age;
			}
		}
	}
	for (size_t i = 0; i < s->n_steps; i++)
		if (s->steps[i].state == CKFS_STEP_SHOWN && s->steps[i].n_roles == 0)
			s->steps[i].state = CKFS_STEP_EMPTY;
	return pending;
}

const struct ckfs_run_step *ckfs_run_latest(const struct ckfs_run_scan *s)
{
	if (!s->has_tracker && !s->tracker_ok) {
		/* No tracker: the newest complete step. */
		for (size_t i = s->n_steps; i-- > 0;)
			if (s->steps[i].state == CKFS_STEP_SHOWN)
				return &s->steps[i];
		return NULL;
	}
	if (!s->tracker_ok)
		return NULL;
	for (size_t i = 0; i < s->n_steps; i++)
		if (s->steps[i].step == s->tracker && s->steps[i].state == CKFS_STEP_SHOWN)
			return &s->steps[i];
	return NULL;
}

void ckfs_run_scan_release(struct ckfs_run_scan *s)
{
	free(s->steps);
	free(s->ignored);
	memset(s, 0, sizeof(*s));
}

/* ---- a step's roles ---- */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void ckfs_run_roles_free(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* Sorted names of the entries of the open folder d; dirs_only keeps
 * folders, and names starting with '.' are left out when hide_dot. */
static enum ckfs_code list_names(struct ckfs_dir *d, bool dirs_only, bool hide_dot,
				 char ***names, size_t *n, struct ckfs_error *err)
{
	const char *name;
	bool is_dir;
	size_t cap = 0;

	*names = NULL;
	*n = 0;
	while ((name = ckfs_readdir(d, &is_dir))) {
		if ((hide_dot && name[0] == '.') || (dirs_only && !is_dir))
			continue;
		if (*n == cap) {
			size_t c = cap ? cap * 2 : 8;
			void *p = realloc(*names, c * sizeof(**names));
			if (!p)
				goto oom;
			*names = p;
			cap = c;
		}
		if (!((*names)[*n] = strdup(name)))
			goto oom;
		(*n)++;
	}
	if (*n)
		qsort(*names, *n, sizeof(**names), cmp_str);
	return CKFS_OK;
oom:
	ckfs_run_roles_free(*names, *n);
	*names = NULL;
	*n = 0;
	return ckfs_nomem(err);
}

enum ckfs_code ckfs_run_roles(const char *step_dir, char ***names, size_t *n,
			      struct ckfs_error *err)
{
	struct ckfs_dir *d = ckfs_opendir(step_dir);
	enum ckfs_code rc;

	*names = NULL;
	*n = 0;
	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot list the step", step_dir);
	rc = list_names(d, true, true, names, n, err);
	ckfs_closedir(d);
	return rc;
}

/* ---- fingerprint ---- */

static enum ckfs_code fp_walk(const char *dir, int depth, uint64_t *h,
			      struct timespec *newest, struct ckfs_error *err)
{
	struct ckfs_dir *d = ckfs_opendir(dir);
	char **names, path[4096];
	size_t n;
	enum ckfs_code rc;

	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot list", dir);
	rc = list_names(d, false, false, &names, &n, err);
	ckfs_closedir(d);
	for (size_t i = 0; rc == CKFS_OK && i < n; i++) {
		struct stat st;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, names[i]) >= sizeof(path) ||
		    ckfs_lstat(path, &st) != 0)
			continue; /* gone meanwhile: the names hash still differs */
		uint64_t rec[4] = { (uint64_t)st.st_mode, (uint64_t)st.st_size,
				    (uint64_t)st.st_mtim.tv_sec, (uint64_t)st.st_mtim.tv_nsec };
		*h = ckfs_fnv1a(*h, names[i], strlen(names[i]) + 1);
		*h = ckfs_fnv1a(*h, rec, sizeof(rec));
		if (st.st_mtim.tv_sec > newest->tv_sec ||
		    (st.st_mtim.tv_sec == newest->tv_sec && st.st_mtim.tv_nsec > newest->tv_nsec))
			*newest = st.st_mtim;
		if (S_ISDIR(st.st_mode) && depth < FP_DEPTH) {
			/* a folder that cannot be listed now is left out */
			struct ckfs_error e;
			ckfs_error_clear(&e);
			if (fp_walk(path, depth + 1, h, newest, &e) == CKFS_E_NOMEM)
				rc = ckfs_nomem(err);
			*h = ckfs_fnv1a(*h, "/", 1); /* where the folder ends */
		}
	}
	ckfs_run_roles_free(names, n);
	return rc;
}

enum ckfs_code ckfs_run_fingerprint(const char *dir, uint64_t *fp, struct timespec *newest,
				    struct ckfs_error *err)
{
	struct timespec nw = { 0, 0 };
	uint64_t h = CKFS_FNV1A_START;
	enum ckfs_code rc = fp_walk(dir, 0, &h, &nw, err);

	*fp = h;
	if (newest)
		*newest = nw;
	return rc;
}

enum ckfs_code ckfs_run_open_role(const char *src, const char *role_dir,
				  const struct ckfs_model_options *opt,
				  struct ckfs_model **out, struct ckfs_error *err)
{
	if (!opt->follow_symlinks) {
		char *root = ckfs_realpath(src);
		if (!root)
			return ckfs_fail_errno(err, "'%s': cannot resolve", src);
		const struct ckfs_file_policy pol = { .root = root };
		enum ckfs_code rc = ckfs_file_check_policy(&pol, role_dir, err);
		free(root);
		CKFS_TRY(rc);
	}
	return ckfs_model_open(role_dir, opt, out, err);
}
