/* SPDX-License-Identifier: MIT */
/*
 * Legacy Megatron-Core per-rank checkpoints as verl wrote them from 2025-04
 * to 2025-06 (verl-checkpoints.md 3.1(b), formats.md "Megatron per-rank"):
 *
 *   SRC/model/mp_rank_{tp:02d}/model.pt                 (PP = 1, EP = 1)
 *   SRC/model/mp_rank_{tp:02d}_{pp:03d}/model.pt        (PP > 1, EP = 1)
 *   SRC/model/mp_rank_{tp:02d}_{ep:03d}/model.pt        (PP = 1, EP > 1)
 *   SRC/model/mp_rank_{tp:02d}_{pp:03d}_{ep:03d}/model.pt
 *   SRC/hf_config_and_tokenizer/ or SRC/huggingface/   config.json
 *
 * Megatron appends "_{ep:03d}" when EP > 1, so a two-number name is TP_PP
 * or TP_EP. It is TP_EP when config.json has experts and the first folder
 * whose second number is not 0 holds the word embedding (only PP stage 0
 * does; every EP rank does). The numbers are the TP, PP and EP ranks of
 * the process that saved the folder (verl: data-parallel rank 0).
 *
 * Each model.pt is a torch.save of a Python LIST with one GPTModel state
 * dict per virtual-pipeline chunk, TP-local shards, local layer numbers.
 * Dense GPT models (Llama, Qwen2 with qkv bias, Qwen3 with q/k norm), MoE
 * (Qwen2-MoE with shared expert, Qwen3-MoE, Mixtral, DeepSeek-V3 and
 * GLM-4.5 with shared experts and MTP layers), MLA, value heads.
 *
 * Layer numbering: chunks are visited (vpp outer, pp inner); each chunk's
 * layers get the next global indices, counted from the layers it actually
 * holds, so uneven first/last stages and VPP work.
 *
 * TP merge, as a plan of chunks (nothing is copied):
 *   linear_qkv.{weight,bias}   per rank nkv/TP query groups [q r·d; k d; v d]
 *                              -> q_proj / k_proj / v_proj row chunks
 *   linear_fc1.weight          per rank [gate; up] -> gate_proj / up_proj
 *                              (dense, shared expert and every expert)
 *   linear_proj, linear_fc2    row-parallel: column chunks (dim 1)
 *   MLA up projections,        column-parallel: row chunks (dim 0); MLA's
 *   eh_proj, MLA down proj.    down projections whole when TE duplicated them
 *   embedding, output_layer    vocab-parallel: row chunks (dim 0)
 *   norms, router, biases,     replicated: TP rank 0's copy
 *   shared-expert gate
 * Experts: SequentialMLP "mlp.experts.local_experts.{i}.linear_fc{1,2}.weight"
 * or TEGroupedMLP "mlp.experts.linear_fc{1,2}.weight{i}"; local expert i of
 * EP rank e is global expert e·(E/EP) + i, E/EP the local experts of every
 * rank file. Expert tensor parallelism (ETP) comes from the expert fc1 rows
 * against config.json's expert width F:
 *   2·F/TP (ETP = TP, megatron-core's default): experts sharded over TP like
 *     a dense MLP; every (TP, PP, EP) folder is needed, and the dense part
 *     is read from EP rank 0.
 *   2·F (ETP = 1): each folder (t, p, e) holds TP rank t's dense shards and
 *     EP rank e's experts whole; megatron-core puts TP rank t and EP rank e
 *     on one process only when t = e mod gcd(TP, EP), so the folders are no
 *     TP x EP grid (verl, TP2 EP2: mp_rank_00_000 and mp_rank_01_001). Each
 *     TP rank's dense part comes from its lowest-EP folder, each EP rank's
 *     experts from its lowest-TP folder; every TP rank and every EP rank of
 *     every stage must be in some folder, and a folder pairing t and e
 *     otherwise is refused (the shapes would then be a config.json whose
 *     width is off by TP, not ETP = 1).
 * Other expert shard widths, and rank files whose expert shapes differ,
 * are refused.
 * Value heads: an output_layer.weight of one row while vocab_size > 1 is a
 * critic's head (replicated, not vocab-parallel): served as score.weight,
 * config.json's architectures rewritten to *ForTokenClassification with one
 * label.
 * Keys ending in _extra_state (Transformer Engine) are skipped; any other
 * key this table does not know is an error listing them, or, with
 * --raw-names, served per rank under its own name (raw_key). output_layer is
 * dropped (with a warning) when config.json ties the embeddings.
 * The layers found must add up to config.json's num_hidden_layers (a
 * missing last PP stage is not silently served short), with no gaps in a
 * chunk's local numbers; every MoE layer must yield all E experts, and the
 * local experts of a rank file give EP (E / local), so EP ranks whose
 * folders are all missing are named.
 * Refused: fewer KV heads than TP ranks (Megatron-Core itself requires
 * num_query_groups % TP == 0), MLA without q_lora_rank, vocab-parallel
 * rows that do not add up to config.json's vocab_size (padded vocabularies).
 */
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

#include "ckfs/json.h"
#include "ckfs/limits.h"
#include "ckfs/strbuf.h"
#include "layouts/layouts.h"

#define MAX_PAR 1024

/* ---- folder names ---- */

/* "mp_rank_DD[_DDD[_DDD]]": the number of fields (1 to 3) into v[], 0 when
 * the name is not one. */
static int parse_rank_dir(const char *name, long v[3])
{
	static const char pfx[] = "mp_rank_";
	const char *s = name + sizeof(pfx) - 1;
	char *end;
	int n = 0;

	if (strncmp(name, pfx, sizeof(pfx) - 1) != 0)
		return 0;
	while (n < 3 && isdigit((unsigned char)*s)) {
		errno = 0;
		v[n++] = strtol(s, &end, 10);
		if (errno || v[n - 1] < 0)
			return 0;
		if (*end == 0)
			return n;
		if (*end != '_')
			return 0;
		s = end + 1;
	}
	return 0;
}

static bool is_rank_dir(const char *name)
{
	long v[3];
	return parse_rank_dir(name, v) > 0;
}

/* SRC/model holds an mp_rank_* folder; a model/ that cannot be listed is
 * not this layout's, unless for want of memory (then nothing can tell). */
static int megatron_detect(const char *dir, const struct ckfs_file_policy *pol)
{
	char path[4096];

	(void)pol;
	if ((size_t)snprintf(path, sizeof(path), "%s/model", dir) >= sizeof(path))
		return 0;
	int found = ckfs_dir_has(path, is_rank_dir);
	return found < 0 && errno != ENOMEM ? 0 : found;
}

/* ---- output tensors under construction ---- */

/* A rank folder of the [ep][pp][tp] grid the names span. */
enum { R_ABSENT, R_PRESENT, R_OPEN };

/* What only this layout knows of a model, for its describe. */
struct megatron_info {
	int tp, pp, vpp, ep;
	int etp;                       /* expert tensor parallel (1 or TP); 0:
					* no expert weights */
	int *stage_layers;             /* decoder layers of each (vpp, pp)
					* chunk in global order: [v * pp + p] */
};

struct ctx {
	struct ckfs_model *m;
	struct megatron_info *info;    /* m->layout_info */
	const struct ckfs_model_options *opt;
	struct ckfs_torch_file *files; /* [ep][pp][tp], open where state R_OPEN */
	unsigned char *state;          /* [ep][pp][tp]: R_* */
	int *src;                      /* [ep][pp][tp]: index in m->sources */
	int *dense_e;                  /* [pp][tp]: EP rank the dense part is read from */
	int *expert_t;                 /* [pp][ep]: TP rank whole experts are read from */
	int tp, pp, vpp, ep;
	int n;                         /* tp * pp * ep: the [ep][pp][tp] grid */
	int etp;                       /* expert tensor parallel size: 1 or TP */
	int fields;                    /* numbers in the folder names: 1 to 3 */
	long (*names)[3];              /* the numbers of each rank folder */
	size_t n_names;
	struct ckfs_megatron_arch a;   /* config.json */
	int value_head;                /* output_layer is [1, H] */
	int *experts_seen;             /* per global layer: expert fc1 served */
	long n_mtp;                    /* MTP layers seen: 1 + the highest index */
	struct key_at { int p; size_t i; int set; }
		embed, mtp_embed, head;    /* the embedding (first stage), the last
					* stage's copy of it MTP keeps, the
					* output layer: for the MTP layers' own */
	size_t n_raw;
	struct ckfs_outs outs;
	struct ckfs_megatron_unknown unknown;
};

static struct ckfs_out *new_out(struct ctx *c, const char *name, const char *placement,
				int ndim, const int64_t *shape, struct ckfs_error *err)
{
	/* The dtype comes with the first slice (add_slice). */
	struct ckfs_out_spec s = { .name = name, .placement = placement,
				   .dtype = CKFS_DTYPE_INVALID, .ndim = ndim, .shape = shape };
	return ckfs_outs_add(c->m, &c->outs, &s, err);
}

/* Rank files are numbered (e·PP + p)·TP + t; e < 0 names the folder TP
 * rank t's dense part of stage p is read from (EP rank 0 when the experts
 * are split over TP, its lowest-EP folder when they are whole). */
static int rank_of_e(const struct ctx *c, int e, int t, int p)
{
	if (e < 0)
		e = c->dense_e ? c->dense_e[p * c->tp + t] : 0;
	return (e * c->pp + p) * c->tp + t;
}

static const struct ckfs_sd_entry *entry_at_e(struct ctx *c, int e, int t, int p, size_t i)
{
	return &c->files[rank_of_e(c, e, t, p)].entries[i];
}

static const struct ckfs_sd_entry *entry_at(struct ctx *c, int t, int p, size_t i)
{
	return entry_at_e(c, -1, t, p, i);
}

/* Rank file r's index in m->sources (only open folders are sources). */
static uint32_t src_at(const struct ctx *c, int r)
{
	return (uint32_t)c->src[r];
}

static uint32_t src_of(struct ctx *c, int t, int p)
{
	return src_at(c, rank_of_e(c, -1, t, p));
}

static int rank_of(struct ctx *c, int t, int p)
{
	return rank_of_e(c, -1, t, p);
}

static const char *path_of(struct ctx *c, int r)
{
	return c->m->sources[src_at(c, r)].path;
}

/* Rows [lo, lo + n) along dim of entry e of rank file r, placed at global
 * offset goff (goff[dim] is the first row's global index). */
struct slice {
	const struct ckfs_sd_entry *e;
	int r;
	int dim;
	int64_t lo, n;
	const int64_t *goff;
};

static enum ckfs_code add_slice(struct ctx *c, struct ckfs_out *o, const struct slice *s,
				struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e = s->e;
	struct ckfs_sd_entry copy = *e;
	int64_t coord[CKFS_MAX_DIMS] = { 0 };
	uint32_t src = src_at(c, s->r);
	int dim = s->dim;

	if (e->kind != CKFS_ENTRY_TENSOR)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is not a plain "
				 "tensor", c->m->sources[src].path, e->key);
	if (o->dtype == CKFS_DTYPE_INVALID)
		o->dtype = e->local.dtype;
	else if (o->dtype != e->local.dtype)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is %s, other ranks "
				 "hold %s", c->m->sources[src].path, e->key,
				 ckfs_dtype_st_name(e->local.dtype), ckfs_dtype_st_name(o->dtype));
	if (s->lo < 0 || s->n < 0 || s->lo + s->n > e->local.shape[dim])
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is too small "
				 "(%lld rows on dim %d)", c->m->sources[src].path,
				 e->key, (long long)e->local.shape[dim], dim);
	copy.local.storage_offset += s->lo * e->local.stride[dim];
	copy.local.shape[dim] = s->n;
	size_t before = o->chunks.n;
	CKFS_TRY(ckfs_entry_chunks(&copy, coord, src, s->r, &o->chunks, err));
	for (size_t i = before; i < o->chunks.n; i++)
		for (int k = 0; k < o->ndim; k++)
			o->chunks.v[i].offset[k] += s->goff[k];
	return CKFS_OK;
}

/* Rank file r's copy of entry i, whole (replicated tensors: TP rank 0 of
 * the dense folder). */
static enum ckfs_code whole_of(struct ctx *c, const char *name, int r, size_t i,
			       const char *placement, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *x = &c->files[r].entries[i];
	int64_t goff[CKFS_MAX_DIMS] = { 0 };
	struct ckfs_out *o = new_out(c, name, placement, x->local.ndim, x->local.shape, err);

	if (!o)
		return err->code;
	if (x->local.ndim < 1)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' is a scalar",
				 path_of(c, r), x->key);
	struct slice s = { .e = x, .r = r, .dim = 0, .n = x->local.shape[0], .goff = goff };
	return add_slice(c, o, &s, err);
}

static enum ckfs_code replicated(struct ctx *c, const char *name, int p, size_t i,
				 struct ckfs_error *err)
{
	return whole_of(c, name, rank_of(c, 0, p), i, "Replicate()", err);
}

/* The rank files one tensor is split over: TP ranks t0 .. t0 + nt - 1 of
 * EP rank e (e < 0: the dense folders). */
struct span {
	int e, t0, nt;
};

static struct span dense_span(const struct ctx *c)
{
	return (struct span){ -1, 0, c->tp };
}

/* EP rank e's experts: over every TP rank of its folders (split over TP,
 * or TP = 1), or whole in one folder (plan_whole chose it). */
static struct span expert_span(const struct ctx *c, int e, int p)
{
	if (!c->expert_t)
		return (struct span){ e, 0, c->tp };
	return (struct span){ e, c->expert_t[p * c->ep + e], 1 };
}

/* Concatenation over the span's TP ranks along dim. */
static enum ckfs_code concat_e(struct ctx *c, const char *name, struct span s, int p,
			       size_t i, int dim, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e0 = entry_at_e(c, s.e, s.t0, p, i);
	int64_t shape[CKFS_MAX_DIMS];
	int64_t goff[CKFS_MAX_DIMS] = { 0 };

	if (e0->local.ndim <= dim)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' has %d dims",
				 path_of(c, rank_of_e(c, s.e, s.t0, p)), e0->key,
				 e0->local.ndim);
	memcpy(shape, e0->local.shape, sizeof(shape));
	shape[dim] = 0;
	for (int t = s.t0; t < s.t0 + s.nt; t++)
		shape[dim] += entry_at_e(c, s.e, t, p, i)->local.shape[dim];
	struct ckfs_out *o = new_out(c, name, dim == 0 ? "Shard(0)" : "Shard(1)",
				e0->local.ndim, shape, err);
	if (!o)
		return err->code;
	for (int t = s.t0; t < s.t0 + s.nt; t++) {
		const struct ckfs_sd_entry *x = entry_at_e(c, s.e, t, p, i);
		struct slice sl = { .e = x, .r = rank_of_e(c, s.e, t, p), .dim = dim,
				    .n = x->local.shape[dim], .goff = goff };
		CKFS_TRY(add_slice(c, o, &sl, err));
		goff[dim] += x->local.shape[dim];
	}
	return CKFS_OK;
}

static enum ckfs_code concat(struct ctx *c, const char *name, int p, size_t i, int dim,
			     struct ckfs_error *err)
{
	return concat_e(c, name, dense_span(c), p, i, dim, err);
}

/* Vocab-parallel rows: their sum must be config.json's vocab_size (verl
 * does not pad). */
static enum ckfs_code vocab_rows(struct ctx *c, const char *name, int p, size_t i,
				 struct ckfs_error *err)
{
	int64_t rows = 0;

	for (int t = 0; t < c->tp; t++)
		rows += entry_at(c, t, p, i)->local.shape[0];
	if (c->a.vocab > 0 && rows != c->a.vocab)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' has %lld rows over "
				 "%d TP rank%s, config.json says vocab_size %lld (a missing "
				 "TP rank? padded vocabularies are not supported)",
				 c->m->sources[src_of(c, 0, p)].path,
				 entry_at(c, 0, p, i)->key, (long long)rows, c->tp,
				 c->tp == 1 ? "" : "s", (long long)c->a.vocab);
	return concat(c, name, p, i, 0, err);
}

/* A fused fc1 weight over the span's TP ranks -> gate / up: per TP rank
 * [gate; up] (new_out may move c->outs: the two outputs are addressed by
 * index). */
static enum ckfs_code split_fc1(struct ctx *c, const char *gate_name, const char *up_name,
				struct span s, int p, size_t i, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e0 = entry_at_e(c, s.e, s.t0, p, i);
	int64_t shape[CKFS_MAX_DIMS];
	const char *names[2] = { gate_name, up_name };

	if (e0->local.ndim < 1 || e0->local.shape[0] % 2)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' has an odd number of "
				 "rows (not [gate; up])",
				 path_of(c, rank_of_e(c, s.e, s.t0, p)), e0->key);
	int64_t half = e0->local.shape[0] / 2;
	memcpy(shape, e0->local.shape, sizeof(shape));
	shape[0] = half * s.nt;
	for (int h = 0; h < 2; h++)
		if (!new_out(c, names[h], "Shard(0) of fc1", e0->local.ndim, shape, err))
			return err->code;
	for (int h = 0; h < 2; h++)
		for (int t = s.t0; t < s.t0 + s.nt; t++) {
			int64_t goff[CKFS_MAX_DIMS] = { 0 };
			struct slice sl = { .e = entry_at_e(c, s.e, t, p, i),
					    .r = rank_of_e(c, s.e, t, p), .dim = 0,
					    .lo = h * half, .n = half, .goff = goff };
			goff[0] = (t - s.t0) * half;
			CKFS_TRY(add_slice(c, &c->outs.v[c->outs.n - 2 + h], &sl, err));
		}
	return CKFS_OK;
}

/* linear_qkv.{weight,bias} -> q_proj / k_proj / v_proj. */
static enum ckfs_code split_qkv(struct ctx *c, long layer, const struct ckfs_megatron_key *k,
				int p, size_t i, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e0 = entry_at(c, 0, p, i);
	const char *path = c->m->sources[src_of(c, 0, p)].path;
	int64_t d = c->a.head_dim, r = c->a.nh / c->a.nkv, gp = c->a.nkv / c->tp;
	char name[CKFS_MAX_NAME];

	if (e0->local.ndim < 1 || e0->local.shape[0] != gp * (r + 2) * d)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s': '%s' has %lld rows, expected %lld (%lld query "
				 "groups of %lld q heads + k + v, head_dim %lld, TP %d: "
				 "a missing TP rank or a different config.json?)",
				 path, e0->key, (long long)e0->local.shape[0],
				 (long long)(gp * (r + 2) * d), (long long)gp,
				 (long long)r, (long long)d, c->tp);
	size_t first = c->outs.n;
	for (int h = 0; h < 3; h++) {
		int64_t shape[CKFS_MAX_DIMS];
		memcpy(shape, e0->local.shape, sizeof(shape));
		shape[0] = (h == 0 ? c->a.nh : c->a.nkv) * d;
		ckfs_megatron_name(&c->a, layer, k, h, name, sizeof(name));
		if (!new_out(c, name, "Shard(0) of qkv", e0->local.ndim, shape, err))
			return err->code;
	}
	for (int t = 0; t < c->tp; t++)
		for (int64_t gl = 0; gl < gp; gl++) {
			int64_t g = t * gp + gl, base = gl * (r + 2) * d;
			int64_t goff[CKFS_MAX_DIMS] = { 0 };
			struct slice s = { .e = entry_at(c, t, p, i), .r = rank_of(c, t, p),
					   .dim = 0, .goff = goff };
			goff[0] = g * r * d;
			s.lo = base;
			s.n = r * d;
			CKFS_TRY(add_slice(c, &c->outs.v[first], &s, err));
			goff[0] = g * d;
			s.lo = base + r * d;
			s.n = d;
			CKFS_TRY(add_slice(c, &c->outs.v[first + 1], &s, err));
			s.lo = base + (r + 1) * d;
			CKFS_TRY(add_slice(c, &c->outs.v[first + 2], &s, err));
		}
	return CKFS_OK;
}

/* "decoder.layers.<N>.<rest>": per-rank files number every layer. */
static int numbered_layer(const char *key, long *n, const char **rest)
{
	return ckfs_megatron_layer_key(key, n, rest) && *n >= 0;
}

/* Expert weights: SequentialMLP "mlp.experts.local_experts.<i>.linear_fcF.weight"
 * or TEGroupedMLP "mlp.experts.linear_fcF.weight<i>": *fc (1 or 2) and *i. */
static int expert_key(const char *rest, int *fc, long *i)
{
	static const char seq[] = "mlp.experts.local_experts.", grp[] = "mlp.experts.linear_fc";
	char *end;

	if (strncmp(rest, seq, sizeof(seq) - 1) == 0 &&
	    isdigit((unsigned char)rest[sizeof(seq) - 1])) {
		*i = strtol(rest + sizeof(seq) - 1, &end, 10);
		if (strcmp(end, ".linear_fc1.weight") == 0)
			*fc = 1;
		else if (strcmp(end, ".linear_fc2.weight") == 0)
			*fc = 2;
		else
			return 0;
		return *i >= 0 && *i < 1000000;
	}
	if (strncmp(rest, grp, sizeof(grp) - 1) != 0)
		return 0;
	rest += sizeof(grp) - 1;
	if ((rest[0] != '1' && rest[0] != '2') || strncmp(rest + 1, ".weight", 7) != 0 ||
	    !isdigit((unsigned char)rest[8]))
		return 0;
	*fc = rest[0] - '0';
	*i = strtol(rest + 8, &end, 10);
	return *end == 0 && *i >= 0 && *i < 1000000;
}

/* Expert fc1 [2·F/ETP, H] or fc2 [H, F/ETP] as the expert tensor parallel
 * size decided from the first rank file says (decide_etp). */
static enum ckfs_code check_expert_shape(struct ctx *c, const struct ckfs_sd_entry *x,
					 int fc, const char *path, struct ckfs_error *err)
{
	int dim = fc == 1 ? 0 : 1;
	int64_t want = (fc == 1 ? 2 * c->a.expert_ffn : c->a.expert_ffn) / c->etp;

	if (x->local.ndim == 2 && x->local.shape[dim] == want)
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' has %lld %s, expected %lld "
			 "(%s%lld%s, expert tensor parallel size %d as in the other "
			 "expert weights: mixed checkpoints?)", path, x->key,
			 x->local.ndim == 2 ? (long long)x->local.shape[dim] : -1LL,
			 fc == 1 ? "rows" : "columns", (long long)want,
			 fc == 1 ? "2 x " : "", (long long)c->a.expert_ffn,
			 c->etp > 1 ? " / TP" : "", c->etp);
}

/* Local expert i of every EP rank (key idx of stage p, its fc-th linear):
 * global expert e·(E/EP) + i. */
static enum ckfs_code map_expert(struct ctx *c, long gl, int fc, long i, int p, size_t idx,
				 struct ckfs_error *err)
{
	const char *key = entry_at(c, 0, p, idx)->key;
	const char *path = c->m->sources[src_of(c, 0, p)].path;
	char gate[CKFS_MAX_NAME], up[CKFS_MAX_NAME];

	if (c->a.n_experts <= 0)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is an expert weight but "
				 "config.json names no experts (num_experts, "
				 "num_local_experts or n_routed_experts)", path, key);
	int64_t local = c->a.n_experts / c->ep;
	if (i >= local)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is local expert %ld, but "
				 "%lld experts over EP=%d leave %lld per rank (a missing "
				 "EP rank?)", path, key, i, (long long)c->a.n_experts, c->ep,
				 (long long)local);
	if (c->a.expert_ffn > 0)
		CKFS_TRY(check_expert_shape(c, entry_at(c, 0, p, idx), fc, path, err));
	for (int e = 0; e < c->ep; e++) {
		int64_t g = e * local + i;
		struct span s = expert_span(c, e, p);
		if (fc == 2) {
			ckfs_megatron_expert_name(&c->a, gl, g, 2, gate, sizeof(gate));
			CKFS_TRY(concat_e(c, gate, s, p, idx, 1, err));
			continue;
		}
		ckfs_megatron_expert_name(&c->a, gl, g, 0, gate, sizeof(gate));
		ckfs_megatron_expert_name(&c->a, gl, g, 1, up, sizeof(up));
		CKFS_TRY(split_fc1(c, gate, up, s, p, idx, err));
	}
	if (fc == 1 && gl < c->a.n_layers + CKFS_MEGATRON_MAX_MTP) /* past it: refused later */
		c->experts_seen[gl] += c->ep;
	return CKFS_OK;
}

/* --raw-names: an unknown key served under its Megatron name with the
 * global layer number, one tensor per rank that holds it, each that rank's
 * own bytes: ".tp_rank_TT" is appended when TP > 1 and ".ep_rank_EEE" when
 * EP > 1 (nothing is merged, so nothing is guessed). */
static enum ckfs_code raw_key(struct ctx *c, const char *key, long gl, int p, size_t i,
			      struct ckfs_error *err)
{
	char base[CKFS_MAX_NAME], name[CKFS_MAX_NAME];
	const char *rest;
	long j;

	if (gl >= 0 && numbered_layer(key, &j, &rest))
		snprintf(base, sizeof(base), "decoder.layers.%ld.%s", gl, rest);
	else
		snprintf(base, sizeof(base), "%s", key);
	for (int e = 0; e < c->ep; e++)
		for (int t = 0; t < c->tp; t++) {
			if (c->state[rank_of_e(c, e, t, p)] != R_OPEN)
				continue; /* whole experts: not every (TP, EP) pair */
			int n = snprintf(name, sizeof(name), "%s", base);
			if (c->tp > 1)
				n += snprintf(name + n, sizeof(name) - (size_t)n, ".tp_rank_%02d", t);
			if (c->ep > 1)
				snprintf(name + n, sizeof(name) - (size_t)n, ".ep_rank_%03d", e);
			CKFS_TRY(whole_of(c, name, rank_of_e(c, e, t, p), i, "raw (one rank)",
					  err));
		}
	c->n_raw++;
	return CKFS_OK;
}

static enum ckfs_code unknown_key(struct ctx *c, const char *key, long gl, int p, size_t i,
				  struct ckfs_error *err)
{
	if (c->opt->raw_names)
		return raw_key(c, key, gl, p, i, err);
	ckfs_megatron_unknown(&c->unknown, key);
	return CKFS_OK;
}

/* A column-parallel key (split on dim 0 over TP), or, for MLA's down
 * projections, one TE keeps whole on every rank: whole when a rank's rows
 * are the global ones. The result must have the shape config.json gives. */
static enum ckfs_code columns(struct ctx *c, const struct ckfs_megatron_key *k, const char *name,
			      int p, size_t i, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e0 = entry_at(c, 0, p, i);
	int64_t want[2];
	int known = ckfs_megatron_global_shape(&c->a, k, want);

	if (k->part == MG_COL_OR_DUP && known && e0->local.ndim == 2 &&
	    e0->local.shape[0] == want[0] && c->tp > 1)
		CKFS_TRY(replicated(c, name, p, i, err));
	else
		CKFS_TRY(concat(c, name, p, i, 0, err));
	const struct ckfs_out *o = &c->outs.v[c->outs.n - 1];
	if (known && (o->ndim != 2 || o->shape[0] != want[0] || o->shape[1] != want[1]))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' makes %s [%lld, %lld] over "
				 "TP=%d, config.json '%s' gives [%lld, %lld]",
				 c->m->sources[src_of(c, 0, p)].path, e0->key, name,
				 (long long)o->shape[0], o->ndim > 1 ? (long long)o->shape[1] : 0LL,
				 c->tp, c->m->config_path, (long long)want[0], (long long)want[1]);
	return CKFS_OK;
}

/* One key of a layer: TP-merged by what the shared vocabulary says it is. */
static enum ckfs_code map_layer_key(struct ctx *c, const struct ckfs_megatron_key *k, long gl,
				    int p, size_t i, struct ckfs_error *err)
{
	char name[CKFS_MAX_NAME], up[CKFS_MAX_NAME];

	switch (k->part) {
	case MG_QKV:
		return split_qkv(c, gl, k, p, i, err);
	case MG_FC1:
	case MG_SHARED_FC1:
		ckfs_megatron_name(&c->a, gl, k, 0, name, sizeof(name));
		ckfs_megatron_name(&c->a, gl, k, 1, up, sizeof(up));
		return split_fc1(c, name, up, dense_span(c), p, i, err);
	case MG_ROW:
	case MG_SHARED_ROW: /* row-parallel: TP ranks hold column blocks */
		ckfs_megatron_name(&c->a, gl, k, 0, name, sizeof(name));
		return concat(c, name, p, i, 1, err);
	case MG_COL:
	case MG_COL_OR_DUP:
		ckfs_megatron_name(&c->a, gl, k, 0, name, sizeof(name));
		return columns(c, k, name, p, i, err);
	default:
		ckfs_megatron_name(&c->a, gl, k, 0, name, sizeof(name));
		return replicated(c, name, p, i, err);
	}
}

/* "mtp.layers.<i>.*" (DeepSeek and GLM only: their Hugging Face names):
 * served as layer num_hidden_layers + i. */
static enum ckfs_code map_mtp(struct ctx *c, const char *key, long j, const char *rest,
			      int inner, int p, size_t i, struct ckfs_error *err)
{
	const struct ckfs_megatron_key *k;
	long gl = c->a.n_layers + j, ei;
	int fc;

	if (j >= CKFS_MEGATRON_MAX_MTP)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s': more than %d MTP layers",
				 c->m->sources[src_of(c, 0, p)].path, key, CKFS_MEGATRON_MAX_MTP);
	if (j + 1 > c->n_mtp)
		c->n_mtp = j + 1;
	if (inner && expert_key(rest, &fc, &ei))
		return map_expert(c, gl, fc, ei, p, i, err);
	k = inner ? ckfs_megatron_layer_entry(&c->a, rest) : ckfs_megatron_mtp_entry(&c->a, rest);
	if (!k)
		return unknown_key(c, key, -1, p, i, err);
	return map_layer_key(c, k, gl, p, i, err);
}

/* Each MTP layer's embed_tokens and shared_head.head: the model's own
 * embedding (the last stage's copy when it holds one, as MTP reads it) and
 * output layer, the bytes served twice. */
static enum ckfs_code map_mtp_shared(struct ctx *c, struct ckfs_error *err)
{
	const struct key_at *emb = c->mtp_embed.set ? &c->mtp_embed : &c->embed;
	const struct key_at *head = c->head.set ? &c->head : emb; /* tied */
	char name[CKFS_MAX_NAME];

	if (c->mtp_embed.set && !c->n_mtp)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': embedding.word_embeddings.weight on "
				 "two pipeline stages but no MTP layers", c->m->src_dir);
	for (long j = 0; j < c->n_mtp && emb->set; j++) {
		long gl = c->a.n_layers + j;
		ckfs_megatron_name(&c->a, gl, &ckfs_megatron_mtp_embed, 0, name, sizeof(name));
		CKFS_TRY(vocab_rows(c, name, emb->p, emb->i, err));
		ckfs_megatron_name(&c->a, gl, &ckfs_megatron_mtp_head, 0, name, sizeof(name));
		CKFS_TRY(vocab_rows(c, name, head->p, head->i, err));
	}
	return CKFS_OK;
}

static enum ckfs_code map_key(struct ctx *c, int p, size_t i, long layer0,
			      int *dropped_head, struct ckfs_error *err)
{
	const char *key = entry_at(c, 0, p, i)->key;
	const char *top = ckfs_megatron_top_name(key);
	const struct ckfs_megatron_key *k;
	const char *rest;
	long j, ei;
	int fc, inner;

	if (top && strcmp(top, "model.embed_tokens.weight") == 0) {
		if (c->embed.set) { /* the MTP stage's copy */
			c->mtp_embed = (struct key_at){ p, i, 1 };
			return CKFS_OK;
		}
		c->embed = (struct key_at){ p, i, 1 };
		return vocab_rows(c, top, p, i, err);
	}
	if (top && strcmp(top, "lm_head.weight") == 0) {
		const struct ckfs_sd_entry *e0 = entry_at(c, 0, p, i);
		if (e0->local.ndim == 2 && e0->local.shape[0] == 1 && c->a.vocab > 1) {
			/* A critic's value head: replicated over TP (check_tp_alike
			 * made every rank's shape [1, H]). */
			c->value_head = 1;
			return replicated(c, "score.weight", p, i, err);
		}
		if (c->m->tie_word_embeddings) {
			*dropped_head = 1;
			return CKFS_OK;
		}
		c->head = (struct key_at){ p, i, 1 };
		return vocab_rows(c, top, p, i, err);
	}
	if (top) /* the final norm */
		return replicated(c, top, p, i, err);
	if (c->a.deepseek_moe && ckfs_megatron_mtp_key(key, &j, &rest, &inner))
		return map_mtp(c, key, j, rest, inner, p, i, err);
	if (!numbered_layer(key, &j, &rest))
		return unknown_key(c, key, -1, p, i, err);
	if (expert_key(rest, &fc, &ei))
		return map_expert(c, layer0 + j, fc, ei, p, i, err);
	if (!(k = ckfs_megatron_layer_entry(&c->a, rest)))
		return unknown_key(c, key, layer0 + j, p, i, err);
	return map_layer_key(c, k, layer0 + j, p, i, err);
}

/* ---- config ---- */

static enum ckfs_code check_tp_divides(struct ctx *c, struct ckfs_error *err)
{
	if (c->a.nkv % c->tp)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': num_key_value_heads "
				 "%lld is not a multiple of TP %d (Megatron-Core needs "
				 "num_query_groups %% TP == 0; replicated KV heads are "
				 "not supported)", c->m->src_dir,
				 (long long)c->a.nkv, c->tp);
	if (c->ep > 1 && (c->a.n_experts <= 0 || c->a.n_experts % c->ep))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': %lld experts in config.json "
				 "cannot be split over EP=%d rank folders", c->m->src_dir,
				 (long long)c->a.n_experts, c->ep);
	return CKFS_OK;
}

/* A critic's config names the causal LM: serve the token-classification
 * class with one label (transformers' AutoModelForTokenClassification,
 * as verl's FSDP critics save). */
static enum ckfs_code value_config(struct ctx *c, struct ckfs_error *err)
{
	struct ckfs_model *m = c->m;
	cJSON *j, *archs, *a;
	char cls[256];
	enum ckfs_code rc = CKFS_OK;

	CKFS_TRY(ckfs_json_parse(m->config_path, m->config_json, m->config_len, &j, err));
	archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
	a = cJSON_GetArrayItem(archs, 0);
	const char *name = cJSON_IsString(a) ? a->valuestring : "";
	size_t n = strlen(name), sfx = strlen("ForCausalLM");
	if (n > sfx && n - sfx < 200 && strcmp(name + n - sfx, "ForCausalLM") == 0) {
		snprintf(cls, sizeof(cls), "%.*sForTokenClassification", (int)(n - sfx), name);
		/* Every cJSON call can fail for memory: a partial config is never
		 * served. */
		cJSON *arr = cJSON_CreateArray(), *id2 = cJSON_CreateObject(),
		      *l2i = cJSON_CreateObject();
		int ok = arr && id2 && l2i &&
			 cJSON_AddItemToArray(arr, cJSON_CreateString(cls)) &&
			 cJSON_GetArraySize(arr) == 1 &&
			 cJSON_AddStringToObject(id2, "0", "LABEL_0") &&
			 cJSON_AddNumberToObject(l2i, "LABEL_0", 0);
		cJSON_DeleteItemFromObjectCaseSensitive(j, "architectures");
		cJSON_DeleteItemFromObjectCaseSensitive(j, "id2label");
		cJSON_DeleteItemFromObjectCaseSensitive(j, "label2id");
		ok = ok && cJSON_AddItemToObject(j, "architectures", arr);
		if (!ok)
			cJSON_Delete(arr);
		ok = ok && cJSON_AddItemToObject(j, "id2label", id2);
		if (!ok)
			cJSON_Delete(id2);
		ok = ok && cJSON_AddItemToObject(j, "label2id", l2i);
		if (!ok)
			cJSON_Delete(l2i);
		char *text = ok ? cJSON_Print(j) : NULL;
		if (!text) {
			cJSON_Delete(j);
			return ckfs_nomem(err);
		}
		m->config_json = ckfs_arena_strdup(&m->arena, text);
		m->config_len = strlen(text);
		free(text);
		if (!m->config_json)
			rc = ckfs_nomem(err);
		else
			rc = ckfs_model_warn(m, err, "output_layer.weight is a value head [1, "
					     "%lld]: served as score.weight, config.json "
					     "architectures %s", (long long)c->a.hidden, cls);
	} else if (strstr(name, "ForTokenClassification") == NULL) {
		rc = ckfs_model_warn(m, err, "output_layer.weight is a value head [1, %lld]: "
				     "served as score.weight; config.json names '%s', not a "
				     "*ForCausalLM class, and is served unchanged",
				     (long long)c->a.hidden, name);
	}
	cJSON_Delete(j);
	return rc;
}

/* ---- sources ---- */

/* "model/mp_rank_TT[_PPP][_EEE]/model.pt" of grid rank r. */
static void rank_rel(const struct ctx *c, int r, char *rel, size_t cap)
{
	int t = r % c->tp, p = (r / c->tp) % c->pp, e = r / (c->tp * c->pp);

	if (c->fields == 1)
		snprintf(rel, cap, "model/mp_rank_%02d/model.pt", t);
	else if (c->fields == 2)  /* TP_PP or TP_EP: one of p, e is 0 */
		snprintf(rel, cap, "model/mp_rank_%02d_%03d/model.pt", t, p + e);
	else
		snprintf(rel, cap, "model/mp_rank_%02d_%03d_%03d/model.pt", t, p, e);
}

static enum ckfs_code open_rank(struct ctx *c, int r, struct ckfs_error *err)
{
	struct ckfs_model *m = c->m;
	char rel[128];

	rank_rel(c, r, rel, sizeof(rel));
	const char *path = ckfs_arena_printf(&m->arena, "%s/%s", m->src_dir, rel);
	const char *name = ckfs_arena_strdup(&m->arena, rel);
	if (!path || !name)
		return ckfs_nomem(err);
	enum ckfs_code rc = ckfs_source_open(&m->sources[m->n_sources], &m->policy, path, name,
					     err);
	if (rc == CKFS_E_NOTFOUND) {
		ckfs_error_clear(err);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': not found (its rank folder has "
				 "no model.pt)", path);
	}
	CKFS_TRY(rc);
	c->src[r] = (int)m->n_sources++;
	const struct ckfs_torch_open_opts o = { .label = path, .root = CKFS_TORCH_ROOT_LIST,
						.skip_suffix = "_extra_state" };
	CKFS_TRY(ckfs_torch_open(&c->files[r], m->sources[c->src[r]].f, &o, err));
	c->state[r] = R_OPEN;
	return CKFS_OK;
}

/* Same keys (in order) and same local shapes in every rank folder of
 * stage p, chunk v (experts are numbered locally, so EP ranks agree). */
static enum ckfs_code check_tp_alike(struct ctx *c, int p, size_t lo, size_t hi,
				     int v, struct ckfs_error *err)
{
	int r0 = rank_of(c, 0, p);
	const struct ckfs_torch_file *f0 = &c->files[r0];

	for (int et = 0; et < c->tp * c->ep; et++) {
		int fi = rank_of_e(c, et / c->tp, et % c->tp, p);
		const struct ckfs_torch_file *f = &c->files[fi];
		if (fi == r0 || c->state[fi] != R_OPEN)
			continue;
		size_t flo = v ? f->part_end[v - 1] : 0;
		if (f->part_end[v] - flo != hi - lo)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': chunk %d has %zu "
					 "tensors, TP rank 0 has %zu (mismatched "
					 "checkpoints?)", path_of(c, fi),
					 v, f->part_end[v] - flo, hi - lo);
		for (size_t i = 0; i < hi - lo; i++) {
			const struct ckfs_sd_entry *a = &f0->entries[lo + i],
						   *b = &f->entries[flo + i];
			int same = strcmp(a->key, b->key) == 0 &&
				   a->local.ndim == b->local.ndim;
			for (int k = 0; same && k < a->local.ndim; k++)
				same = a->local.shape[k] == b->local.shape[k];
			if (!same)
				return ckfs_fail(err, CKFS_E_INVALID,
						 "'%s': '%s' does not match TP rank 0's "
						 "'%s' (key or local shape differs: "
						 "mismatched TP sizes?)",
						 path_of(c, fi), b->key, a->key);
		}
	}
	return CKFS_OK;
}

/* Every mp_rank_* folder's numbers into c->names; TP, PP and EP as the
 * highest numbers + 1 (a two-number name is read as TP_PP until
 * decide_ep). */
static enum ckfs_code scan_dirs(struct ctx *c, struct ckfs_error *err)
{
	char path[4096];
	struct ckfs_dir *d;
	const char *de_name;
	bool de_dir;
	long max[3] = { -1, -1, -1 };
	int fields = 0;
	size_t cap = 0;

	snprintf(path, sizeof(path), "%s/model", c->m->src_dir);
	if (!(d = ckfs_opendir(path)))
		return ckfs_fail_errno(err, "'%s': cannot open", path);
	while ((de_name = ckfs_readdir(d, &de_dir))) {
		long v[3] = { 0, 0, 0 };
		int n;
		if (strncmp(de_name, "mp_rank_", 8) != 0)
			continue;
		if (!(n = parse_rank_dir(de_name, v))) {
			ckfs_fail(err, CKFS_E_FORMAT, "'%s/%s': not an mp_rank_TT, "
				  "mp_rank_TT_PPP or mp_rank_TT_PPP_EEE folder", path,
				  de_name);
			goto fail;
		}
		if (fields && n != fields) {
			ckfs_fail(err, CKFS_E_INVALID, "'%s': rank folders with %d and %d "
				  "numbers (mixed checkpoints, e.g. mp_rank_TT and "
				  "mp_rank_TT_PPP)", path, fields, n);
			goto fail;
		}
		fields = n;
		for (int k = 0; k < n; k++)
			if (v[k] > max[k])
				max[k] = v[k];
		if (c->n_names == cap) {
			if (cap >= CKFS_MAX_RANKS) {
				ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than %u rank "
					  "folders", path, CKFS_MAX_RANKS);
				goto fail;
			}
			cap = cap ? 2 * cap : 16;
			long(*nv)[3] = realloc(c->names, cap * sizeof(*nv));
			if (!nv) {
				ckfs_nomem(err);
				goto fail;
			}
			c->names = nv;
		}
		memcpy(c->names[c->n_names++], v, sizeof(v));
	}
	ckfs_closedir(d);
	if (!fields)
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s': no mp_rank_* folders", path);
	for (int k = 0; k < 3; k++)
		if (max[k] + 1 > MAX_PAR)
			return ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than %d TP, PP or "
					 "EP ranks", path, MAX_PAR);
	c->fields = fields;
	c->tp = (int)max[0] + 1;
	c->pp = fields >= 2 ? (int)max[1] + 1 : 1;
	c->ep = fields == 3 ? (int)max[2] + 1 : 1;
	if ((uint64_t)c->tp * (uint64_t)c->pp * (uint64_t)c->ep > CKFS_MAX_RANKS)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': TP %d x PP %d x EP %d rank "
				 "files is more than %u", path, c->tp, c->pp, c->ep,
				 CKFS_MAX_RANKS);
	return CKFS_OK;
fail:
	ckfs_closedir(d);
	return err->code;
}

/* Grid rank of folder names[k] ((e·PP + p)·TP + t; a two-number name's
 * second number is p or e, and either way lands on x·TP + t). */
static int rank_of_name(const struct ctx *c, const long v[3])
{
	if (c->fields == 3)
		return (int)((v[2] * c->pp + v[1]) * c->tp + v[0]);
	return (int)(v[1] * c->tp + v[0]);
}

/* A two-number name is TP_EP when config.json has experts and the first
 * folder whose second number is not 0 holds the word embedding, which
 * only PP stage 0 holds. Decided from the open files of the TP_PP
 * reading; files are numbered (e·PP + p)·TP + t, so the reinterpretation
 * moves nothing. */
static void decide_ep(struct ctx *c)
{
	if (c->fields != 2 || c->pp < 2 || c->a.n_experts <= 0)
		return;
	for (int r = c->tp; r < c->tp * c->pp; r++) {
		const struct ckfs_torch_file *f = &c->files[r];
		if (c->state[r] != R_OPEN)
			continue;
		for (size_t i = 0; i < f->n_entries; i++)
			if (strcmp(f->entries[i].key, "embedding.word_embeddings.weight") == 0) {
				c->ep = c->pp;
				c->pp = 1;
				return;
			}
		return;
	}
}

/* ---- expert tensor parallelism ---- */

static long gcd(long a, long b)
{
	while (b) {
		long t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* "a, b, c" of the indices k < n with have[k] < 0 into buf; their count. */
static int list_missing(char *buf, size_t cap, const int *have, int n)
{
	size_t len = 0;
	int count = 0;

	buf[0] = 0;
	for (int k = 0; k < n; k++) {
		if (have[k] >= 0)
			continue;
		if (count++ < 8 && len < cap)
			len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", k);
		else if (count == 9 && len < cap)
			len += (size_t)snprintf(buf + len, cap - len, ", ...");
	}
	return count;
}

/* Experts split over TP (or TP = 1, or no experts): every (TP, PP, EP)
 * folder holds a distinct shard, so all are needed. */
static enum ckfs_code check_grid(struct ctx *c, struct ckfs_error *err)
{
	int n = c->tp * c->pp * c->ep;
	char rel[128];

	for (int r = 0; r < n; r++) {
		int t = r % c->tp, p = (r / c->tp) % c->pp, e = r / (c->tp * c->pp);
		if (c->state[r] == R_OPEN)
			continue;
		rank_rel(c, r, rel, sizeof(rel));
		if (c->ep > 1)
			return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/%s': not found (TP rank "
					 "%d of PP stage %d, EP rank %d is needed: TP=%d, "
					 "PP=%d, EP=%d)", c->m->src_dir, rel, t, p, e,
					 c->tp, c->pp, c->ep);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/%s': not found (TP rank %d of "
				 "PP stage %d is needed: TP=%d, PP=%d)", c->m->src_dir,
				 rel, t, p, c->tp, c->pp);
	}
	return CKFS_OK;
}

/* Whole experts (ETP = 1, TP > 1): folder (t, p, e) is the process of TP
 * rank t and EP rank e, which megatron-core pairs only when t = e mod
 * gcd(TP, EP); any other pair means the shapes were misread. */
static enum ckfs_code check_whole_pairs(struct ctx *c, struct ckfs_error *err)
{
	long g = gcd(c->tp, c->ep);

	for (int r = 0; r < c->tp * c->pp * c->ep; r++) {
		int t = r % c->tp, e = r / (c->tp * c->pp);
		if (c->state[r] != R_OPEN || (t - e) % g == 0)
			continue;
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': whole experts (expert tensor "
				 "parallel size 1 by config.json's %s %lld) in the "
				 "folder of TP rank %d and EP rank %d, which megatron-core "
				 "never pairs at TP=%d EP=%d: ambiguous (experts split "
				 "over TP, %s %lld?)", path_of(c, r), ckfs_megatron_expert_width_key(&c->a),
				 (long long)c->a.expert_ffn, t, e, c->tp, c->ep, ckfs_megatron_expert_width_key(&c->a),
				 (long long)c->a.expert_ffn * c->tp);
	}
	return CKFS_OK;
}

/* Whole experts: each TP rank's dense part from its lowest-EP folder, each
 * EP rank's experts from its lowest-TP folder; every one of them must be
 * in some folder of every stage. */
static enum ckfs_code plan_whole(struct ctx *c, struct ckfs_error *err)
{
	struct ckfs_arena *a = &c->m->arena;
	char tps[128], eps[128];

	CKFS_TRY(check_whole_pairs(c, err));
	c->dense_e = ckfs_arena_calloc(a, (size_t)(c->pp * c->tp), sizeof(int));
	c->expert_t = ckfs_arena_calloc(a, (size_t)(c->pp * c->ep), sizeof(int));
	if (!c->dense_e || !c->expert_t)
		return ckfs_nomem(err);
	for (int k = 0; k < c->pp * c->tp; k++)
		c->dense_e[k] = -1;
	for (int k = 0; k < c->pp * c->ep; k++)
		c->expert_t[k] = -1;
	for (int p = 0; p < c->pp; p++)
		for (int e = 0; e < c->ep; e++)
			for (int t = 0; t < c->tp; t++) {
				if (c->state[(e * c->pp + p) * c->tp + t] != R_OPEN)
					continue;
				if (c->dense_e[p * c->tp + t] < 0)
					c->dense_e[p * c->tp + t] = e;
				if (c->expert_t[p * c->ep + e] < 0)
					c->expert_t[p * c->ep + e] = t;
			}
	for (int p = 0; p < c->pp; p++) {
		int nt = list_missing(tps, sizeof(tps), c->dense_e + p * c->tp, c->tp);
		int ne = list_missing(eps, sizeof(eps), c->expert_t + p * c->ep, c->ep);
		char what[320], stage[32] = "";
		if (!nt && !ne)
			continue;
		if (c->pp > 1)
			snprintf(stage, sizeof(stage), " of PP stage %d", p);
		if (nt && ne)
			snprintf(what, sizeof(what), "the dense shards of TP rank%s %s or the "
				 "experts of EP rank%s %s", nt > 1 ? "s" : "", tps,
				 ne > 1 ? "s" : "", eps);
		else if (nt)
			snprintf(what, sizeof(what), "the dense shards of TP rank%s %s",
				 nt > 1 ? "s" : "", tps);
		else
			snprintf(what, sizeof(what), "the experts of EP rank%s %s",
				 ne > 1 ? "s" : "", eps);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/model': no rank folder holds "
				 "%s%s (experts whole, expert tensor parallel size 1: "
				 "mp_rank_TT..._EEE holds TP rank TT's dense shards and EP "
				 "rank EEE's experts)", c->m->src_dir, what, stage);
	}
	return CKFS_OK;
}

/* The first expert fc1 weight of open rank file r (NULL: none), and the
 * highest local expert number + 1 over its expert keys into *n_local. */
static const struct ckfs_sd_entry *first_expert_fc1(const struct ctx *c, int r,
						     long *n_local)
{
	const struct ckfs_torch_file *f = &c->files[r];
	const struct ckfs_sd_entry *first = NULL;

	for (size_t i = 0; i < f->n_entries; i++) {
		const char *rest;
		long j, ei;
		int fc;
		if (!numbered_layer(f->entries[i].key, &j, &rest) || !expert_key(rest, &fc, &ei))
			continue;
		if (ei + 1 > *n_local)
			*n_local = ei + 1;
		if (fc == 1 && !first)
			first = &f->entries[i];
	}
	return first;
}

/* Expert fc1 rows against config.json's expert width F: 2·F is ETP = 1,
 * 2·F/TP is ETP = TP (at TP = 1 the two agree). */
static enum ckfs_code decide_etp(struct ctx *c, const struct ckfs_sd_entry *x, int r,
				 struct ckfs_error *err)
{
	int64_t rows = x->local.ndim == 2 ? x->local.shape[0] : -1, f = c->a.expert_ffn;

	c->etp = 1;
	if (c->tp == 1)
		return CKFS_OK;
	if (f <= 0)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': config.json has no %s, so "
				 "whether '%s' is a whole expert or its TP shard cannot "
				 "be told", path_of(c, r), ckfs_megatron_expert_width_key(&c->a), x->key);
	if (rows == 2 * f)
		return CKFS_OK;
	c->etp = c->tp;
	if (rows * c->tp == 2 * f)
		return CKFS_OK;
	return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' has %lld rows, expected "
			 "2 x %s %lld (whole experts, expert tensor parallel size 1) "
			 "or 2 x %lld / TP %d (experts split over TP): other expert "
			 "tensor parallel sizes are not supported", path_of(c, r),
			 x->key, (long long)rows, ckfs_megatron_expert_width_key(&c->a), (long long)f,
			 (long long)f, c->tp);
}

/* EP from the experts themselves: each rank file holds E/EP of them, so
 * EP ranks whose every folder is missing are named, not misread. */
static enum ckfs_code check_ep_complete(struct ctx *c, long n_local, int r,
					struct ckfs_error *err)
{
	int64_t ep = n_local > 0 ? c->a.n_experts / n_local : 0;

	if (n_local <= 0 || c->a.n_experts % n_local)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': %ld local experts per layer "
				 "do not divide config.json's %lld experts", path_of(c, r),
				 n_local, (long long)c->a.n_experts);
	if (ep < c->ep)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s/model': the folder names give "
				 "EP=%d, but each folder holds %ld of config.json's %lld "
				 "experts per layer (EP=%lld): mixed checkpoints?",
				 c->m->src_dir, c->ep, n_local, (long long)c->a.n_experts,
				 (long long)ep);
	if (ep > c->ep) {
		char ranks[64];
		if (ep - c->ep == 1)
			snprintf(ranks, sizeof(ranks), " %d", c->ep);
		else if (ep - c->ep == 2)
			snprintf(ranks, sizeof(ranks), "s %d, %d", c->ep, c->ep + 1);
		else
			snprintf(ranks, sizeof(ranks), "s %d to %lld", c->ep, (long long)ep - 1);
		return ckfs_fail(err, CKFS_E_NOTFOUND, "'%s/model': no rank folder holds "
				 "the experts of EP rank%s: each folder holds %ld of "
				 "config.json's %lld experts per layer (EP=%lld), the "
				 "folder names give EP=%d", c->m->src_dir, ranks, n_local,
				 (long long)c->a.n_experts, (long long)ep, c->ep);
	}
	return CKFS_OK;
}

/* Which folders the experts and the dense part are read from, after
 * checking that every rank file's expert shards have one shape and that
 * no TP or EP rank is missing. */
static enum ckfs_code plan_ranks(struct ctx *c, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *ref = NULL;
	int ref_r = -1;
	long n_local = 0;

	c->etp = c->tp;
	for (int r = 0; r < c->tp * c->pp * c->ep; r++) {
		if (c->state[r] != R_OPEN)
			continue;
		const struct ckfs_sd_entry *x = first_expert_fc1(c, r, &n_local);
		if (!x)
			continue;
		if (!ref) {
			ref = x;
			ref_r = r;
			continue;
		}
		if (x->local.ndim != ref->local.ndim ||
		    x->local.shape[0] != ref->local.shape[0])
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' has %lld rows, "
					 "'%s' has %lld (expert shards of different "
					 "expert tensor parallel sizes: mixed checkpoints?)",
					 path_of(c, r), x->key, (long long)x->local.shape[0],
					 path_of(c, ref_r), (long long)ref->local.shape[0]);
	}
	if (!ref || c->a.n_experts <= 0)
		return check_grid(c, err);
	CKFS_TRY(decide_etp(c, ref, ref_r, err));
	CKFS_TRY(check_ep_complete(c, n_local, ref_r, err));
	c->info->etp = c->etp;
	if (c->etp == 1 && c->tp > 1)
		return plan_whole(c, err);
	return check_grid(c, err);
}

/* The rank file every stage-independent check reads: TP rank 0 of stage 0. */
static const struct ckfs_torch_file *ref_file(struct ctx *c)
{
	return &c->files[rank_of(c, 0, 0)];
}

/* Config, the rank folders (every one that exists opened and read), EP
 * and ETP decided, the virtual-pipeline chunks counted. */
static enum ckfs_code open_ranks(struct ctx *c, struct ckfs_error *err)
{
	struct ckfs_model *m = c->m;
	char path[4096];

	CKFS_TRY(scan_dirs(c, err));
	snprintf(path, sizeof(path), "%s/hf_config_and_tokenizer", m->src_dir);
	const char *hf = ckfs_path_is_dir(path)
				 ? ckfs_arena_strdup(&m->arena, path)
				 : ckfs_arena_printf(&m->arena, "%s/huggingface", m->src_dir);
	CKFS_TRY(ckfs_model_load_config_from(m, hf, c->opt->config_path, err));
	CKFS_TRY(ckfs_megatron_arch(m, &c->a, err));
	if (c->fields != 2)
		CKFS_TRY(check_tp_divides(c, err));
	c->n = c->tp * c->pp * c->ep;
	m->sources = ckfs_arena_calloc(&m->arena, (size_t)c->n, sizeof(*m->sources));
	m->ranks_read = ckfs_arena_calloc(&m->arena, (size_t)c->n, sizeof(int));
	c->state = ckfs_arena_calloc(&m->arena, (size_t)c->n, 1);
	c->src = ckfs_arena_calloc(&m->arena, (size_t)c->n, sizeof(int));
	c->files = calloc((size_t)c->n, sizeof(*c->files));
	c->experts_seen = calloc((size_t)c->a.n_layers + CKFS_MEGATRON_MAX_MTP, sizeof(int));
	if (!m->sources || !m->ranks_read || !c->state || !c->src || !c->files ||
	    !c->experts_seen)
		return ckfs_nomem(err);
	for (size_t k = 0; k < c->n_names; k++)
		c->state[rank_of_name(c, c->names[k])] = R_PRESENT;
	for (int r = 0; r < c->n; r++) {
		if (c->state[r] == R_ABSENT)
			continue;
		CKFS_TRY(open_rank(c, r, err));
		m->ranks_read[m->n_ranks_read++] = r;
	}
	decide_ep(c);
	if (c->fields == 2)
		CKFS_TRY(check_tp_divides(c, err));
	CKFS_TRY(plan_ranks(c, err));
	m->world_size = (int)m->n_ranks_read;
	c->info->tp = c->tp;
	c->info->pp = c->pp;
	c->info->ep = c->ep;
	const char *ref_path = path_of(c, rank_of(c, 0, 0));
	c->vpp = (int)ref_file(c)->n_parts;
	for (int r = 0; r < c->n; r++)
		if (c->state[r] == R_OPEN && (int)c->files[r].n_parts != c->vpp)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': %zu virtual-pipeline "
					 "chunks, '%s' has %d (mismatched checkpoints)",
					 path_of(c, r), c->files[r].n_parts, ref_path, c->vpp);
	c->info->vpp = c->vpp;
	c->info->stage_layers = ckfs_arena_calloc(&m->arena, (size_t)(c->vpp * c->pp),
						  sizeof(int));
	return c->info->stage_layers ? CKFS_OK : ckfs_nomem(err);
}

/* The decoder layers of chunk v of stage p: 0 .. *nl - 1, none missing. */
static enum ckfs_code count_layers(struct ctx *c, int v, int p, long *nl,
				   struct ckfs_error *err)
{
	const struct ckfs_torch_file *f = &c->files[rank_of(c, 0, p)];
	size_t lo = v ? f->part_end[v - 1] : 0, hi = f->part_end[v];
	unsigned char *seen;
	const char *rest;
	long j;

	*nl = 0;
	for (size_t i = lo; i < hi; i++)
		if (numbered_layer(f->entries[i].key, &j, &rest) && j + 1 > *nl)
			*nl = j + 1;
	if (!(seen = calloc((size_t)*nl + 1, 1)))
		return ckfs_nomem(err);
	for (size_t i = lo; i < hi; i++)
		if (numbered_layer(f->entries[i].key, &j, &rest))
			seen[j] = 1;
	for (j = 0; j < *nl && seen[j]; j++)
		;
	free(seen);
	if (j < *nl)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': chunk %d has decoder layers up "
				 "to %ld but none numbered %ld",
				 c->m->sources[rank_of(c, 0, p)].path, v, *nl - 1, j);
	return CKFS_OK;
}

/* Every key of every chunk, VPP outer, PP inner: its layers take the next
 * global numbers. */
static enum ckfs_code map_chunks(struct ctx *c, int *dropped_head, struct ckfs_error *err)
{
	long layer0 = 0;

	for (int v = 0; v < c->vpp; v++)
		for (int p = 0; p < c->pp; p++) {
			const struct ckfs_torch_file *f = &c->files[rank_of(c, 0, p)];
			size_t lo = v ? f->part_end[v - 1] : 0, hi = f->part_end[v];
			long nl;
			CKFS_TRY(check_tp_alike(c, p, lo, hi, v, err));
			CKFS_TRY(count_layers(c, v, p, &nl, err));
			c->info->stage_layers[v * c->pp + p] = (int)nl;
			for (size_t i = lo; i < hi; i++)
				CKFS_TRY(map_key(c, p, i, layer0, dropped_head, err));
			layer0 += nl;
		}
	if (layer0 != c->a.n_layers)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': %ld decoder layers over TP=%d "
				 "PP=%d VPP=%d, config.json says num_hidden_layers %lld (a "
				 "missing pipeline stage?)", c->m->src_dir, layer0, c->tp, c->pp,
				 c->vpp, (long long)c->a.n_layers);
	CKFS_TRY(ckfs_megatron_unknown_fail(&c->unknown, c->m->src_dir, err));
	CKFS_TRY(map_mtp_shared(c, err));
	CKFS_TRY(ckfs_megatron_check_mtp(c->m, &c->a, c->n_mtp, c->m->src_dir, err));
	for (long l = 0; l < c->a.n_layers + c->n_mtp; l++)
		if (c->experts_seen[l] && c->experts_seen[l] != c->a.n_experts)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': layer %ld has %d experts "
					 "over EP=%d, config.json says %lld (a missing EP "
					 "rank?)", c->m->src_dir, l, c->experts_seen[l], c->ep,
					 (long long)c->a.n_experts);
	return CKFS_OK;
}

/* The warnings of a model that opened. */
static enum ckfs_code report(struct ctx *c, int dropped_head, struct ckfs_error *err)
{
	struct ckfs_model *m = c->m;

	if (c->value_head)
		CKFS_TRY(value_config(c, err));
	if (dropped_head)
		CKFS_TRY(ckfs_megatron_warn_tied(m, err));
	if (c->n_raw)
		CKFS_TRY(ckfs_model_warn(m, err, "%zu Megatron keys without a Hugging Face "
					 "name served raw, per rank (--raw-names)", c->n_raw));
	if (ref_file(c)->n_skipped)
		CKFS_TRY(ckfs_model_warn(m, err, "%zu _extra_state entries skipped per rank "
					 "(Transformer Engine metadata)",
					 ref_file(c)->n_skipped));
	return CKFS_OK;
}

static enum ckfs_code megatron_build(struct ckfs_model *m, const struct ckfs_model_options *opt,
				     struct ckfs_error *err)
{
	struct ctx c = { .m = m, .opt = opt };
	int dropped_head = 0;
	enum ckfs_code rc;

	if (!(c.info = m->layout_info = ckfs_arena_calloc(&m->arena, 1, sizeof(*c.info))))
		return ckfs_nomem(err);
	if ((rc = open_ranks(&c, err)) == CKFS_OK &&
	    (rc = map_chunks(&c, &dropped_head, err)) == CKFS_OK &&
	    (rc = ckfs_outs_to_model(m, &c.outs, m->src_dir, err)) == CKFS_OK)
		rc = report(&c, dropped_head, err);
	ckfs_outs_release(&c.outs);
	for (int r = 0; c.files && c.state && r < c.n; r++)
		if (c.state[r] == R_OPEN)
			ckfs_torch_close(&c.files[r]);
	free(c.files);
	free(c.experts_seen);
	free(c.names);
	return rc;
}

/* The parallel sizes and the layers of each pipeline chunk. */
static enum ckfs_code megatron_describe(const struct ckfs_model *m, struct ckfs_facts *f,
					struct ckfs_error *err)
{
	const struct megatron_info *info = m->layout_info;
	const int n = info->pp * info->vpp;
	struct ckfs_strbuf line = { 0 };

	CKFS_TRY(ckfs_facts_layout_line(f, m, false, err));
	cJSON *o = cJSON_CreateObject();
	ckfs_strbuf_fmt(&line, "TP=%d PP=%d VPP=%d EP=%d", info->tp, info->pp, info->vpp,
			info->ep);
	if (info->etp)
		ckfs_strbuf_fmt(&line, " ETP=%d", info->etp);
	ckfs_strbuf_str(&line, ", layers per chunk (");
	for (int i = 0; i < n; i++)
		ckfs_strbuf_fmt(&line, "%s%d", i ? ", " : "", info->stage_layers[i]);
	ckfs_strbuf_str(&line, ")");
	/* An item cJSON could not add (its key's copy failed) is still ours. */
	cJSON *stages = cJSON_CreateIntArray(info->stage_layers, n);
	bool ok = cJSON_AddNumberToObject(o, "tp", info->tp) &&
		  cJSON_AddNumberToObject(o, "pp", info->pp) &&
		  cJSON_AddNumberToObject(o, "vpp", info->vpp) &&
		  cJSON_AddNumberToObject(o, "ep", info->ep) &&
		  (!info->etp || cJSON_AddNumberToObject(o, "etp", info->etp)) &&
		  cJSON_AddItemToObject(o, "stage_layers", stages);
	if (!ok)
		cJSON_Delete(stages);
	return ckfs_facts_add(f, "parallelism", &line, "megatron", ckfs_facts_json(o, ok), err);
}

const struct ckfs_layout ckfs_layout_megatron = {
	.name = "megatron",
	.what = "a Megatron checkpoint",
	.looks_for = "model/mp_rank_*",
	.detect = megatron_detect,
	.build = megatron_build,
	.describe = megatron_describe,
	.flags = CKFS_LAYOUT_RANK_ZIPS,
};
