/* SPDX-License-Identifier: MIT */
/*
 * The verl FSDP layout (verl-checkpoints.md sections 1-2): a folder with
 * model_world_size_W_rank_R.pt per rank, fsdp_config.json and huggingface/.
 *
 * Rank files: every name matching model_world_size_*_rank_*.pt must be
 * spelt as verl spells it, one file per (world size, rank), and every rank
 * of the world size must have its file (ckfs_fsdp_rank_file_name and the
 * scan below).
 *
 * Which ranks are read: all of them, each rank's entries checked against
 * rank 0's (kind, dtype, shapes, mesh, placements, mesh coordinate). The
 * device mesh comes from the first DTensor of rank 0; placement.c turns
 * each rank's entries into chunks, and a copy along a Replicate() mesh
 * dim (HSDP's "ddp") contributes none. A plain tensor is served from rank
 * 0, as verl does since it stopped concatenating them; the other ranks'
 * copies must have its shape and dtype and are kept for ckfs verify,
 * which compares their values as verl's merger does. The finished plan is
 * validated by plan.c.
 *
 * Naming follows verl's merger: keys as stored, less torch wrapper names
 * (names.c); lm_head.weight is dropped when config.json says
 * tie_word_embeddings and model.embed_tokens.weight exists.
 */
#include "ckfs/model.h"
#include "ckfs/units.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/log.h"
#include "layouts/layouts.h"

/* ---- small helpers ---- */

/* ---- rank file names ---- */

/* One number of a rank file name, [s, s + len): its value (saturated past
 * the limit) and how verl's spelling is departed from. */
struct name_number {
	long value;
	bool not_a_number, too_large, sign, leading_zero;
};

static struct name_number parse_name_number(const char *s, size_t len)
{
	struct name_number n = { 0 };
	size_t i = 0;
	int negative = 0;

	if (len > 0 && (s[0] == '+' || s[0] == '-')) {
		n.sign = true;
		negative = s[0] == '-';
		i = 1;
	}
	if (i == len)
		n.not_a_number = true;
	for (size_t k = i; k < len; k++)
		n.not_a_number |= !isdigit((unsigned char)s[k]);
	if (n.not_a_number)
		return n;
	n.leading_zero = len - i > 1 && s[i] == '0';
	for (; i < len && !n.too_large; i++) {
		n.value = n.value * 10 + (s[i] - '0');
		n.too_large = n.value > (long)CKFS_MAX_RANKS;
	}
	if (negative)
		n.value = -n.value;
	return n;
}

/* Fill why with the first departure of n (named what, spelt [s, s+len))
 * from verl's spelling; 0 when there is none. */
static int number_problem(const struct name_number *n, const char *what, const char *s,
			  size_t len, char *why, size_t size)
{
	int l = len > 64 ? 64 : (int)len;

	if (n->not_a_number)
		snprintf(why, size, "%s '%.*s' is not a decimal number", what, l, s);
	else if (n->too_large)
		snprintf(why, size, "%s %.*s is more than the limit of %u ranks", what, l, s,
			 CKFS_MAX_RANKS);
	else if (n->sign)
		snprintf(why, size, "%s '%.*s' has a sign", what, l, s);
	else if (n->leading_zero)
		snprintf(why, size, "%s '%.*s' has a leading zero", what, l, s);
	else
		return 0;
	return 1;
}

enum ckfs_rank_name ckfs_fsdp_rank_file_name(const char *name, struct ckfs_rank_file *out)
{
	static const char p1[] = "model_world_size_", p2[] = "_rank_", sfx[] = ".pt";
	size_t n = strlen(name);

	memset(out, 0, sizeof(*out));
	if (strncmp(name, p1, sizeof(p1) - 1) != 0 || n < sizeof(p1) + sizeof(sfx) ||
	    strcmp(name + n - (sizeof(sfx) - 1), sfx) != 0)
		return CKFS_RANK_NAME_NONE;
	const char *w = name + sizeof(p1) - 1;
	const char *mid = strstr(w, p2);
	const char *end = name + n - (sizeof(sfx) - 1);
	if (!mid || mid + sizeof(p2) - 1 > end)
		return CKFS_RANK_NAME_NONE;
	const char *r = mid + sizeof(p2) - 1;
	size_t wl = (size_t)(mid - w), rl = (size_t)(end - r);
	struct name_number ws = parse_name_number(w, wl);
	struct name_number rank = parse_name_number(r, rl);
	out->ws = ws.value;
	out->rank = rank.value;
	out->over_limit = ws.too_large || rank.too_large;
	if ((ws.not_a_number || ws.too_large) &&
	    number_problem(&ws, "world size", w, wl, out->why, sizeof(out->why)))
		return CKFS_RANK_NAME_BAD;
	if ((rank.not_a_number || rank.too_large) &&
	    number_problem(&rank, "rank", r, rl, out->why, sizeof(out->why)))
		return CKFS_RANK_NAME_BAD;
	if (ws.value == 0) {
		snprintf(out->why, sizeof(out->why), "world size %.*s is not a positive number",
			 (int)(wl > 64 ? 64 : wl), w);
		return CKFS_RANK_NAME_BAD;
	}
	if (number_problem(&ws, "world size", w, wl, out->why, sizeof(out->why)) ||
	    number_problem(&rank, "rank", r, rl, out->why, sizeof(out->why))) {
		size_t k = strlen(out->why);
		if (ws.value > 0 && rank.value >= 0)
			snprintf(out->why + k, sizeof(out->why) - k,
				 " (verl writes model_world_size_%ld_rank_%ld.pt)", ws.value,
				 rank.value);
		return CKFS_RANK_NAME_RESPELT;
	}
	return CKFS_RANK_NAME_OK;
}

/* ---- rank discovery ---- */

/* A rank file name found in SRC, with what it says. */
struct rank_name {
	char *name;
	long ws, rank;
	enum ckfs_rank_name kind;
};

struct rank_scan {
	long world_size;          /* chosen */
	struct rank_name *names;  /* every rank file name, sorted by name */
	size_t n_names;
	unsigned char *present;   /* present[r] for the chosen W */
};

static void rank_scan_release(struct rank_scan *rs)
{
	for (size_t i = 0; i < rs->n_names; i++)
		free(rs->names[i].name);
	free(rs->names);
	free(rs->present);
	memset(rs, 0, sizeof(*rs));
}

static enum ckfs_code read_fsdp_config(struct ckfs_model *m, long *ws,
				       struct ckfs_error *err)
{
	char path[4096], *text = NULL;
	size_t len;
	enum ckfs_code rc;

	snprintf(path, sizeof(path), "%s/fsdp_config.json", m->src_dir);
	rc = ckfs_model_read_meta(m, path, CKFS_MAX_JSON_BYTES, &text, &len, err);
	if (rc == CKFS_E_NOTFOUND) {
		ckfs_error_clear(err);
		*ws = 0;
		return CKFS_OK;
	}
	if (rc != CKFS_OK)
		return rc;
	cJSON *j;
	rc = ckfs_json_parse_object(path, text, len, &j, err);
	free(text);
	if (rc != CKFS_OK)
		return rc;
	cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "world_size");
	cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "FSDP_version");
	if (!w)
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': no world_size", path);
	else if (!cJSON_IsNumber(w))
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': world_size is not a number",
			       path);
	else if (w->valuedouble > CKFS_MAX_RANKS)
		rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': world_size %.17g is more "
			       "than the limit of %u ranks", path, w->valuedouble,
			       CKFS_MAX_RANKS);
	else if (w->valuedouble < 1 || w->valuedouble != (double)w->valueint)
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': world_size %.17g is not a "
			       "positive integer", path, w->valuedouble);
	if (rc != CKFS_OK) {
		cJSON_Delete(j);
		return rc;
	}
	*ws = w->valueint;
	if (cJSON_IsNumber(v))
		m->fsdp_version = v->valueint;
	cJSON_Delete(j);
	return CKFS_OK;
}

static int cmp_rank_name(const void *a, const void *b)
{
	return strcmp(((const struct rank_name *)a)->name, ((const struct rank_name *)b)->name);
}

/* By (world size, rank, name): two files of one rank end up side by side. */
static int cmp_rank_value(const void *a, const void *b)
{
	const struct rank_name *x = a, *y = b;
	if (x->ws != y->ws)
		return x->ws < y->ws ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* Every rank file name of SRC into rs->names, sorted by name. */
static enum ckfs_code list_rank_names(struct ckfs_model *m, struct rank_scan *rs,
				      struct ckfs_error *err)
{
	const size_t max_names = 4 * (size_t)CKFS_MAX_RANKS;
	size_t cap = 0;
	struct dirent *de;
	enum ckfs_code rc = CKFS_OK;
	DIR *d = opendir(m->src_dir);

	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot open folder", m->src_dir);
	while (rc == CKFS_OK && (de = readdir(d))) {
		struct ckfs_rank_file rf;
		enum ckfs_rank_name kind = ckfs_fsdp_rank_file_name(de->d_name, &rf);
		if (kind == CKFS_RANK_NAME_NONE)
			continue;
		if (rs->n_names == max_names) {
			rc = ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than %zu rank files",
				       m->src_dir, max_names);
			break;
		}
		if (rs->n_names == cap) {
			size_t c = cap ? cap * 2 : 16;
			struct rank_name *p = realloc(rs->names, c * sizeof(*p));
			if (!p) {
				rc = ckfs_nomem(err);
				break;
			}
			rs->names = p;
			cap = c;
		}
		struct rank_name *rn = &rs->names[rs->n_names];
		*rn = (struct rank_name){ strdup(de->d_name), rf.ws, rf.rank, kind };
		if (!rn->name)
			rc = ckfs_nomem(err);
		else
			rs->n_names++;
	}
	closedir(d);
	if (rc == CKFS_OK && rs->n_names)
		qsort(rs->names, rs->n_names, sizeof(*rs->names), cmp_rank_name);
	return rc;
}

/* Every name spelt as verl spells it, and one file per (world size,
 * rank): a badly spelt name is refused, two files of one rank (rank_0
 * and rank_00, world_size_1 and world_size_01) are refused naming both,
 * whatever the world size. */
static enum ckfs_code check_rank_names(struct ckfs_model *m, struct rank_scan *rs,
				       struct ckfs_error *err)
{
	struct ckfs_rank_file rf;

	for (size_t i = 0; i < rs->n_names; i++)
		if (rs->names[i].kind == CKFS_RANK_NAME_BAD) {
			ckfs_fsdp_rank_file_name(rs->names[i].name, &rf);
			return ckfs_fail(err, rf.over_limit ? CKFS_E_LIMIT : CKFS_E_INVALID,
					 "'%s/%s': %s", m->src_dir, rs->names[i].name, rf.why);
		}
	struct rank_name *by_value = malloc(rs->n_names * sizeof(*by_value));
	if (!by_value)
		return ckfs_nomem(err);
	memcpy(by_value, rs->names, rs->n_names * sizeof(*by_value));
	qsort(by_value, rs->n_names, sizeof(*by_value), cmp_rank_value);
	enum ckfs_code rc = CKFS_OK;
	for (size_t i = 1; rc == CKFS_OK && i < rs->n_names; i++)
		if (by_value[i].ws == by_value[i - 1].ws && by_value[i].rank == by_value[i - 1].rank)
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' and '%s' are both rank "
				       "%ld of world size %ld", m->src_dir, by_value[i - 1].name,
				       by_value[i].name, by_value[i].rank, by_value[i].ws);
	free(by_value);
	for (size_t i = 0; rc == CKFS_OK && i < rs->n_names; i++)
		if (rs->names[i].kind == CKFS_RANK_NAME_RESPELT) {
			ckfs_fsdp_rank_file_name(rs->names[i].name, &rf);
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s/%s': %s", m->src_dir,
				       rs->names[i].name, rf.why);
		}
	return rc;
}

/* The world size to serve: fsdp_config.json's, else the only one the
 * names show (with a warning, as verl's legacy merger infers it). */
static enum ckfs_code choose_world_size(struct ckfs_model *m, struct rank_scan *rs,
					long cfg_ws, struct ckfs_error *err)
{
	long first = rs->names[0].ws, lo = first, hi = first;
	int in_names = 0;

	for (size_t i = 0; i < rs->n_names; i++) {
		long ws = rs->names[i].ws;
		in_names |= ws == cfg_ws;
		lo = ws < lo ? ws : lo;
		hi = ws > hi ? ws : hi;
	}
	if (cfg_ws && !in_names)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s/fsdp_config.json': world_size %ld disagrees "
				 "with the rank files (model_world_size_%ld_rank_*.pt)",
				 m->src_dir, cfg_ws, first);
	if (!cfg_ws && lo != hi)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s': rank files of several world sizes (%ld and %ld) "
				 "and no fsdp_config.json to choose", m->src_dir, hi, lo);
	rs->world_size = cfg_ws ? cfg_ws : first;
	if (!cfg_ws)
		CKFS_TRY(ckfs_model_warn(m, err, "fsdp_config.json not found; world size %ld "
					 "taken from file names", rs->world_size));
	if (lo != hi)
		CKFS_TRY(ckfs_model_warn(m, err, "ignoring rank files whose world size is "
					 "not %ld", rs->world_size));
	return CKFS_OK;
}

static enum ckfs_code scan_ranks(struct ckfs_model *m, struct rank_scan *rs,
				 struct ckfs_error *err)
{
	long cfg_ws = 0;

	memset(rs, 0, sizeof(*rs));
	CKFS_TRY(read_fsdp_config(m, &cfg_ws, err));
	CKFS_TRY(list_rank_names(m, rs, err));
	if (rs->n_names == 0) /* detection saw one: removed since */
		return ckfs_fail(err, CKFS_E_CHANGED, "'%s': its model_world_size_*_rank_*.pt "
				 "files are gone", m->src_dir);
	CKFS_TRY(check_rank_names(m, rs, err));
	CKFS_TRY(choose_world_size(m, rs, cfg_ws, err));
	rs->present = calloc((size_t)rs->world_size, 1);
	if (!rs->present)
		return ckfs_nomem(err);
	for (size_t i = 0; i < rs->n_names; i++) {
		const struct rank_name *rn = &rs->names[i];
		if (rn->ws != rs->world_size)
			continue;
		if (rn->rank >= rn->ws)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s/%s': rank %ld out of range "
					 "for world size %ld", m->src_dir, rn->name, rn->rank,
					 rn->ws);
		rs->present[rn->rank] = 1;
	}
	m->world_size = (int)rs->world_size;
	for (long r = 0; r < rs->world_size; r++)
		if (!rs->present[r])
			return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/model_world_size_%ld_rank_%ld.pt': "
					 "not found (rank %ld is needed)", m->src_dir,
					 rs->world_size, r, r);
	return CKFS_OK;
}

/* ---- sources ---- */

static enum ckfs_code open_source(struct ckfs_model *m, long rank,
				  uint32_t *index, struct ckfs_error *err)
{
	char name[128];

	snprintf(name, sizeof(name), "model_world_size_%d_rank_%ld.pt",
		 m->world_size, rank);
	const char *path = ckfs_arena_printf(&m->arena, "%s/%s", m->src_dir, name);
	const char *rel = ckfs_arena_strdup(&m->arena, name);
	if (!path || !rel)
		return ckfs_nomem(err);
	enum ckfs_code rc = ckfs_source_open(&m->sources[m->n_sources], &m->policy, path,
					     rel, err);
	if (rc == CKFS_E_NOTFOUND) {
		ckfs_error_clear(err);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found (rank %ld is needed)",
				 path, rank);
	}
	if (rc == CKFS_OK)
		*index = (uint32_t)m->n_sources++;
	return rc;
}

/* ---- per-tensor accumulation ---- */

struct acc {
	const struct ckfs_sd_entry *first; /* from the first rank read */
	int first_rank;
	int n_ranks_seen;
	enum ckfs_dtype dtype;             /* first rank holding data */
	struct ckfs_chunk_list chunks;
	struct ckfs_chunk_list copies;     /* other ranks' copies of a plain tensor */
};

static int same_shape(int n1, const int64_t *s1, int n2, const int64_t *s2)
{
	return n1 == n2 && memcmp(s1, s2, sizeof(int64_t) * (size_t)n1) == 0;
}

static const char *placements_text(const struct ckfs_dtensor_info *di, char *buf,
				   size_t size)
{
	size_t k = 0;
	buf[0] = '\0';
	for (int i = 0; i < di->mesh_ndim && k < size; i++) {
		char one[64];
		ckfs_placement_format(&di->placements[i], one, sizeof(one));
		k += (size_t)snprintf(buf + k, size - k, "%s%s", i ? ", " : "", one);
	}
	return buf;
}

/* Check one rank's entry against the first rank's, then add its chunks
 * (or, for a plain tensor after the first rank, its copy). */
static enum ckfs_code add_entry(struct acc *a, const struct ckfs_sd_entry *e,
				int rank, const int64_t *coord, uint32_t source,
				struct ckfs_error *err)
{
	const struct ckfs_sd_entry *f = a->first;

	if (e->kind != f->kind)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "tensor '%s': ranks %d and %d store it differently",
				 e->key, a->first_rank, rank);
	if (e->local.dtype != CKFS_DTYPE_INVALID) {
		if (a->dtype == CKFS_DTYPE_INVALID)
			a->dtype = e->local.dtype;
		if (e->local.dtype != a->dtype)
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': dtype %s on rank %d but %s on "
					 "rank %d", e->key,
					 ckfs_dtype_torch_name(a->dtype), a->first_rank,
					 ckfs_dtype_torch_name(e->local.dtype), rank);
	}
	a->n_ranks_seen++;

	if (e->kind == CKFS_ENTRY_TENSOR) {
		if (!same_shape(e->local.ndim, e->local.shape, f->local.ndim,
				f->local.shape))
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': plain tensor has different "
					 "shapes on ranks %d and %d", e->key,
					 a->first_rank, rank);
		if (e != f) /* a copy: the first rank's is served, ckfs verify compares */
			return ckfs_entry_chunks(e, coord, source, rank, &a->copies, err);
	} else if (e->kind == CKFS_ENTRY_SHARDED) {
		if (!same_shape(e->sharded->ndim, e->sharded->global_shape,
				f->sharded->ndim, f->sharded->global_shape))
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': global shapes differ on ranks "
					 "%d and %d", e->key, a->first_rank, rank);
	} else {
		const struct ckfs_dtensor_info *di = e->dtensor, *fi = f->dtensor;
		char x[160], y[160];
		if (!same_shape(di->ndim, di->global_shape, fi->ndim, fi->global_shape))
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': global shape %s on rank %d but %s "
					 "on rank %d", e->key,
					 ckfs_format_dims(fi->ndim, fi->global_shape, "[", "]", x, sizeof(x)),
					 a->first_rank,
					 ckfs_format_dims(di->ndim, di->global_shape, "[", "]", y, sizeof(y)),
					 rank);
		if (!same_shape(di->mesh_ndim, di->mesh_shape, fi->mesh_ndim,
				fi->mesh_shape))
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': device mesh %s on rank %d but %s "
					 "on rank %d", e->key,
					 ckfs_format_dims(fi->mesh_ndim, fi->mesh_shape, "(", ")", x, sizeof(x)),
					 a->first_rank,
					 ckfs_format_dims(di->mesh_ndim, di->mesh_shape, "(", ")", y, sizeof(y)),
					 rank);
		if (memcmp(di->placements, fi->placements,
			   sizeof(di->placements[0]) * (size_t)di->mesh_ndim) != 0)
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': placements (%s) on rank %d but (%s) "
					 "on rank %d", e->key,
					 placements_text(fi, x, sizeof(x)), a->first_rank,
					 placements_text(di, y, sizeof(y)), rank);
		if (di->have_coord &&
		    memcmp(di->coord, coord, sizeof(int64_t) * (size_t)di->mesh_ndim) != 0)
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': the file is for mesh coordinate %s "
					 "but rank %d is at %s in the device mesh", e->key,
					 ckfs_format_dims(di->mesh_ndim, di->coord, "(", ")", x, sizeof(x)),
					 rank,
					 ckfs_format_dims(di->mesh_ndim, coord, "(", ")", y, sizeof(y)));
	}
	return ckfs_entry_chunks(e, coord, source, rank, &a->chunks, err);
}

/* ---- mesh ---- */

/* Global rank at each mesh position (row-major), read from the mesh
 * tensor when the file has one, else the identity. */
static enum ckfs_code mesh_ranks(struct ckfs_model *m,
				 const struct ckfs_dtensor_info *di, int fd,
				 const char *label, long *ranks, size_t n,
				 struct ckfs_error *err)
{
	const struct ckfs_tensor_view *v = &di->mesh_tensor;

	if (!di->have_mesh_tensor) {
		for (size_t i = 0; i < n; i++)
			ranks[i] = (long)i;
		return ckfs_model_warn(m, err, "device mesh has no rank tensor; "
				   "assuming ranks in row-major order");
	}
	size_t es = ckfs_dtype_size(v->dtype);
	if (v->dtype != CKFS_DTYPE_I64 && v->dtype != CKFS_DTYPE_I32)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': device mesh tensor is "
				 "not an integer tensor", label);
	int64_t idx[CKFS_MAX_DIMS] = { 0 };
	for (size_t i = 0; i < n; i++) {
		uint64_t el = (uint64_t)v->storage_offset;
		for (int k = 0; k < v->ndim; k++)
			el += (uint64_t)idx[k] * (uint64_t)v->stride[k];
		unsigned char b[8] = { 0 };
		if (pread(fd, b, es, (off_t)(v->storage_pos + el * es)) != (ssize_t)es)
			return ckfs_fail(err, CKFS_E_TRUNCATED,
					 "'%s': cannot read the device mesh", label);
		int64_t r;
		if (es == 8) {
			memcpy(&r, b, 8);
		} else {
			int32_t r32;
			memcpy(&r32, b, 4);
			r = r32;
		}
		if (r < 0 || r >= m->world_size)
			return ckfs_fail(err, CKFS_E_INVALID,
					 "'%s': device mesh names rank %lld outside "
					 "world size %d", label, (long long)r,
					 m->world_size);
		ranks[i] = (long)r;
		for (int k = v->ndim - 1; k >= 0; k--) {
			if (++idx[k] < v->shape[k])
				break;
			idx[k] = 0;
		}
	}
	return CKFS_OK;
}

/* Every position of the device mesh (row-major): its global rank, from
 * the mesh tensor of rank 0's file, and its coordinate. Also records the
 * mesh in m for inspect. */
static enum ckfs_code mesh_positions(struct ckfs_model *m, const struct ckfs_dtensor_info *mesh,
				     uint32_t src0, long *ranks, int64_t (*coords)[CKFS_MAX_DIMS],
				     struct ckfs_error *err)
{
	size_t n = 1;

	for (int i = 0; i < mesh->mesh_ndim; i++)
		n *= (size_t)mesh->mesh_shape[i];
	if (n != (size_t)m->world_size)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': device mesh has %zu ranks but the "
				 "world size is %d", m->sources[src0].path, n, m->world_size);
	CKFS_TRY(mesh_ranks(m, mesh, m->sources[src0].fd, m->sources[src0].path, ranks, n,
			    err));
	int64_t idx[CKFS_MAX_DIMS] = { 0 };
	for (size_t p = 0; p < n; p++) {
		memcpy(coords[p], idx, sizeof(idx));
		for (int i = mesh->mesh_ndim - 1; i >= 0; i--) {
			if (++idx[i] < mesh->mesh_shape[i])
				break;
			idx[i] = 0;
		}
	}
	m->mesh_ndim = mesh->mesh_ndim;
	memcpy(m->mesh_shape, mesh->mesh_shape, sizeof(m->mesh_shape));
	for (int i = 0; i < mesh->mesh_ndim; i++) {
		if (!mesh->mesh_dim_names[i])
			continue;
		m->mesh_dim_names[i] = ckfs_arena_strdup(&m->arena, mesh->mesh_dim_names[i]);
		if (!m->mesh_dim_names[i])
			return ckfs_nomem(err);
	}
	return CKFS_OK;
}

/* ---- assembly ---- */

static int cmp_key(const void *a, const void *b, void *ctx)
{
	const struct ckfs_torch_file *tf = ctx;
	return strcmp(tf->entries[*(const size_t *)a].key,
		      tf->entries[*(const size_t *)b].key);
}

static const char *describe_placement(struct ckfs_model *m,
				      const struct ckfs_sd_entry *e)
{
	char buf[256] = "", one[64];

	if (e->kind == CKFS_ENTRY_TENSOR)
		return "replicated";
	if (e->kind == CKFS_ENTRY_SHARDED)
		return "ShardedTensor";
	for (int i = 0; i < e->dtensor->mesh_ndim; i++) {
		ckfs_placement_format(&e->dtensor->placements[i], one, sizeof(one));
		if (i)
			strncat(buf, ",", sizeof(buf) - strlen(buf) - 1);
		strncat(buf, one, sizeof(buf) - strlen(buf) - 1);
	}
	return ckfs_arena_strdup(&m->arena, buf);
}

enum ckfs_code ckfs_fsdp_build(struct ckfs_model *m, const struct ckfs_model_options *opt,
			       struct ckfs_error *err)
{
	struct rank_scan rs;
	struct ckfs_torch_file first;
	struct acc *accs = NULL;
	size_t *order = NULL, n_keys = 0;
	const char **keys = NULL, **names = NULL;
	long *ranks = NULL;
	int64_t (*coords)[CKFS_MAX_DIMS] = NULL;
	size_t n_read = 0;
	enum ckfs_code rc;
	uint32_t src0;

	memset(&first, 0, sizeof(first));
	rc = scan_ranks(m, &rs, err);
	if (rc == CKFS_OK)
		rc = ckfs_model_load_config(m, opt->config_path, err);
	if (rc != CKFS_OK)
		goto out;
	m->sources = ckfs_arena_calloc(&m->arena, (size_t)m->world_size,
				       sizeof(*m->sources));
	if (!m->sources) {
		rc = ckfs_nomem(err);
		goto out;
	}
	/* Every rank file is opened, and every one is read below: the
	 * merged tensors need some, the others hold copies (plain tensors,
	 * HSDP replicas) that must agree, and a checkpoint missing one is
	 * incomplete whatever verl would have read. */
	for (long r = 0; r < m->world_size; r++) {
		uint32_t src;
		if ((rc = open_source(m, r, &src, err)) != CKFS_OK)
			goto out;
	}
	src0 = 0;
	if ((rc = ckfs_torch_open(&first, m->sources[src0].fd,
				  m->sources[src0].path, err)) != CKFS_OK)
		goto out;
	n_keys = first.n_entries;
	if (n_keys == 0) {
		rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': the state dict is empty",
			       m->sources[src0].path);
		goto out;
	}

	/* Hugging Face names of rank 0's keys (wrappers removed); the other
	 * ranks' keys are matched as stored. */
	keys = calloc(n_keys, sizeof(*keys));
	names = calloc(n_keys, sizeof(*names));
	if (!keys || !names) {
		rc = ckfs_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < n_keys; i++)
		keys[i] = first.entries[i].key;
	if ((rc = ckfs_hf_names(m, m->sources[src0].path, keys, names, n_keys, true, err)) != CKFS_OK)
		goto out;

	/* The mesh, from the first DTensor. */
	const struct ckfs_dtensor_info *mesh = NULL;
	for (size_t i = 0; i < n_keys && !mesh; i++)
		if (first.entries[i].kind == CKFS_ENTRY_DTENSOR)
			mesh = first.entries[i].dtensor;
	n_read = (size_t)m->world_size;
	ranks = calloc(n_read, sizeof(*ranks));
	coords = calloc(n_read, sizeof(*coords));
	if (!ranks || !coords) {
		rc = ckfs_nomem(err);
		goto out;
	}
	if (mesh) {
		if ((rc = mesh_positions(m, mesh, src0, ranks, coords, err)) != CKFS_OK)
			goto out;
	} else {
		for (size_t i = 0; i < n_read; i++)
			ranks[i] = (long)i;
	}
	m->ranks_read = ckfs_arena_calloc(&m->arena, n_read, sizeof(int));
	if (!m->ranks_read) {
		rc = ckfs_nomem(err);
		goto out;
	}
	m->n_ranks_read = n_read;

	/* Keys of rank 0, sorted for lookups from the other ranks. */
	accs = calloc(n_keys, sizeof(*accs));
	order = calloc(n_keys, sizeof(*order));
	if (!accs || !order) {
		rc = ckfs_nomem(err);
		goto out;
	}
	for (size_t i = 0; i < n_keys; i++)
		order[i] = i;
	qsort_r(order, n_keys, sizeof(*order), cmp_key, &first);
	for (size_t i = 1; i < n_keys; i++)
		if (strcmp(first.entries[order[i]].key, first.entries[order[i - 1]].key) == 0) {
			rc = ckfs_fail(err, CKFS_E_FORMAT, "'%s': duplicate key '%s'",
				       m->sources[src0].path,
				       first.entries[order[i]].key);
			goto out;
		}

	for (size_t r = 0; r < n_read; r++) {
		struct ckfs_torch_file other, *tf = &first;
		uint32_t src = (uint32_t)ranks[r]; /* sources are opened in rank order */
		m->ranks_read[r] = (int)ranks[r];
		if (ranks[r] != 0) {
			rc = ckfs_torch_open(&other, m->sources[src].fd,
					     m->sources[src].path, err);
			if (rc != CKFS_OK)
				goto out;
			tf = &other;
		}
		for (size_t i = 0; i < tf->n_entries && rc == CKFS_OK; i++) {
			const struct ckfs_sd_entry *e = &tf->entries[i];
			size_t lo = 0, hi = n_keys, k = SIZE_MAX;
			while (lo < hi) {
				size_t mid = (lo + hi) / 2;
				int c = strcmp(first.entries[order[mid]].key, e->key);
				if (c == 0) {
					k = order[mid];
					break;
				}
				if (c < 0)
					lo = mid + 1;
				else
					hi = mid;
			}
			if (k == SIZE_MAX) {
				rc = ckfs_fail(err, CKFS_E_INVALID,
					       "'%s': tensor '%s' is not in rank 0's "
					       "state dict", m->sources[src].path, e->key);
				break;
			}
			if (!accs[k].first) {
				accs[k].first = e;
				accs[k].first_rank = (int)ranks[r];
			}
			if (accs[k].n_ranks_seen != (int)r) {
				rc = ckfs_fail(err, CKFS_E_FORMAT,
					       "'%s': duplicate key '%s'",
					       m->sources[src].path, e->key);
				break;
			}
			rc = add_entry(&accs[k], e, (int)ranks[r], coords[r], src, err);
			if (rc != CKFS_OK)
				ckfs_error_prefix(err, "'%s'", m->sources[src].path);
			if (rc == CKFS_OK && accs[k].first == e) {
				/* Keep the first entry's metadata past close. */
				struct ckfs_sd_entry *copy =
					ckfs_arena_alloc(&m->arena, sizeof(*copy));
				struct ckfs_dtensor_info *dcopy = NULL;
				struct ckfs_sharded_info *scopy = NULL;
				if (copy)
					*copy = *e;
				if (copy && e->dtensor &&
				    (dcopy = ckfs_arena_alloc(&m->arena, sizeof(*dcopy))))
					*dcopy = *e->dtensor;
				if (copy && e->sharded &&
				    (scopy = ckfs_arena_alloc(&m->arena, sizeof(*scopy))))
					*scopy = *e->sharded;
				if (copy)
					copy->key = ckfs_arena_strdup(&m->arena, e->key);
				if (!copy || !copy->key || (e->dtensor && !dcopy) ||
				    (e->sharded && !scopy)) {
					rc = ckfs_nomem(err);
					break;
				}
				copy->dtensor = dcopy;
				copy->sharded = scopy;
				for (int d = 0; d < CKFS_MAX_DIMS && dcopy; d++)
					dcopy->mesh_dim_names[d] = NULL;
				accs[k].first = copy;
			}
		}
		/* Keys of rank 0 this rank lacks (extra ones failed above). */
		for (size_t k = 0; rc == CKFS_OK && k < n_keys; k++)
			if (accs[k].n_ranks_seen != (int)r + 1)
				rc = ckfs_fail(err, CKFS_E_INVALID,
					       "'%s': tensor '%s' of rank 0's state dict "
					       "is missing", m->sources[src].path,
					       first.entries[k].key);
		if (tf != &first)
			ckfs_torch_close(&other);
		if (rc != CKFS_OK)
			goto out;
	}

	/* Output tensors in rank 0's order. */
	m->tensors = ckfs_arena_calloc(&m->arena, n_keys, sizeof(*m->tensors));
	if (!m->tensors) {
		rc = ckfs_nomem(err);
		goto out;
	}
	int drop_lm_head = 0;
	if (m->tie_word_embeddings) {
		int has_embed = 0, has_head = 0;
		for (size_t i = 0; i < n_keys; i++) {
			has_embed |= strcmp(names[i], "model.embed_tokens.weight") == 0;
			has_head |= strcmp(names[i], "lm_head.weight") == 0;
		}
		drop_lm_head = has_embed && has_head;
	}
	for (size_t i = 0; i < n_keys; i++) {
		const struct ckfs_sd_entry *e = accs[i].first;
		struct ckfs_tensor *t = &m->tensors[m->n_tensors];
		if (drop_lm_head && strcmp(names[i], "lm_head.weight") == 0)
			continue;
		/* e->key is the arena copy of keys[i], which dies with rank 0's file */
		t->name = names[i] == keys[i] ? e->key : names[i];
		t->stored_dtype = accs[i].dtype;
		t->out_dtype = opt->out_dtype == CKFS_DTYPE_INVALID ? t->stored_dtype
								    : opt->out_dtype;
		if (e->kind == CKFS_ENTRY_DTENSOR) {
			t->ndim = e->dtensor->ndim;
			memcpy(t->shape, e->dtensor->global_shape, sizeof(t->shape));
		} else if (e->kind == CKFS_ENTRY_SHARDED) {
			t->ndim = e->sharded->ndim;
			memcpy(t->shape, e->sharded->global_shape, sizeof(t->shape));
		} else {
			t->ndim = e->local.ndim;
			memcpy(t->shape, e->local.shape, sizeof(t->shape));
		}
		t->numel = 1;
		for (int k = 0; k < t->ndim; k++)
			if (__builtin_mul_overflow(t->numel, (uint64_t)t->shape[k], &t->numel)) {
				rc = ckfs_fail(err, CKFS_E_FORMAT,
					       "tensor '%s': shape overflows", t->name);
				goto out;
			}
		if (t->stored_dtype == CKFS_DTYPE_INVALID && t->numel) {
			rc = ckfs_fail(err, CKFS_E_FORMAT, "tensor '%s': no dtype (no "
				       "rank holds data)", t->name);
			goto out;
		}
		t->placement = describe_placement(m, e);
		t->n_chunks = (uint32_t)accs[i].chunks.n;
		t->chunks = ckfs_arena_calloc(&m->arena, accs[i].chunks.n + 1,
					      sizeof(*t->chunks));
		if (!t->chunks || !t->placement) {
			rc = ckfs_nomem(err);
			goto out;
		}
		if (accs[i].chunks.n)
			memcpy(t->chunks, accs[i].chunks.v,
			       accs[i].chunks.n * sizeof(*t->chunks));
		if (accs[i].copies.n) {
			t->n_copies = (uint32_t)accs[i].copies.n;
			t->copies = ckfs_arena_calloc(&m->arena, accs[i].copies.n,
						      sizeof(*t->copies));
			if (!t->copies) {
				rc = ckfs_nomem(err);
				goto out;
			}
			memcpy(t->copies, accs[i].copies.v,
			       accs[i].copies.n * sizeof(*t->copies));
		}
		if ((rc = ckfs_plan_validate_tensor(m, t, err)) != CKFS_OK) {
			ckfs_error_prefix(err, "'%s'", m->src_dir);
			goto out;
		}
		m->n_tensors++;
	}
	if (drop_lm_head)
		rc = ckfs_model_warn(m, err, "lm_head.weight dropped: tied to "
				 "model.embed_tokens.weight (tie_word_embeddings)");
out:
	if (accs)
		for (size_t i = 0; i < n_keys; i++) {
			free(accs[i].chunks.v);
			free(accs[i].copies.v);
		}
	free(accs);
	free(order);
	free(keys);
	free(names);
	free(ranks);
	free(coords);
	rank_scan_release(&rs);
	ckfs_torch_close(&first);
	return rc;
}
