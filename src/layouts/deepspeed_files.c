/* SPDX-License-Identifier: MIT */
/*
 * The files of a DeepSpeed ZeRO checkpoint (src/layouts/layouts.h): which
 * folder is the step folder (SRC itself, or the tag SRC/latest names, read
 * as zero_to_fp32 reads it), and its files by kind and data-parallel rank,
 * from their names alone. Names DeepSpeed writes for what ckfs does not
 * read (tensor-parallel ranks, pipeline layer files, MoE experts) and
 * names it never writes are refused, and so are two files of one rank, a
 * rank missing or past the world size, and model states of the other
 * stage's kind. deepspeed.c and deepspeed_states.c read the files.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layouts/layouts.h"

#define MAX_LATEST_BYTES 4096 /* the tag file: one folder name */

/* ---- file names ---- */

enum ds_kind {
	DS_NONE,       /* not a DeepSpeed checkpoint file */
	DS_MODEL_ALL,  /* mp_rank_00_model_states.pt (ZeRO-1/2: rank 0 writes it) */
	DS_MODEL_RANK, /* zero_pp_rank_R_mp_rank_00_model_states.pt (ZeRO-3) */
	DS_OPTIM,      /* [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt */
	DS_REFUSED,    /* a DeepSpeed file ckfs does not read: why says which */
};

struct ds_name {
	enum ds_kind kind;
	long rank;
	char why[160];
};

static const char *skip(const char *s, const char *lit)
{
	size_t n = strlen(lit);
	return strncmp(s, lit, n) == 0 ? s + n : NULL;
}

/* A rank as DeepSpeed prints one ({dp_rank}: no sign, no leading zero,
 * within CKFS_MAX_RANKS): the text after it, or NULL. */
static const char *rank_number(const char *s, long *v)
{
	const char *p = s;

	*v = 0;
	while (*p >= '0' && *p <= '9') {
		*v = *v * 10 + (*p++ - '0');
		if (*v > (long)CKFS_MAX_RANKS)
			return NULL;
	}
	if (p == s || (p - s > 1 && s[0] == '0'))
		return NULL;
	return p;
}

/* The tensor-parallel rank ({mp_rank:02d}): the text after it, or NULL. */
static const char *mp_number(const char *s, long *v)
{
	const char *p = s;

	*v = 0;
	while (*p >= '0' && *p <= '9' && p - s < 8)
		*v = *v * 10 + (*p++ - '0');
	if (p - s < 2 || (p - s > 2 && s[0] == '0'))
		return NULL;
	return p;
}

static enum ds_kind refuse_name(struct ds_name *out, const char *why)
{
	snprintf(out->why, sizeof(out->why), "%s", why);
	return out->kind = DS_REFUSED;
}

static enum ds_kind ds_file_name(const char *name, struct ds_name *out)
{
	static const char model_sfx[] = "_model_states.pt", optim_sfx[] = "_optim_states.pt";
	int model = ckfs_ends_with(name, model_sfx), optim = ckfs_ends_with(name, optim_sfx);
	const char *p = name, *end = name + strlen(name) - (sizeof(model_sfx) - 1);
	long mp;

	memset(out, 0, sizeof(*out));
	if (strncmp(name, "layer_", 6) == 0 && ckfs_ends_with(name, "-model_states.pt"))
		return refuse_name(out, "a pipeline-parallel layer file (DeepSpeed "
				   "PipelineModule checkpoints are not supported)");
	if (!model && !optim)
		return out->kind = DS_NONE;
	if (strstr(name, "expp_rank_") || strstr(name, "expert_"))
		return refuse_name(out, "a mixture-of-experts file (DeepSpeed MoE "
				   "checkpoints are not supported)");
	if (optim && skip(p, "bf16_"))
		p += 5;
	const char *q = skip(p, "zero_pp_rank_");
	if (q) {
		if (!(q = rank_number(q, &out->rank)) || !(q = skip(q, "_mp_rank_")) ||
		    !(q = mp_number(q, &mp)) || q != end)
			goto unknown;
		out->kind = optim ? DS_OPTIM : DS_MODEL_RANK;
	} else if (model && p == name && (q = skip(p, "mp_rank_"))) {
		if (!(q = mp_number(q, &mp)) || q != end)
			goto unknown;
		out->kind = DS_MODEL_ALL;
	} else {
		goto unknown;
	}
	if (mp != 0)
		return refuse_name(out, "a tensor-parallel rank's file (DeepSpeed "
				   "checkpoints with mp_rank above 00 are not supported)");
	return out->kind;
unknown:
	return refuse_name(out, "not a file name DeepSpeed writes "
			   "([bf16_]zero_pp_rank_<R>_mp_rank_00_optim_states.pt, "
			   "[zero_pp_rank_<R>_]mp_rank_00_model_states.pt)");
}

/* A DeepSpeed checkpoint file's name, one ckfs reads or not: this reader
 * refuses the others rather than leave them to another layout. */
static bool is_ds_file_name(const char *name)
{
	struct ds_name dn;
	return ds_file_name(name, &dn) != DS_NONE;
}

/* The first folder of src holding DeepSpeed file names (a step folder),
 * its path into out when out is given: 1; 0 when none; -1 (errno set)
 * when src, or one of its folders for want of memory, cannot be listed. */
static int find_step_folder(const char *src, char *out, size_t size)
{
	struct ckfs_dir *d = ckfs_opendir(src);
	const char *de_name;
	bool de_dir;
	int found = 0;

	if (!d)
		return -1;
	while (!found && (de_name = ckfs_readdir(d, &de_dir))) {
		char path[4096];
		if (de_name[0] == '.' ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", src, de_name) >=
			    sizeof(path) ||
		    !de_dir)
			continue;
		/* a folder that cannot be listed is not a step folder, unless
		 * listing failed for want of memory */
		found = ckfs_dir_has(path, is_ds_file_name);
		if (found < 0 && errno != ENOMEM)
			found = 0;
		if (found > 0 && out)
			snprintf(out, size, "%s", path);
	}
	int saved = errno;
	ckfs_closedir(d);
	errno = saved;
	return found;
}

int ckfs_ds_detect(const char *dir, const struct ckfs_file_policy *pol)
{
	int here = ckfs_dir_has(dir, is_ds_file_name);

	(void)pol;
	return here != 0 ? here : find_step_folder(dir, NULL, 0);
}

/* ---- the step folder and its files ---- */

/* The tag in SRC/latest, as zero_to_fp32 reads it (whitespace stripped):
 * one folder name. */
static enum ckfs_code read_tag(struct ckfs_model *m, const char *latest, char **tag,
			       struct ckfs_error *err)
{
	char *text;
	size_t len, a = 0;

	CKFS_TRY(ckfs_model_read_meta(m, latest, MAX_LATEST_BYTES, &text, &len, err));
	while (a < len && strchr(" \t\n\r\v\f\x1c\x1d\x1e\x1f", text[a]) && text[a])
		a++;
	while (len > a && strchr(" \t\n\r\v\f\x1c\x1d\x1e\x1f", text[len - 1]) && text[len - 1])
		len--;
	text[len] = '\0';
	const char *t = text + a;
	int bad = !*t || strcmp(t, ".") == 0 || strcmp(t, "..") == 0 || strlen(t) != len - a;
	for (const char *p = t; *p && !bad; p++)
		bad = *p == '/' || (unsigned char)*p < 0x20 || *p == 0x7f;
	if (bad) {
		free(text);
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': does not hold a step folder's "
				 "name", latest);
	}
	*tag = ckfs_arena_strdup(&m->arena, t);
	free(text);
	return *tag ? CKFS_OK : ckfs_nomem(err);
}

/* SRC when it holds DeepSpeed files, else the step folder SRC/latest
 * names. */
static enum ckfs_code locate_step(struct ckfs_model *m, struct ckfs_ds_files *f,
				  struct ckfs_error *err)
{
	int here = ckfs_dir_has(m->src_dir, is_ds_file_name);
	char *tag;

	if (here < 0)
		return ckfs_fail_errno(err, "'%s': cannot list", m->src_dir);
	if (here) {
		f->step = m->src_dir;
		f->step_rel = "";
		return CKFS_OK;
	}
	char *latest = ckfs_arena_printf(&m->arena, "%s/latest", m->src_dir);
	if (!latest)
		return ckfs_nomem(err);
	if (!ckfs_path_exists(latest)) {
		char step[4096] = "";
		(void)find_step_folder(m->src_dir, step, sizeof(step));
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no 'latest' file naming the step "
				 "folder to serve; serve a step folder itself%s%s%s", m->src_dir,
				 step[0] ? ", e.g. '" : "", step, step[0] ? "'" : "");
	}
	CKFS_TRY(read_tag(m, latest, &tag, err));
	char *step = ckfs_arena_printf(&m->arena, "%s/%s", m->src_dir, tag);
	char *rel = ckfs_arena_printf(&m->arena, "%s/", tag);
	if (!step || !rel)
		return ckfs_nomem(err);
	if (!ckfs_path_exists(step))
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found (the step folder '%s' "
				 "names)", step, latest);
	if (!ckfs_path_is_dir(step))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': not a folder (the step folder '%s' "
				 "names)", step, latest);
	CKFS_TRY(ckfs_file_check_policy(&m->policy, step, err));
	f->step = step;
	f->step_rel = rel;
	f->tag = tag;
	return CKFS_OK;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of dir, sorted (so the first problem reported does not depend
 * on the order readdir returns them). */
static enum ckfs_code list_names(const char *dir, char ***out, size_t *n,
				 struct ckfs_error *err)
{
	const size_t max = 4 * (size_t)CKFS_MAX_RANKS;
	size_t cap = 0;
	char **v = NULL;
	enum ckfs_code rc = CKFS_OK;
	const char *de_name;
	bool de_dir;
	struct ckfs_dir *d = ckfs_opendir(dir);

	*n = 0;
	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot open folder", dir);
	while (rc == CKFS_OK && (de_name = ckfs_readdir(d, &de_dir))) {
		struct ds_name dn;
		if (ds_file_name(de_name, &dn) == DS_NONE)
			continue;
		if (*n == max) {
			rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than %zu DeepSpeed files",
				       dir, max);
			break;
		}
		if (*n == cap) {
			size_t c = cap ? 2 * cap : 16;
			char **p = realloc(v, c * sizeof(*p));
			if (!p) {
				rc = ckfs_nomem(err);
				break;
			}
			v = p;
			cap = c;
		}
		if (!(v[*n] = strdup(de_name)))
			rc = ckfs_nomem(err);
		else
			(*n)++;
	}
	ckfs_closedir(d);
	if (*n)
		qsort(v, *n, sizeof(*v), cmp_str);
	*out = v;
	return rc;
}

/* Put name in slot rank of *v (grown to rank + 1), refusing a second
 * file for one rank. */
static enum ckfs_code put_rank(const struct ckfs_ds_files *f, char ***v, long *n, long rank,
			       char **name, const char *what, struct ckfs_error *err)
{
	if (rank >= *n) {
		char **p = realloc(*v, (size_t)(rank + 1) * sizeof(*p));
		if (!p)
			return ckfs_nomem(err);
		memset(p + *n, 0, (size_t)(rank + 1 - *n) * sizeof(*p));
		*v = p;
		*n = rank + 1;
	}
	if ((*v)[rank])
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' and '%s' are both rank %ld's "
				 "%s", f->step, (*v)[rank], *name, rank, what);
	(*v)[rank] = *name;
	*name = NULL;
	return CKFS_OK;
}

/* The DeepSpeed files of the step folder, by kind and rank; refused:
 * names of files ckfs does not read, two files of one rank. */
static enum ckfs_code scan_step(struct ckfs_ds_files *f, struct ckfs_error *err)
{
	char **names = NULL;
	size_t n = 0;
	enum ckfs_code rc = list_names(f->step, &names, &n, err);

	for (size_t i = 0; rc == CKFS_OK && i < n; i++) {
		struct ds_name dn;
		switch (ds_file_name(names[i], &dn)) {
		case DS_REFUSED:
			rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s/%s': %s", f->step,
				       names[i], dn.why);
			break;
		case DS_OPTIM:
			rc = put_rank(f, &f->optim, &f->n_optim, dn.rank, &names[i],
				      "optimizer state", err);
			break;
		case DS_MODEL_RANK:
			rc = put_rank(f, &f->model_rank, &f->n_model_rank, dn.rank, &names[i],
				      "model states", err);
			break;
		case DS_MODEL_ALL:
			f->model_all = names[i];
			names[i] = NULL;
			break;
		case DS_NONE:
			break;
		}
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rc == CKFS_OK && f->n_optim == 0)
		rc = ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no *_optim_states.pt files (the "
			       "fp32 master weights are in them)", f->step);
	return rc;
}

/* The name DeepSpeed gives rank r's optimizer file, after the others'. */
void ckfs_ds_optim_name(const struct ckfs_ds_files *f, long r, char *out, size_t size)
{
	int bf16 = 0;

	for (long i = 0; i < f->n_optim; i++)
		if (f->optim[i])
			bf16 = strncmp(f->optim[i], "bf16_", 5) == 0;
	snprintf(out, size, "%szero_pp_rank_%ld_mp_rank_00_optim_states.pt", bf16 ? "bf16_" : "",
		 r);
}

/* Every rank 0 .. ws-1 has its file in v, and no other rank does. */
static enum ckfs_code check_ranks(const struct ckfs_ds_files *f, char *const *v, long n,
				  const char *kind, struct ckfs_error *err)
{
	char name[128];

	for (long r = 0; r < f->ws; r++)
		if (r >= n || !v[r]) {
			if (strcmp(kind, "optim") == 0)
				ckfs_ds_optim_name(f, r, name, sizeof(name));
			else
				snprintf(name, sizeof(name), "zero_pp_rank_%ld_mp_rank_00_"
					 "model_states.pt", r);
			return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/%s': not found (rank %ld of "
					 "%d is needed)", f->step, name, r, f->ws);
		}
	for (long r = f->ws; r < n; r++)
		if (v[r])
			return ckfs_fail(err, CKFS_E_INVALID, "'%s/%s': rank %ld out of range for "
					 "world size %d (partition_count)", f->step, v[r], r,
					 f->ws);
	return CKFS_OK;
}

/* The model states files the stage needs, and no others. */
static enum ckfs_code check_model_files(const struct ckfs_ds_files *f, struct ckfs_error *err)
{
	if (f->stage == 3) {
		if (f->model_all)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s/%s': a ZeRO-1/2 model states "
					 "file in a ZeRO-3 checkpoint", f->step, f->model_all);
		return check_ranks(f, f->model_rank, f->n_model_rank, "model", err);
	}
	for (long r = 0; r < f->n_model_rank; r++)
		if (f->model_rank[r])
			return ckfs_fail(err, CKFS_E_INVALID, "'%s/%s': a ZeRO-3 model states "
					 "file in a ZeRO-%d checkpoint", f->step, f->model_rank[r],
					 f->stage ? f->stage : 1);
	if (!f->model_all)
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/mp_rank_00_model_states.pt': not "
				 "found", f->step);
	return CKFS_OK;
}

enum ckfs_code ckfs_ds_find_files(struct ckfs_model *m, struct ckfs_ds_files *f,
				  struct ckfs_error *err)
{
	memset(f, 0, sizeof(*f));
	CKFS_TRY(locate_step(m, f, err));
	return scan_step(f, err);
}

enum ckfs_code ckfs_ds_check_files(const struct ckfs_ds_files *f, struct ckfs_error *err)
{
	CKFS_TRY(check_ranks(f, f->optim, f->n_optim, "optim", err));
	return check_model_files(f, err);
}

void ckfs_ds_files_release(struct ckfs_ds_files *f)
{
	for (long r = 0; r < f->n_optim; r++)
		free(f->optim[r]);
	for (long r = 0; r < f->n_model_rank; r++)
		free(f->model_rank[r]);
	free(f->optim);
	free(f->model_rank);
	free(f->model_all);
	memset(f, 0, sizeof(*f));
}
