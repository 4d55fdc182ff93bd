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
 * dim (HSDP's "ddp") contributes none. FSDP2 actors take the fast path
 * (fsdp_plan.c): the plan from rank 0 alone, the other ranks checked
 * after. A plain tensor is served from rank 0, as verl does since it
 * stopped concatenating them; the other ranks' copies must have its shape
 * and dtype and are kept for ckfs verify, which compares their values as
 * verl's merger does. The finished plan is validated by plan.c.
 *
 * Naming follows verl's merger: keys as stored, less torch wrapper names
 * (names.c), then what its save_pretrained writes for names held in
 * memory: LoRA apart, the tie rule, vision-language and expert forms
 * (hf_save.c, peft.c; applied by open.c, as the row's flag asks).
 */
#include "ckfs/model.h"
#include "ckfs/strbuf.h"
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
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <unistd.h>

#include "ckfs/log.h"
#include "layouts/fsdp_int.h"

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

/* A rank file's name, well spelt or not: this reader refuses the badly
 * spelt ones rather than leave them to another layout. */
static bool is_rank_file_name(const char *name)
{
	struct ckfs_rank_file rf;
	return ckfs_fsdp_rank_file_name(name, &rf) != CKFS_RANK_NAME_NONE;
}

static int fsdp_detect(const char *dir, const struct ckfs_file_policy *pol)
{
	(void)pol;
	return ckfs_dir_has(dir, is_rank_file_name);
}

/* What only this layout knows of a model, for its describe. */
struct fsdp_info {
	int version;                    /* fsdp_config.json's FSDP_version; 0: none */
	int mesh_ndim;                  /* rank 0's device mesh; 0: none */
	int64_t mesh_shape[CKFS_MAX_DIMS];
	const char *mesh_dim_names[CKFS_MAX_DIMS];
};

static struct fsdp_info *info_of(const struct ckfs_model *m)
{
	return m->layout_info;
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
		info_of(m)->version = v->valueint;
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
	const char *de_name;
	bool de_dir;
	enum ckfs_code rc = CKFS_OK;
	struct ckfs_dir *d = ckfs_opendir(m->src_dir);

	if (!d)
		return ckfs_fail_errno(err, "'%s': cannot open folder", m->src_dir);
	while (rc == CKFS_OK && (de_name = ckfs_readdir(d, &de_dir))) {
		struct ckfs_rank_file rf;
		enum ckfs_rank_name kind = ckfs_fsdp_rank_file_name(de_name, &rf);
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
		*rn = (struct rank_name){ strdup(de_name), rf.ws, rf.rank, kind };
		if (!rn->name)
			rc = ckfs_nomem(err);
		else
			rs->n_names++;
	}
	ckfs_closedir(d);
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

/* CKFS_OK when rank_b's dims (nb, b) are rank_a's (na, a); else a failure
 * naming both, as what, each within the two characters of brackets. */
static enum ckfs_code same_dims(const char *key, const char *what, const char *brackets, int na,
				const int64_t *a, int rank_a, int nb, const int64_t *b, int rank_b,
				struct ckfs_error *err)
{
	const char open[2] = { brackets[0], 0 }, close[2] = { brackets[1], 0 };
	char x[160], y[160];

	if (same_shape(na, a, nb, b))
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_INVALID, "tensor '%s': %s %s on rank %d but %s on rank %d",
			 key, what, ckfs_format_dims(na, a, open, close, x, sizeof(x)), rank_a,
			 ckfs_format_dims(nb, b, open, close, y, sizeof(y)), rank_b);
}

/* The expectation set by entry f of rank `rank` (pointers into f). */
struct expect fsdp_expect_of(const struct ckfs_sd_entry *f, int rank)
{
	struct expect x = { .kind = f->kind, .dtype = f->local.dtype, .rank = rank };

	if (f->kind == CKFS_ENTRY_DTENSOR) {
		x.ndim = f->dtensor->ndim;
		x.shape = f->dtensor->global_shape;
		x.di = f->dtensor;
	} else if (f->kind == CKFS_ENTRY_SHARDED) {
		x.ndim = f->sharded->ndim;
		x.shape = f->sharded->global_shape;
	} else {
		x.ndim = f->local.ndim;
		x.shape = f->local.shape;
	}
	return x;
}

/* Check one rank's entry against the expectation of its key: kind,
 * dtype, shapes, device mesh, placements and the mesh coordinate. */
enum ckfs_code fsdp_check_entry(const struct expect *f, const struct ckfs_sd_entry *e, int rank,
				const int64_t *coord, struct ckfs_error *err)
{
	if (e->kind != f->kind)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "tensor '%s': ranks %d and %d store it differently",
				 e->key, f->rank, rank);
	if (e->local.dtype != CKFS_DTYPE_INVALID && e->local.dtype != f->dtype)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "tensor '%s': dtype %s on rank %d but %s on "
				 "rank %d", e->key,
				 ckfs_dtype_torch_name(f->dtype), f->rank,
				 ckfs_dtype_torch_name(e->local.dtype), rank);
	if (e->kind == CKFS_ENTRY_TENSOR) {
		if (!same_shape(e->local.ndim, e->local.shape, f->ndim, f->shape))
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': plain tensor has different "
					 "shapes on ranks %d and %d", e->key,
					 f->rank, rank);
	} else if (e->kind == CKFS_ENTRY_SHARDED) {
		if (!same_shape(e->sharded->ndim, e->sharded->global_shape, f->ndim, f->shape))
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': global shapes differ on ranks "
					 "%d and %d", e->key, f->rank, rank);
	} else {
		const struct ckfs_dtensor_info *di = e->dtensor, *fi = f->di;
		char x[160], y[160];
		CKFS_TRY(same_dims(e->key, "global shape", "[]", f->ndim, f->shape, f->rank,
				   di->ndim, di->global_shape, rank, err));
		CKFS_TRY(same_dims(e->key, "device mesh", "()", fi->mesh_ndim, fi->mesh_shape,
				   f->rank, di->mesh_ndim, di->mesh_shape, rank, err));
		if (memcmp(di->placements, fi->placements,
			   sizeof(di->placements[0]) * (size_t)di->mesh_ndim) != 0)
			return ckfs_fail(err, CKFS_E_INVALID,
					 "tensor '%s': placements (%s) on rank %d but (%s) "
					 "on rank %d", e->key,
					 placements_text(fi, x, sizeof(x)), f->rank,
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
	return CKFS_OK;
}

/* Check one rank's entry against the first rank's, then add its chunks
 * (or, for a plain tensor after the first rank, its copy). */
static enum ckfs_code add_entry(struct acc *a, const struct ckfs_sd_entry *e,
				int rank, const int64_t *coord, uint32_t source,
				struct ckfs_error *err)
{
	if (a->x.dtype == CKFS_DTYPE_INVALID)
		a->x.dtype = e->local.dtype;
	CKFS_TRY(fsdp_check_entry(&a->x, e, rank, coord, err));
	a->n_ranks_seen++;
	if (e->kind == CKFS_ENTRY_TENSOR && e != a->first)
		/* a copy: the first rank's is served, ckfs verify compares */
		return ckfs_entry_chunks(e, coord, source, rank, &a->copies, err);
	return ckfs_entry_chunks(e, coord, source, rank, &a->chunks, err);
}

/* ---- mesh ---- */

/* Global rank at each mesh position (row-major), read from the mesh
 * tensor when the file has one, else the identity. */
static enum ckfs_code mesh_ranks(struct ckfs_model *m,
				 const struct ckfs_dtensor_info *di, struct ckfs_file f,
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
	const struct ckfs_zip_entry *ze = v->storage_entry;
	if (ze && ze->derived)
		CKFS_TRY(ckfs_zip_check_local_at(f, label, ze->name, ze->header_offset,
						 ze->data_offset, ze->method, err));
	int64_t idx[CKFS_MAX_DIMS] = { 0 };
	for (size_t i = 0; i < n; i++) {
		uint64_t el = (uint64_t)v->storage_offset;
		for (int k = 0; k < v->ndim; k++)
			el += (uint64_t)idx[k] * (uint64_t)v->stride[k];
		unsigned char b[8] = { 0 };
		if (ckfs_file_pread(f, b, es, v->storage_pos + el * es) != (ssize_t)es)
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
	CKFS_TRY(mesh_ranks(m, mesh, m->sources[src0].f, m->sources[src0].path, ranks, n,
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
	struct fsdp_info *info = info_of(m);
	info->mesh_ndim = mesh->mesh_ndim;
	memcpy(info->mesh_shape, mesh->mesh_shape, sizeof(info->mesh_shape));
	for (int i = 0; i < mesh->mesh_ndim; i++) {
		if (!mesh->mesh_dim_names[i])
			continue;
		info->mesh_dim_names[i] = ckfs_arena_strdup(&m->arena, mesh->mesh_dim_names[i]);
		if (!info->mesh_dim_names[i])
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

/* Every rank file opened, and rank 0's read. Every one is read later:
 * the merged tensors need some, the others hold copies (plain tensors,
 * HSDP replicas) that must agree, and a checkpoint missing one is
 * incomplete whatever verl would have read. */
static enum ckfs_code open_ranks(struct build *b, struct rank_scan *rs, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;

	CKFS_TRY(scan_ranks(m, rs, err));
	CKFS_TRY(ckfs_model_load_config(m, b->opt->config_path, err));
	m->sources = ckfs_arena_calloc(&m->arena, (size_t)m->world_size, sizeof(*m->sources));
	if (!m->sources)
		return ckfs_nomem(err);
	for (long r = 0; r < m->world_size; r++) {
		uint32_t src;
		CKFS_TRY(open_source(m, r, &src, err));
	}
	/* Rank 0's storages are read through guards (torch_guards.c); the
	 * other ranks' too on the fast path (fsdp_plan.c). */
	/* a template for the other ranks' files (fsdp_plan.c) */
	const struct ckfs_torch_open_opts o = { .label = m->sources[0].path,
						.derive_locals = true, .as_template = true };
	CKFS_TRY(ckfs_torch_open(&b->first, m->sources[0].f, &o, err));
	CKFS_TRY(ckfs_torch_guards(&m->sources[0], &b->first, err));
	char when[64];
	if (ckfs_torch_writer(&b->first, when, sizeof(when)) &&
	    !(m->written_by = ckfs_arena_strdup(&m->arena, when)))
		return ckfs_nomem(err);
	b->n_keys = b->first.n_entries;
	if (b->n_keys == 0)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': the state dict is empty",
				 m->sources[0].path);
	return CKFS_OK;
}

/* Hugging Face names of rank 0's keys (wrappers removed), and the keys
 * sorted for the other ranks' lookups (as stored). */
static enum ckfs_code index_keys(struct build *b, struct ckfs_error *err)
{
	const char *path = b->m->sources[0].path;

	b->keys = calloc(b->n_keys, sizeof(*b->keys));
	b->names = calloc(b->n_keys, sizeof(*b->names));
	b->accs = calloc(b->n_keys, sizeof(*b->accs));
	b->order = calloc(b->n_keys, sizeof(*b->order));
	if (!b->keys || !b->names || !b->accs || !b->order)
		return ckfs_nomem(err);
	for (size_t i = 0; i < b->n_keys; i++) {
		b->keys[i] = b->first.entries[i].key;
		b->order[i] = i;
	}
	CKFS_TRY(ckfs_hf_names(b->m, path, b->keys, b->names, b->n_keys, true, err));
	qsort_r(b->order, b->n_keys, sizeof(*b->order), cmp_key, &b->first);
	for (size_t i = 1; i < b->n_keys; i++)
		if (strcmp(b->keys[b->order[i]], b->keys[b->order[i - 1]]) == 0)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': duplicate key '%s'", path,
					 b->keys[b->order[i]]);
	return CKFS_OK;
}

/* The global rank and mesh coordinate of every position, from the mesh
 * of rank 0's first DTensor (none: every rank at its own position). */
static enum ckfs_code place_ranks(struct build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	const struct ckfs_dtensor_info *mesh = NULL;
	size_t n = (size_t)m->world_size;

	for (size_t i = 0; i < b->n_keys && !mesh; i++)
		if (b->first.entries[i].kind == CKFS_ENTRY_DTENSOR)
			mesh = b->first.entries[i].dtensor;
	b->ranks = calloc(n, sizeof(*b->ranks));
	b->coords = calloc(n, sizeof(*b->coords));
	m->ranks_read = ckfs_arena_calloc(&m->arena, n, sizeof(int));
	if (!b->ranks || !b->coords || !m->ranks_read)
		return ckfs_nomem(err);
	if (mesh)
		CKFS_TRY(mesh_positions(m, mesh, 0, b->ranks, b->coords, err));
	else
		for (size_t i = 0; i < n; i++)
			b->ranks[i] = (long)i;
	m->n_ranks_read = n;
	return CKFS_OK;
}

/* Index of rank 0's key equal to key, or SIZE_MAX. */
size_t fsdp_find_key(const char **keys, const size_t *order, size_t n, const char *key)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(keys[order[mid]], key);
		if (c == 0)
			return order[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return SIZE_MAX;
}

/* A copy of e's metadata in m's arena: it outlives the rank's file. */
static const struct ckfs_sd_entry *keep_entry(struct ckfs_model *m,
					      const struct ckfs_sd_entry *e)
{
	struct ckfs_sd_entry *copy = ckfs_arena_alloc(&m->arena, sizeof(*copy));

	if (!copy)
		return NULL;
	*copy = *e;
	copy->key = ckfs_arena_strdup(&m->arena, e->key);
	if (e->dtensor) {
		struct ckfs_dtensor_info *d = ckfs_arena_alloc(&m->arena, sizeof(*d));
		if (!d)
			return NULL;
		*d = *e->dtensor;
		for (int k = 0; k < CKFS_MAX_DIMS; k++)
			d->mesh_dim_names[k] = NULL;
		copy->dtensor = d;
	}
	if (e->sharded) {
		struct ckfs_sharded_info *sh = ckfs_arena_alloc(&m->arena, sizeof(*sh));
		if (!sh)
			return NULL;
		*sh = *e->sharded;
		copy->sharded = sh;
	}
	return copy->key ? copy : NULL;
}

/* The entries of tf, the file of mesh position p, each checked against
 * rank 0's and added to its key's chunks (or copies). */
static enum ckfs_code add_rank(struct build *b, size_t p, const struct ckfs_torch_file *tf,
			       struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	uint32_t src = (uint32_t)b->ranks[p]; /* sources are opened in rank order */
	const char *path = m->sources[src].path;

	for (size_t i = 0; i < tf->n_entries; i++) {
		const struct ckfs_sd_entry *e = &tf->entries[i];
		size_t k = fsdp_find_key(b->keys, b->order, b->n_keys, e->key);
		if (k == SIZE_MAX)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': tensor '%s' is not in rank "
					 "0's state dict", path, e->key);
		struct acc *a = &b->accs[k];
		if (a->n_ranks_seen != (int)p)
			return ckfs_fail(err, CKFS_E_FORMAT, "'%s': duplicate key '%s'", path,
					 e->key);
		if (!a->first) {
			a->first = e;
			a->x = fsdp_expect_of(e, (int)b->ranks[p]);
		}
		if (add_entry(a, e, (int)b->ranks[p], b->coords[p], src, err) != CKFS_OK) {
			ckfs_error_prefix(err, "'%s'", path);
			return err->code;
		}
		if (a->first == e) {
			enum ckfs_dtype dt = a->x.dtype;
			if (!(a->first = keep_entry(m, e)))
				return ckfs_nomem(err);
			a->x = fsdp_expect_of(a->first, a->x.rank);
			a->x.dtype = dt;
		}
	}
	/* Keys of rank 0 this rank lacks (extra ones failed above). */
	for (size_t k = 0; k < b->n_keys; k++)
		if (b->accs[k].n_ranks_seen != (int)p + 1)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': tensor '%s' of rank 0's "
					 "state dict is missing", path, b->keys[k]);
	return CKFS_OK;
}

static enum ckfs_code read_ranks(struct build *b, struct ckfs_error *err)
{
	for (size_t p = 0; p < b->m->n_ranks_read; p++) {
		const struct ckfs_source *s = &b->m->sources[b->ranks[p]];
		struct ckfs_torch_file other;
		b->m->ranks_read[p] = (int)b->ranks[p];
		if (b->ranks[p] == 0) {
			CKFS_TRY(add_rank(b, p, &b->first, err));
			continue;
		}
		const struct ckfs_torch_open_opts o = { .label = s->path };
		CKFS_TRY(ckfs_torch_open(&other, s->f, &o, err));
		enum ckfs_code rc = add_rank(b, p, &other, err);
		ckfs_torch_close(&other);
		CKFS_TRY(rc);
	}
	return CKFS_OK;
}

/* Copy a chunk list into m's arena (n + 1 entries, never NULL). */
static struct ckfs_chunk *arena_chunks(struct ckfs_model *m, const struct ckfs_chunk_list *l,
				       int ndim)
{
	return ckfs_model_chunks(m, l->v, l->n, ndim);
}

/* Output tensor t from key i's accumulated chunks. */
static enum ckfs_code make_tensor(struct build *b, size_t i, struct ckfs_tensor *t,
				  struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;
	const struct acc *a = &b->accs[i];
	const struct ckfs_sd_entry *e = a->first;

	/* e->key (or a->key) is the arena copy of keys[i], which dies with
	 * rank 0's file */
	const char *key = a->key ? a->key : e->key;
	t->name = b->names[i] == b->keys[i] ? key : b->names[i];
	const int64_t *shape = e->kind == CKFS_ENTRY_DTENSOR  ? e->dtensor->global_shape
			       : e->kind == CKFS_ENTRY_SHARDED ? e->sharded->global_shape
							       : e->local.shape;
	int ndim = e->kind == CKFS_ENTRY_DTENSOR  ? e->dtensor->ndim
		   : e->kind == CKFS_ENTRY_SHARDED ? e->sharded->ndim
						   : e->local.ndim;
	if (!ckfs_tensor_set(t, a->x.dtype, ndim, shape))
		return ckfs_fail(err, CKFS_E_FORMAT, "tensor '%s': shape overflows", t->name);
	if (t->stored_dtype == CKFS_DTYPE_INVALID && t->numel)
		return ckfs_fail(err, CKFS_E_FORMAT, "tensor '%s': no dtype (no rank holds "
				 "data)", t->name);
	t->placement = describe_placement(m, e);
	if (a->packed) {
		t->n_chunks = a->n_packed;
		t->chunks = a->packed;
		t->n_copies = a->n_packed_copies;
		t->copies = a->n_packed_copies ? a->packed_copies : NULL;
	} else {
		t->n_chunks = (uint32_t)a->chunks.n;
		t->chunks = arena_chunks(m, &a->chunks, t->ndim);
		t->n_copies = (uint32_t)a->copies.n;
		t->copies = a->copies.n ? arena_chunks(m, &a->copies, t->ndim) : NULL;
		if (!t->chunks || (a->copies.n && !t->copies))
			return ckfs_nomem(err);
	}
	if (!t->placement)
		return ckfs_nomem(err);
	if (ckfs_plan_validate_tensor(m, t, err) != CKFS_OK) {
		ckfs_error_prefix(err, "'%s'", m->src_dir);
		return err->code;
	}
	return CKFS_OK;
}

/* Output tensors in rank 0's order, named as verl's merger saves them. */
static enum ckfs_code make_tensors(struct build *b, struct ckfs_error *err)
{
	struct ckfs_model *m = b->m;

	m->tensors = ckfs_arena_calloc(&m->arena, b->n_keys, sizeof(*m->tensors));
	if (!m->tensors)
		return ckfs_nomem(err);
	for (size_t i = 0; i < b->n_keys; i++, m->n_tensors++)
		CKFS_TRY(make_tensor(b, i, &m->tensors[i], err));
	return CKFS_OK;
}

static enum ckfs_code fsdp_build(struct ckfs_model *m, const struct ckfs_model_options *opt,
				 struct ckfs_error *err)
{
	struct build b = { .m = m, .opt = opt };
	struct rank_scan rs = { 0 };
	enum ckfs_code rc;

	struct rank_plan *rp = NULL;

	if (!(m->layout_info = ckfs_arena_calloc(&m->arena, 1, sizeof(struct fsdp_info))))
		return ckfs_nomem(err);
	if ((rc = open_ranks(&b, &rs, err)) == CKFS_OK && (rc = index_keys(&b, err)) == CKFS_OK &&
	    (rc = place_ranks(&b, err)) == CKFS_OK) {
		bool defer = false;
		rc = fsdp_plan_open(&b, &rp, &defer, err);
		if (rc == CKFS_OK && !rp) /* not the fast path */
			rc = read_ranks(&b, err);
		if (rc == CKFS_OK)
			rc = make_tensors(&b, err);
		if (rc == CKFS_OK && defer) {
			rc = fsdp_plan_defer_checks(rp, m, err);
			rp = NULL; /* the checks own it (or freed it) */
		}
	}
	fsdp_rank_plan_free(rp);
	for (size_t i = 0; b.accs && i < b.n_keys; i++) {
		free(b.accs[i].chunks.v);
		free(b.accs[i].copies.v);
	}
	free(b.accs);
	free(b.order);
	free(b.keys);
	free(b.names);
	free(b.ranks);
	free(b.coords);
	rank_scan_release(&rs);
	ckfs_torch_close(&b.first);
#ifdef __GLIBC__
	malloc_trim(0); /* rank 0's parse (tens of MB for a large actor) */
#endif
	return rc;
}

/* "layout  verl-fsdp (FSDP2), world size 4" and the mesh. */
static enum ckfs_code fsdp_describe(const struct ckfs_model *m, struct ckfs_facts *f,
				    struct ckfs_error *err)
{
	const struct fsdp_info *info = info_of(m);
	struct ckfs_strbuf line = { 0 }, mesh = { 0 };
	char dims[256];

	if (info->version)
		ckfs_strbuf_fmt(&line, "%s (FSDP%d), world size %d", m->layout->name,
				info->version, m->world_size);
	else
		ckfs_strbuf_fmt(&line, "%s (FSDP version unknown), world size %d",
				m->layout->name, m->world_size);
	CKFS_TRY(ckfs_facts_add(f, "layout", &line, NULL, NULL, err));
	if (info->version)
		CKFS_TRY(ckfs_facts_add(f, NULL, NULL, "fsdp_version",
					cJSON_CreateNumber(info->version), err));
	if (info->mesh_ndim) {
		ckfs_format_dims(info->mesh_ndim, info->mesh_shape, "(", ")", dims, sizeof(dims));
		ckfs_strbuf_fmt(&mesh, "%s dims (", dims);
		for (int i = 0; i < info->mesh_ndim; i++)
			ckfs_strbuf_fmt(&mesh, "%s%s", i ? ", " : "",
					info->mesh_dim_names[i] ? info->mesh_dim_names[i] : "?");
		ckfs_strbuf_str(&mesh, ")");
	} else {
		ckfs_strbuf_str(&mesh, "none (plain tensors or ShardedTensor)");
	}
	return ckfs_facts_add(f, "mesh", &mesh, "mesh",
			      ckfs_facts_mesh_json(info->mesh_ndim, info->mesh_shape,
						   info->mesh_dim_names),
			      err);
}

const struct ckfs_layout ckfs_layout_fsdp = {
	.name = "verl-fsdp",
	.what = "a verl FSDP checkpoint",
	.looks_for = "model_world_size_*_rank_*.pt files",
	.detect = fsdp_detect,
	.build = fsdp_build,
	.describe = fsdp_describe,
	.flags = CKFS_LAYOUT_HELD_NAMES | CKFS_LAYOUT_RANK_ZIPS,
};
