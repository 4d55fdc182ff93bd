/* SPDX-License-Identifier: MIT */
/*
 * Legacy Megatron-Core per-rank checkpoints as verl wrote them from 2025-04
 * to 2025-06 (verl-checkpoints.md 3.1(b), formats.md "Megatron per-rank"):
 *
 *   SRC/model/mp_rank_{tp:02d}/model.pt            (PP = 1)
 *   SRC/model/mp_rank_{tp:02d}_{pp:03d}/model.pt   (PP > 1)
 *   SRC/hf_config_and_tokenizer/ or SRC/huggingface/   config.json
 *
 * Each model.pt is a torch.save of a Python LIST with one GPTModel state
 * dict per virtual-pipeline chunk, TP-local shards, local layer numbers.
 * Dense GPT models only (Llama, Qwen2 with qkv bias, Qwen3 with q/k norm).
 *
 * Layer numbering: chunks are visited (vpp outer, pp inner); each chunk's
 * layers get the next global indices, counted from the layers it actually
 * holds, so uneven first/last stages and VPP work.
 *
 * TP merge, as a plan of chunks (nothing is copied):
 *   linear_qkv.{weight,bias}   per rank nkv/TP query groups [q r·d; k d; v d]
 *                              -> q_proj / k_proj / v_proj row chunks
 *   linear_fc1.weight          per rank [gate; up] -> gate_proj / up_proj
 *   linear_proj, linear_fc2    row-parallel: column chunks (dim 1)
 *   embedding, output_layer    vocab-parallel: row chunks (dim 0)
 *   norms, other biases        replicated: TP rank 0's copy
 * Keys ending in _extra_state (Transformer Engine) are skipped; any other
 * key this table does not know is an error listing them. output_layer is
 * dropped (with a warning) when config.json ties the embeddings.
 * The layers found must add up to config.json's num_hidden_layers (a
 * missing last PP stage is not silently served short), with no gaps in a
 * chunk's local numbers.
 * Refused: expert-parallel folders (mp_rank_XX_YYY_ZZZ), fewer KV heads
 * than TP ranks (Megatron-Core itself requires num_query_groups % TP == 0),
 * MoE/MLA keys (listed as unknown), vocab-parallel rows that do not add up
 * to config.json's vocab_size (padded vocabularies, value heads).
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

#include "model/model_int.h"

#define MAX_PAR 1024

static enum ckfs_code nomem(struct ckfs_error *err)
{
	return ckfs_fail(err, CKFS_E_NOMEM, "out of memory");
}

/* ---- folder names ---- */

/* "mp_rank_DD" (pp -1) or "mp_rank_DD_DDD"; *ep set for a third field. */
static int parse_rank_dir(const char *name, long *tp, long *pp, int *ep)
{
	static const char pfx[] = "mp_rank_";
	const char *s = name + sizeof(pfx) - 1;
	char *end;

	*pp = -1;
	*ep = 0;
	if (strncmp(name, pfx, sizeof(pfx) - 1) != 0 || !isdigit((unsigned char)*s))
		return 0;
	*tp = strtol(s, &end, 10);
	if (*end == 0)
		return 1;
	if (*end != '_' || !isdigit((unsigned char)end[1]))
		return 0;
	*pp = strtol(end + 1, &end, 10);
	if (*end == 0)
		return 1;
	if (*end == '_' && isdigit((unsigned char)end[1])) {
		*ep = 1;
		return 1;
	}
	return 0;
}

int ckfs_megatron_detect(const char *src_dir)
{
	char path[4096];
	DIR *d;
	struct dirent *de;
	int found = 0;
	long tp, pp;
	int ep;

	if ((size_t)snprintf(path, sizeof(path), "%s/model", src_dir) >= sizeof(path))
		return 0;
	if (!(d = opendir(path)))
		return 0;
	while (!found && (de = readdir(d)))
		found = parse_rank_dir(de->d_name, &tp, &pp, &ep);
	closedir(d);
	return found;
}

/* ---- output tensors under construction ---- */

struct out {
	const char *name;
	const char *placement;
	enum ckfs_dtype dtype;
	int ndim;
	int64_t shape[CKFS_MAX_DIMS];
	struct ckfs_chunk_list chunks;
};

struct ctx {
	struct ckfs_model *m;
	struct ckfs_torch_file *files; /* [pp][tp] */
	int tp, pp, vpp;
	int pp_names;                  /* folders named mp_rank_TT_PPP */
	/* config */
	int64_t hidden, nh, nkv, head_dim, vocab, n_layers;
	struct out *outs;
	size_t n_outs, cap_outs;
	char unknown[1024];
	size_t n_unknown;
};

static struct out *new_out(struct ctx *c, const char *name, const char *placement,
			   int ndim, const int64_t *shape, struct ckfs_error *err)
{
	if (c->n_outs == c->cap_outs) {
		size_t cap = c->cap_outs ? 2 * c->cap_outs : 64;
		struct out *v = realloc(c->outs, cap * sizeof(*v));
		if (!v) {
			nomem(err);
			return NULL;
		}
		c->outs = v;
		c->cap_outs = cap;
	}
	struct out *o = &c->outs[c->n_outs];
	memset(o, 0, sizeof(*o));
	o->name = ckfs_arena_strdup(&c->m->arena, name);
	if (!o->name) {
		nomem(err);
		return NULL;
	}
	o->placement = placement;
	o->dtype = CKFS_DTYPE_INVALID;
	o->ndim = ndim;
	for (int k = 0; k < ndim; k++)
		o->shape[k] = shape[k];
	c->n_outs++;
	return o;
}

/* Rows [lo, lo + n) along dim of entry e (rank file src) placed at global
 * offset goff (goff[dim] is the first row's global index). */
static enum ckfs_code add_slice(struct ctx *c, struct out *o,
				const struct ckfs_sd_entry *e, uint32_t src, int rank,
				int dim, int64_t lo, int64_t n, const int64_t *goff,
				struct ckfs_error *err)
{
	struct ckfs_sd_entry copy = *e;
	int64_t coord[CKFS_MAX_DIMS] = { 0 };

	if (e->kind != CKFS_ENTRY_TENSOR)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': '%s' is not a plain "
				 "tensor", c->m->sources[src].path, e->key);
	if (o->dtype == CKFS_DTYPE_INVALID)
		o->dtype = e->local.dtype;
	else if (o->dtype != e->local.dtype)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is %s, other ranks "
				 "hold %s", c->m->sources[src].path, e->key,
				 ckfs_dtype_st_name(e->local.dtype), ckfs_dtype_st_name(o->dtype));
	if (lo < 0 || n < 0 || lo + n > e->local.shape[dim])
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' is too small "
				 "(%lld rows on dim %d)", c->m->sources[src].path,
				 e->key, (long long)e->local.shape[dim], dim);
	copy.local.storage_offset += lo * e->local.stride[dim];
	copy.local.shape[dim] = n;
	size_t before = o->chunks.n;
	CKFS_TRY(ckfs_entry_chunks(&copy, coord, src, rank, &o->chunks, err));
	for (size_t i = before; i < o->chunks.n; i++)
		for (int k = 0; k < o->ndim; k++)
			o->chunks.v[i].offset[k] += goff[k];
	return CKFS_OK;
}

static void note_unknown(struct ctx *c, const char *key)
{
	size_t l = strlen(c->unknown);
	if (c->n_unknown++ < 8)
		snprintf(c->unknown + l, sizeof(c->unknown) - l, "%s'%s'",
			 l ? ", " : "", key);
}

static const struct ckfs_sd_entry *entry_at(struct ctx *c, int t, int p, size_t i)
{
	return &c->files[p * c->tp + t].entries[i];
}

static uint32_t src_of(struct ctx *c, int t, int p)
{
	return (uint32_t)(p * c->tp + t);
}

static int rank_of(struct ctx *c, int t, int p)
{
	return p * c->tp + t;
}

static enum ckfs_code replicated(struct ctx *c, const char *name, int p, size_t i,
				 struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e = entry_at(c, 0, p, i);
	int64_t goff[CKFS_MAX_DIMS] = { 0 };
	struct out *o = new_out(c, name, "Replicate()", e->local.ndim, e->local.shape, err);

	if (!o)
		return err->code;
	if (e->local.ndim < 1)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' is a scalar",
				 c->m->sources[src_of(c, 0, p)].path, e->key);
	return add_slice(c, o, e, src_of(c, 0, p), rank_of(c, 0, p), 0, 0,
			 e->local.shape[0], goff, err);
}

/* Concatenation over TP ranks along dim. */
static enum ckfs_code concat(struct ctx *c, const char *name, int p, size_t i, int dim,
			     struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e0 = entry_at(c, 0, p, i);
	int64_t shape[CKFS_MAX_DIMS];
	int64_t goff[CKFS_MAX_DIMS] = { 0 };

	if (e0->local.ndim <= dim)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' has %d dims",
				 c->m->sources[src_of(c, 0, p)].path, e0->key,
				 e0->local.ndim);
	memcpy(shape, e0->local.shape, sizeof(shape));
	shape[dim] = 0;
	for (int t = 0; t < c->tp; t++)
		shape[dim] += entry_at(c, t, p, i)->local.shape[dim];
	struct out *o = new_out(c, name, dim == 0 ? "Shard(0)" : "Shard(1)",
				e0->local.ndim, shape, err);
	if (!o)
		return err->code;
	for (int t = 0; t < c->tp; t++) {
		const struct ckfs_sd_entry *e = entry_at(c, t, p, i);
		CKFS_TRY(add_slice(c, o, e, src_of(c, t, p), rank_of(c, t, p), dim, 0,
				   e->local.shape[dim], goff, err));
		goff[dim] += e->local.shape[dim];
	}
	return CKFS_OK;
}

/* Vocab-parallel rows: their sum must be config.json's vocab_size (verl
 * does not pad; a critic's [1, H] value head would not match). */
static enum ckfs_code vocab_rows(struct ctx *c, const char *name, int p, size_t i,
				 struct ckfs_error *err)
{
	int64_t rows = 0;

	for (int t = 0; t < c->tp; t++)
		rows += entry_at(c, t, p, i)->local.shape[0];
	if (c->vocab > 0 && rows != c->vocab)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': '%s' has %lld rows over "
				 "%d TP rank%s, config.json says vocab_size %lld (a missing "
				 "TP rank? padded vocabularies and value heads are not "
				 "supported)",
				 c->m->sources[src_of(c, 0, p)].path,
				 entry_at(c, 0, p, i)->key, (long long)rows, c->tp,
				 c->tp == 1 ? "" : "s", (long long)c->vocab);
	return concat(c, name, p, i, 0, err);
}

/* linear_fc1.weight -> gate_proj / up_proj (new_out may move c->outs:
 * the two outputs are addressed by index). */
static enum ckfs_code split_fc1(struct ctx *c, const char *pre, const char *kind, int p,
				size_t i, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e0 = entry_at(c, 0, p, i);
	int64_t shape[CKFS_MAX_DIMS];
	char name[CKFS_MAX_NAME];
	static const char *const part[2] = { "gate_proj", "up_proj" };

	if (e0->local.ndim < 1 || e0->local.shape[0] % 2)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': '%s' has an odd number of "
				 "rows (not [gate; up])",
				 c->m->sources[src_of(c, 0, p)].path, e0->key);
	int64_t half = e0->local.shape[0] / 2;
	memcpy(shape, e0->local.shape, sizeof(shape));
	shape[0] = half * c->tp;
	for (int h = 0; h < 2; h++) {
		snprintf(name, sizeof(name), "%smlp.%s.%s", pre, part[h], kind);
		if (!new_out(c, name, "Shard(0) of fc1", e0->local.ndim, shape, err))
			return err->code;
	}
	for (int h = 0; h < 2; h++)
		for (int t = 0; t < c->tp; t++) {
			int64_t goff[CKFS_MAX_DIMS] = { 0 };
			goff[0] = t * half;
			CKFS_TRY(add_slice(c, &c->outs[c->n_outs - 2 + h],
					   entry_at(c, t, p, i), src_of(c, t, p),
					   rank_of(c, t, p), 0, h * half, half, goff, err));
		}
	return CKFS_OK;
}

/* linear_qkv.{weight,bias} -> q_proj / k_proj / v_proj. */
static enum ckfs_code split_qkv(struct ctx *c, const char *pre, const char *kind, int p,
				size_t i, struct ckfs_error *err)
{
	const struct ckfs_sd_entry *e0 = entry_at(c, 0, p, i);
	const char *path = c->m->sources[src_of(c, 0, p)].path;
	int64_t d = c->head_dim, r = c->nh / c->nkv, gp = c->nkv / c->tp;
	static const char *const part[3] = { "q_proj", "k_proj", "v_proj" };
	char name[CKFS_MAX_NAME];

	if (e0->local.ndim < 1 || e0->local.shape[0] != gp * (r + 2) * d)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s': '%s' has %lld rows, expected %lld (%lld query "
				 "groups of %lld q heads + k + v, head_dim %lld, TP %d: "
				 "a missing TP rank or a different config.json?)",
				 path, e0->key, (long long)e0->local.shape[0],
				 (long long)(gp * (r + 2) * d), (long long)gp,
				 (long long)r, (long long)d, c->tp);
	size_t first = c->n_outs;
	for (int h = 0; h < 3; h++) {
		int64_t shape[CKFS_MAX_DIMS];
		memcpy(shape, e0->local.shape, sizeof(shape));
		shape[0] = (h == 0 ? c->nh : c->nkv) * d;
		snprintf(name, sizeof(name), "%sself_attn.%s.%s", pre, part[h], kind);
		if (!new_out(c, name, "Shard(0) of qkv", e0->local.ndim, shape, err))
			return err->code;
	}
	for (int t = 0; t < c->tp; t++)
		for (int64_t gl = 0; gl < gp; gl++) {
			int64_t g = t * gp + gl, base = gl * (r + 2) * d;
			const struct ckfs_sd_entry *e = entry_at(c, t, p, i);
			int64_t goff[CKFS_MAX_DIMS] = { 0 };
			goff[0] = g * r * d;
			CKFS_TRY(add_slice(c, &c->outs[first], e, src_of(c, t, p),
					   rank_of(c, t, p), 0, base, r * d, goff, err));
			goff[0] = g * d;
			CKFS_TRY(add_slice(c, &c->outs[first + 1], e, src_of(c, t, p),
					   rank_of(c, t, p), 0, base + r * d, d, goff, err));
			CKFS_TRY(add_slice(c, &c->outs[first + 2], e, src_of(c, t, p),
					   rank_of(c, t, p), 0, base + (r + 1) * d, d, goff,
					   err));
		}
	return CKFS_OK;
}

/* Layer-local suffixes. */
enum kind { K_REPL, K_ROW, K_QKV, K_FC1, K_UNKNOWN };
static const struct {
	const char *mg, *hf;
	enum kind kind;
} layer_map[] = {
	{ "input_layernorm.weight", "input_layernorm.weight", K_REPL },
	{ "input_layernorm.bias", "input_layernorm.bias", K_REPL },
	{ "self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight", K_REPL },
	{ "self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias", K_REPL },
	{ "self_attention.linear_qkv.weight", "weight", K_QKV },
	{ "self_attention.linear_qkv.bias", "bias", K_QKV },
	{ "self_attention.q_layernorm.weight", "self_attn.q_norm.weight", K_REPL },
	{ "self_attention.k_layernorm.weight", "self_attn.k_norm.weight", K_REPL },
	{ "self_attention.linear_proj.weight", "self_attn.o_proj.weight", K_ROW },
	{ "self_attention.linear_proj.bias", "self_attn.o_proj.bias", K_REPL },
	{ "pre_mlp_layernorm.weight", "post_attention_layernorm.weight", K_REPL },
	{ "pre_mlp_layernorm.bias", "post_attention_layernorm.bias", K_REPL },
	{ "mlp.linear_fc1.layer_norm_weight", "post_attention_layernorm.weight", K_REPL },
	{ "mlp.linear_fc1.layer_norm_bias", "post_attention_layernorm.bias", K_REPL },
	{ "mlp.linear_fc1.weight", "weight", K_FC1 },
	{ "mlp.linear_fc2.weight", "mlp.down_proj.weight", K_ROW },
	{ "mlp.linear_fc2.bias", "mlp.down_proj.bias", K_REPL },
};

/* "decoder.layers.<N>.<rest>": N and rest; 0 when key is not one. */
static int layer_key(const char *key, long *n, const char **rest)
{
	static const char pfx[] = "decoder.layers.";
	char *end;

	if (strncmp(key, pfx, sizeof(pfx) - 1) != 0 ||
	    !isdigit((unsigned char)key[sizeof(pfx) - 1]))
		return 0;
	*n = strtol(key + sizeof(pfx) - 1, &end, 10);
	if (*end != '.' || *n < 0 || *n > 100000)
		return 0;
	*rest = end + 1;
	return 1;
}

static enum ckfs_code map_key(struct ctx *c, int p, size_t i, long layer0,
			      int *dropped_head, struct ckfs_error *err)
{
	const char *key = entry_at(c, 0, p, i)->key;
	const char *rest;
	long j;
	char pre[64], name[CKFS_MAX_NAME];

	if (strcmp(key, "embedding.word_embeddings.weight") == 0)
		return vocab_rows(c, "model.embed_tokens.weight", p, i, err);
	if (strcmp(key, "output_layer.weight") == 0) {
		if (c->m->tie_word_embeddings) {
			*dropped_head = 1;
			return CKFS_OK;
		}
		return vocab_rows(c, "lm_head.weight", p, i, err);
	}
	if (strcmp(key, "decoder.final_layernorm.weight") == 0)
		return replicated(c, "model.norm.weight", p, i, err);
	if (strcmp(key, "decoder.final_layernorm.bias") == 0)
		return replicated(c, "model.norm.bias", p, i, err);
	if (!layer_key(key, &j, &rest)) {
		note_unknown(c, key);
		return CKFS_OK;
	}
	snprintf(pre, sizeof(pre), "model.layers.%ld.", layer0 + j);
	for (size_t k = 0; k < sizeof(layer_map) / sizeof(layer_map[0]); k++) {
		if (strcmp(rest, layer_map[k].mg) != 0)
			continue;
		switch (layer_map[k].kind) {
		case K_REPL:
			snprintf(name, sizeof(name), "%s%s", pre, layer_map[k].hf);
			return replicated(c, name, p, i, err);
		case K_ROW:
			snprintf(name, sizeof(name), "%s%s", pre, layer_map[k].hf);
			return concat(c, name, p, i, 1, err);
		case K_QKV:
			return split_qkv(c, pre, layer_map[k].hf, p, i, err);
		case K_FC1:
			return split_fc1(c, pre, layer_map[k].hf, p, i, err);
		case K_UNKNOWN:
			break;
		}
	}
	note_unknown(c, key);
	return CKFS_OK;
}

/* ---- config ---- */

static int64_t cfg_int(cJSON *j, const char *name, int64_t dflt)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
	return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : dflt;
}

static enum ckfs_code read_arch(struct ctx *c, struct ckfs_error *err)
{
	cJSON *j = cJSON_ParseWithLength(c->m->config_json, c->m->config_len);

	if (!j)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': not JSON", c->m->config_path);
	c->hidden = cfg_int(j, "hidden_size", 0);
	c->nh = cfg_int(j, "num_attention_heads", 0);
	c->nkv = cfg_int(j, "num_key_value_heads", c->nh);
	c->head_dim = cfg_int(j, "head_dim", c->nh > 0 ? c->hidden / c->nh : 0);
	c->vocab = cfg_int(j, "vocab_size", 0);
	c->n_layers = cfg_int(j, "num_hidden_layers", 0);
	cJSON_Delete(j);
	if (c->hidden <= 0 || c->nh <= 0 || c->nkv <= 0 || c->head_dim <= 0 ||
	    c->nh % c->nkv)
		return ckfs_fail(err, CKFS_E_FORMAT, "'%s': needs hidden_size, "
				 "num_attention_heads (a multiple of num_key_value_heads) "
				 "for a Megatron checkpoint", c->m->config_path);
	if (c->nkv % c->tp)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': num_key_value_heads "
				 "%lld is not a multiple of TP %d (Megatron-Core needs "
				 "num_query_groups %% TP == 0; replicated KV heads are "
				 "not supported)", c->m->src_dir,
				 (long long)c->nkv, c->tp);
	return CKFS_OK;
}

/* ---- sources ---- */

static enum ckfs_code open_rank(struct ctx *c, int t, int p, struct ckfs_error *err)
{
	struct ckfs_model *m = c->m;
	char rel[128];
	struct stat st;

	if (!c->pp_names)
		snprintf(rel, sizeof(rel), "model/mp_rank_%02d/model.pt", t);
	else
		snprintf(rel, sizeof(rel), "model/mp_rank_%02d_%03d/model.pt", t, p);
	const char *path = ckfs_arena_printf(&m->arena, "%s/%s", m->src_dir, rel);
	const char *name = ckfs_arena_strdup(&m->arena, rel);
	if (!path || !name)
		return nomem(err);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return errno == ENOENT
			       ? ckfs_fail(err, CKFS_E_NOTFOUND,
					   "'%s': not found (TP rank %d of PP stage %d is "
					   "needed: TP=%d, PP=%d)", path, t, p, c->tp, c->pp)
			       : ckfs_fail_errno(err, "'%s': cannot open", path);
	enum ckfs_code rc = ckfs_model_check_path(m, path, fd, err);
	if (rc == CKFS_OK && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)))
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': not a regular file", path);
	if (rc == CKFS_OK)
		rc = ckfs_source_init(&m->sources[m->n_sources], fd, path, name, err);
	if (rc != CKFS_OK) {
		close(fd);
		return rc;
	}
	m->n_sources++;
	return ckfs_torch_open_list(&c->files[p * c->tp + t], fd, path, "_extra_state",
				    err);
}

/* Same keys (in order) and same local shapes on every TP rank of stage p. */
static enum ckfs_code check_tp_alike(struct ctx *c, int p, size_t lo, size_t hi,
				     int v, struct ckfs_error *err)
{
	const struct ckfs_torch_file *f0 = &c->files[p * c->tp];

	for (int t = 1; t < c->tp; t++) {
		const struct ckfs_torch_file *f = &c->files[p * c->tp + t];
		size_t flo = v ? f->part_end[v - 1] : 0;
		if (f->part_end[v] - flo != hi - lo)
			return ckfs_fail(err, CKFS_E_INVALID, "'%s': chunk %d has %zu "
					 "tensors, TP rank 0 has %zu (mismatched "
					 "checkpoints?)", c->m->sources[p * c->tp + t].path,
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
						 c->m->sources[p * c->tp + t].path,
						 b->key, a->key);
		}
	}
	return CKFS_OK;
}

static enum ckfs_code scan_dirs(struct ctx *c, struct ckfs_error *err)
{
	char path[4096];
	DIR *d;
	struct dirent *de;
	long max_tp = -1, max_pp = -1;
	int with_pp = 0, without_pp = 0;

	snprintf(path, sizeof(path), "%s/model", c->m->src_dir);
	if (!(d = opendir(path)))
		return ckfs_fail_errno(err, "'%s': cannot open", path);
	while ((de = readdir(d))) {
		long tp, pp;
		int ep;
		if (strncmp(de->d_name, "mp_rank_", 8) != 0)
			continue;
		if (!parse_rank_dir(de->d_name, &tp, &pp, &ep)) {
			ckfs_fail(err, CKFS_E_FORMAT, "'%s/%s': not an mp_rank_TT or "
				  "mp_rank_TT_PPP folder", path, de->d_name);
			closedir(d);
			return err->code;
		}
		if (ep) {
			ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s/%s': expert-parallel "
				  "Megatron checkpoints are not supported yet", path,
				  de->d_name);
			closedir(d);
			return err->code;
		}
		if (tp > max_tp)
			max_tp = tp;
		if (pp > max_pp)
			max_pp = pp;
		if (pp < 0)
			without_pp = 1;
		else
			with_pp = 1;
	}
	closedir(d);
	if (with_pp && without_pp)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': both mp_rank_TT and "
				 "mp_rank_TT_PPP folders (mixed checkpoints)", path);
	if (max_tp + 1 > MAX_PAR || max_pp + 1 > MAX_PAR)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': more than %d TP or PP ranks",
				 path, MAX_PAR);
	c->tp = (int)max_tp + 1;
	c->pp = with_pp ? (int)max_pp + 1 : 1;
	c->pp_names = with_pp;
	return CKFS_OK;
}

enum ckfs_code ckfs_megatron_build(struct ckfs_model *m,
				   const struct ckfs_model_options *opt,
				   struct ckfs_error *err)
{
	struct ctx c;
	enum ckfs_code rc;
	char path[4096];

	memset(&c, 0, sizeof(c));
	c.m = m;
	CKFS_TRY(scan_dirs(&c, err));
	snprintf(path, sizeof(path), "%s/hf_config_and_tokenizer", m->src_dir);
	const char *hf = ckfs_path_is_dir(path)
				 ? ckfs_arena_strdup(&m->arena, path)
				 : ckfs_arena_printf(&m->arena, "%s/huggingface", m->src_dir);
	CKFS_TRY(ckfs_model_load_config_from(m, hf, opt->config_path, err));
	CKFS_TRY(read_arch(&c, err));

	int n = c.tp * c.pp;
	m->world_size = n;
	m->tp_size = c.tp;
	m->pp_size = c.pp;
	m->sources = ckfs_arena_calloc(&m->arena, (size_t)n, sizeof(*m->sources));
	m->ranks_read = ckfs_arena_calloc(&m->arena, (size_t)n, sizeof(int));
	c.files = calloc((size_t)n, sizeof(*c.files));
	if (!m->sources || !m->ranks_read || !c.files) {
		free(c.files);
		return nomem(err);
	}
	int opened = 0;
	for (int p = 0; p < c.pp; p++)
		for (int t = 0; t < c.tp; t++) {
			rc = open_rank(&c, t, p, err);
			if (rc != CKFS_OK)
				goto out;
			opened++;
			m->ranks_read[m->n_ranks_read++] = p * c.tp + t;
		}
	c.vpp = (int)c.files[0].n_parts;
	for (int r = 1; r < n; r++)
		if ((int)c.files[r].n_parts != c.vpp) {
			rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': %zu virtual-pipeline "
				       "chunks, '%s' has %d (mismatched checkpoints)",
				       m->sources[r].path, c.files[r].n_parts,
				       m->sources[0].path, c.vpp);
			goto out;
		}
	m->vpp_size = c.vpp;
	m->stage_layers = ckfs_arena_calloc(&m->arena, (size_t)(c.vpp * c.pp),
					    sizeof(int));
	if (!m->stage_layers) {
		rc = nomem(err);
		goto out;
	}
	long layer0 = 0;
	int dropped_head = 0;
	rc = CKFS_OK;
	for (int v = 0; v < c.vpp && rc == CKFS_OK; v++)
		for (int p = 0; p < c.pp && rc == CKFS_OK; p++) {
			const struct ckfs_torch_file *f = &c.files[p * c.tp];
			size_t lo = v ? f->part_end[v - 1] : 0, hi = f->part_end[v];
			long nl = 0;
			if ((rc = check_tp_alike(&c, p, lo, hi, v, err)) != CKFS_OK)
				break;
			for (size_t i = lo; i < hi; i++) {
				long j;
				const char *rest;
				if (layer_key(f->entries[i].key, &j, &rest) && j + 1 > nl)
					nl = j + 1;
			}
			/* Every local layer 0 .. nl-1 present (no gaps). */
			for (long j = 0; j < nl && rc == CKFS_OK; j++) {
				int seen = 0;
				for (size_t i = lo; i < hi && !seen; i++) {
					long jj;
					const char *rest;
					seen = layer_key(f->entries[i].key, &jj, &rest) && jj == j;
				}
				if (!seen)
					rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': chunk %d has "
						       "decoder layers up to %ld but none "
						       "numbered %ld", m->sources[p * c.tp].path,
						       v, nl - 1, j);
			}
			if (rc != CKFS_OK)
				break;
			m->stage_layers[v * c.pp + p] = (int)nl;
			for (size_t i = lo; i < hi && rc == CKFS_OK; i++)
				rc = map_key(&c, p, i, layer0, &dropped_head, err);
			layer0 += nl;
		}
	if (rc != CKFS_OK)
		goto out;
	if (c.n_layers > 0 && layer0 != c.n_layers) {
		rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': %ld decoder layers over TP=%d "
			       "PP=%d VPP=%d, config.json says num_hidden_layers %lld (a "
			       "missing pipeline stage?)", m->src_dir, layer0, c.tp, c.pp,
			       c.vpp, (long long)c.n_layers);
		goto out;
	}
	if (c.n_unknown) {
		rc = ckfs_fail(err, CKFS_E_UNSUPPORTED, "'%s': %zu Megatron keys not "
			       "understood (dense GPT models only): %s%s", m->src_dir,
			       c.n_unknown, c.unknown, c.n_unknown > 8 ? ", ..." : "");
		goto out;
	}

	m->tensors = ckfs_arena_calloc(&m->arena, c.n_outs + 1, sizeof(*m->tensors));
	if (!m->tensors) {
		rc = nomem(err);
		goto out;
	}
	for (size_t i = 0; i < c.n_outs; i++) {
		struct out *o = &c.outs[i];
		struct ckfs_tensor *t = &m->tensors[m->n_tensors];
		for (size_t k = 0; k < m->n_tensors; k++)
			if (strcmp(m->tensors[k].name, o->name) == 0) {
				rc = ckfs_fail(err, CKFS_E_INVALID, "'%s': tensor '%s' "
					       "comes from two Megatron keys",
					       m->src_dir, o->name);
				goto out;
			}
		t->name = o->name;
		t->placement = o->placement;
		t->stored_dtype = o->dtype;
		t->out_dtype = opt->out_dtype == CKFS_DTYPE_INVALID ? o->dtype
								    : opt->out_dtype;
		t->ndim = o->ndim;
		memcpy(t->shape, o->shape, sizeof(t->shape));
		t->numel = 1;
		for (int k = 0; k < t->ndim; k++)
			t->numel *= (uint64_t)t->shape[k];
		t->n_chunks = (uint32_t)o->chunks.n;
		t->chunks = ckfs_arena_calloc(&m->arena, o->chunks.n + 1,
					      sizeof(*t->chunks));
		if (!t->chunks) {
			rc = nomem(err);
			goto out;
		}
		memcpy(t->chunks, o->chunks.v, o->chunks.n * sizeof(*t->chunks));
		if ((rc = ckfs_plan_validate_tensor(m, t, err)) != CKFS_OK) {
			ckfs_error_prefix(err, "'%s'", m->src_dir);
			goto out;
		}
		m->n_tensors++;
	}
	if (dropped_head)
		rc = ckfs_model_warn(m, err, "output_layer.weight dropped: tied to "
				     "model.embed_tokens.weight (tie_word_embeddings)");
	if (rc == CKFS_OK && c.files[0].n_skipped)
		rc = ckfs_model_warn(m, err, "%zu _extra_state entries skipped per "
				     "rank (Transformer Engine metadata)",
				     c.files[0].n_skipped);
out:
	for (size_t i = 0; i < c.n_outs; i++)
		free(c.outs[i].chunks.v);
	free(c.outs);
	for (int r = 0; r < opened; r++)
		ckfs_torch_close(&c.files[r]);
	free(c.files);
	return rc;
}
