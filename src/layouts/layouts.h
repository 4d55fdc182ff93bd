/* SPDX-License-Identifier: MIT */
/* Shared inside src/layouts only: helpers of the layout readers. */
#ifndef CKFS_LAYOUTS_INT_H
#define CKFS_LAYOUTS_INT_H

#include <regex.h>
#include <string.h>

#include "ckfs/json.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/units.h"
#include "ckfs/torch.h"

/* ---- config.c ---- */

/* A metadata file the tensors are described by (fsdp_config.json,
 * .metadata, metadata.json), read whole under m's file policy: who may
 * read it is appended to m->meta_files, so the weights are never shown
 * more widely than it allows (include/ckfs/perm.h). */
enum ckfs_code ckfs_model_read_meta(struct ckfs_model *m, const char *path, size_t max,
				    char **out, size_t *len,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The same for a source opened whole (a torch.save file whose pickle
 * names and shapes tensors read from other files): who may read it is
 * appended to m->meta_files, nothing is read. */
enum ckfs_code ckfs_model_note_meta_source(struct ckfs_model *m, const struct ckfs_source *s,
					   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Record a warning shown by inspect and export. */
enum ckfs_code ckfs_model_warn(struct ckfs_model *m, struct ckfs_error *err,
			       const char *fmt, ...) CKFS_PRINTF(3, 4);
/* config.json: --config (a file or a folder) or SRC/huggingface/; sets
 * hf_dir, config_path, config_access, config_json and tie_word_embeddings. */
enum ckfs_code ckfs_model_load_config(struct ckfs_model *m, const char *config_opt,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The same with the side-file folder hf (an arena string of m) in place of
 * SRC/huggingface: config.json is read from it unless config_opt is given. */
enum ckfs_code ckfs_model_load_config_from(struct ckfs_model *m, const char *hf,
					   const char *config_opt,
					   struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- placement.c ---- */

struct ckfs_chunk_list {
	struct ckfs_chunk_spec *v;
	size_t n, cap;
};

/* Append a copy of c (out->v grows as needed; the caller frees it). */
enum ckfs_code ckfs_chunk_list_push(struct ckfs_chunk_list *out, const struct ckfs_chunk_spec *c,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;

/*
 * The chunks one rank contributes for a state-dict entry: a plain tensor
 * is the whole tensor at offset 0; a ShardedTensor its local shard at its
 * offsets; a DTensor what its placements leave this mesh coordinate (none
 * when it is a copy along a Replicate() dim). Appends to out (malloc'd;
 * the caller frees out->v).
 */
enum ckfs_code ckfs_entry_chunks(const struct ckfs_sd_entry *e, const int64_t *coord,
				 uint32_t source, int rank, struct ckfs_chunk_list *out,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;

/*
 * The chunks mesh coordinate coord would contribute for the key of e (a
 * DTensor or a plain tensor of another rank, rank 0's here), foreseen
 * from e's global shape and placements: the same blocks (shape, global
 * offset) as ckfs_entry_chunks gives for that rank's own entry when it
 * agrees with e, with row-major strides and file positions from 0 that
 * the rank's own file replaces. ShardedTensors are refused.
 */
enum ckfs_code ckfs_entry_predict(const struct ckfs_sd_entry *e, const int64_t *coord,
				  uint32_t source, int rank, struct ckfs_chunk_list *out,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;

/* A box of a tensor: indices [lo, lo + n) of each of its dims, the first
 * ndrop of them (n[k] == 1: a layer or expert axis) removed from what is
 * cut. */
struct ckfs_box {
	int64_t lo[CKFS_MAX_DIMS];
	int64_t n[CKFS_MAX_DIMS];
	int ndrop;
};
/*
 * The elements of tensor r inside box (r's dims), as chunks appended to
 * out with the box start at dst (output dims, box->ndrop fewer). Each
 * chunk of r meeting the box gives one chunk.
 */
enum ckfs_code ckfs_chunks_box(struct ckfs_chunk_list *out, const struct ckfs_tensor *r,
			       const struct ckfs_box *box, const int64_t *dst,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- torch_guards.c ---- */

/*
 * The records of tf (opened with .derive_locals) whose local
 * headers were derived, as guards of s (include/ckfs/model.h), replacing
 * any it had; those a guard cannot hold are checked now. The checks'
 * function, for tables read back from the plan cache.
 */
enum ckfs_code ckfs_torch_guards(struct ckfs_source *s, const struct ckfs_torch_file *tf,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
ckfs_guard_fn ckfs_torch_guard_fn(void);

/* ---- plan_cache.c ---- */

/*
 * What checking m's sources found (n values of a layout's own meaning,
 * under `kind`), kept on disk under the identity of all of m's sources
 * (name, device, inode, size, mtime, ctime). load fills v and returns
 * true only when a record of exactly these sources and n values exists;
 * store writes one (failures are silent: a cache, not a promise).
 */
bool ckfs_plan_cache_load(const struct ckfs_model *m, const char *kind, uint64_t *v, size_t n);
/* The same for a record of any length from min: *v a new array of *n
 * values (the caller frees it) on a hit, NULL otherwise. */
bool ckfs_plan_cache_load_any(const struct ckfs_model *m, const char *kind, size_t min,
			      uint64_t **v, size_t *n);
void ckfs_plan_cache_store(const struct ckfs_model *m, const char *kind, const uint64_t *v,
			   size_t n);

/* ---- flat.c: tensors packed end to end in flat 1-D buffers ---- */

/* A stretch of a flat buffer one source holds contiguously: len elements
 * of dtype from file position pos. */
struct ckfs_flat_seg {
	uint32_t source;
	int rank;                  /* for messages and inspect */
	enum ckfs_dtype dtype;
	bool neg;
	uint64_t pos;
	uint64_t len;
};

/* Elements [first, first + count) of a tensor of shape (ndim, shape), in
 * row-major order. */
struct ckfs_elem_range {
	int ndim;
	const int64_t *shape;
	uint64_t first, count;
};
/*
 * The elements of el, held one after another in seg's source from file
 * position pos: appended to out as N-d blocks with the tensor's row-major
 * strides (a partial first row, whole rows, a partial last row, and the
 * same at each outer dim: at most 2·ndim − 1 chunks).
 */
enum ckfs_code ckfs_flat_blocks(const struct ckfs_elem_range *el,
				const struct ckfs_flat_seg *seg, uint64_t pos,
				struct ckfs_chunk_list *out,
				struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The stretch [at, at + el->count) of the flat buffer made of
 * segs[0..n_segs) end to end, holding the elements of el: the blocks of
 * every segment it crosses. The caller checks that the buffer is long
 * enough (CKFS_E_FORMAT otherwise). */
enum ckfs_code ckfs_flat_cut(const struct ckfs_flat_seg *segs, size_t n_segs, uint64_t at,
			     const struct ckfs_elem_range *el, struct ckfs_chunk_list *out,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- names.c ---- */

/*
 * The Hugging Face names of n torch state-dict keys (the one name rule of
 * the FSDP, DCP and Hugging Face layouts): wrapper segments
 * (_fsdp_wrapped_module, _checkpoint_wrapped_module, _orig_mod) removed
 * wherever they are, and a leading "module." when every key has it (DDP),
 * with one warning counting the names changed. names[i] is keys[i] itself
 * when unchanged, else an arena string of m. Refused, naming label (the
 * file that holds the keys): FSDP1 flat parameters (flat_param,
 * _flat_param), two different keys that become one name, a key that
 * becomes empty, and without in_memory (a safetensors file's names, not
 * the names a module holds as FSDP, DCP and DeepSpeed save them) PEFT
 * names.
 */
enum ckfs_code ckfs_hf_names(struct ckfs_model *m, const char *label, const char *const *keys,
			     const char **names, size_t n, bool in_memory,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;

/* verl's tie rule: drop lm_head.weight from m->tensors when config.json
 * ties the embeddings and the embedding it is tied to exists
 * (model.embed_tokens.weight, or model.language_model.embed_tokens.weight
 * held in memory), with a warning. */
enum ckfs_code ckfs_model_drop_tied(struct ckfs_model *m,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Does the dotted name have a segment equal to seg? */
int ckfs_name_has_segment(const char *name, const char *seg);
/* Does s begin with prefix, end with suffix? */
static inline int ckfs_starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}
static inline int ckfs_ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- hf_save.c, peft.c: names held in memory, as verl's merger saves them ---- */

/*
 * The tensors of a layout whose names a module holds in memory (FSDP, DCP,
 * DeepSpeed) made what verl's merger writes: a LoRA actor split into base
 * and adapter (peft.c), verl's tie rule, then save_pretrained's conversions
 * per model_type (vision-language prefixes, fused expert stacks; hf_save.c)
 * and the LoRA pairs fitted to their base weights (with --base, taken
 * from that model).
 */
enum ckfs_code ckfs_hf_save_names(struct ckfs_model *m, const struct ckfs_model_options *opt,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The name on disk of a name held in memory; held: the model's names hold
 * a vision-language model as transformers 5 does (ckfs_hf_held_as_vlm of
 * any of them). out may be name. */
enum ckfs_code ckfs_hf_save_name(const struct ckfs_model *m, const char *name, bool held,
				 char *out, size_t cap, struct ckfs_error *err) CKFS_WARN_UNUSED;
int ckfs_hf_held_as_vlm(const char *name);
/* The reverse: the name transformers 5 holds a module or tensor written as
 * disk by (for quantization_config's module lists). */
enum ckfs_code ckfs_hf_memory_name(const struct ckfs_model *m, const char *disk, char *out,
				   size_t cap, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Does m hold PEFT names (base_model.model. or lora_)? */
int ckfs_peft_names(const struct ckfs_model *m);
/* A LoRA actor's tensors split into base (renamed) and adapter (m->lora);
 * nothing for other models. */
enum ckfs_code ckfs_peft_split(struct ckfs_model *m, const struct ckfs_model_options *opt,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
/* After the renames: --base taken in, each adapter checked against its
 * base weight, and with --lora=fuse attached to it. */
enum ckfs_code ckfs_peft_finish(struct ckfs_model *m, const struct ckfs_model_options *opt,
				struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- fp8_select.c ---- */

/* --dtype fp8: the weights served block-quantized, their scale tensors and
 * the modules left as they are (struct ckfs_fp8_set's unconverted). */
enum ckfs_code ckfs_fp8_select(struct ckfs_model *m, const struct ckfs_model_options *opt,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
/* ---- fp8_release.c ---- */

/* The pass every model goes through before a quantizing view: a
 * checkpoint already quantized (F8 values beside scale tensors) is served
 * as stored without an asked --dtype (or with auto), DeepSeek's block FP8
 * dequantized to bf16, fp16 or fp32; anything else (quantizing it again
 * above all) is refused. */
enum ckfs_code ckfs_prequantized_pass(struct ckfs_model *m, const struct ckfs_model_options *opt,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The default of --quant-skip. */
extern const char ckfs_quant_default_skip[];
/* Whether t is a weight the quantized views quantize: a 2-D float
 * <module>.weight of a linear projection by its module's last name, not
 * matched by skip (shared by the quantizing views). */
int ckfs_quant_linear(const struct ckfs_tensor *t, const regex_t *skip);
/* The skip pattern of the quantized views (--quant-skip, or the default)
 * compiled into *skip (regfree it). */
enum ckfs_code ckfs_quant_skip(const struct ckfs_model_options *opt, regex_t *skip,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- ct_select.c ---- */

/* --dtype w4a16, nvfp4: each weight ckfs_quant_linear picks replaced by
 * its compressed-tensors scheme's tensors (the view's struct
 * ckfs_ct_scheme), the Linear modules left bf16 listed (struct
 * ckfs_ct_set's ignore); a weight whose input dim is not a multiple of
 * the group refused. */
enum ckfs_code ckfs_ct_select(struct ckfs_model *m, const struct ckfs_model_options *opt,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- outputs.c: output tensors under construction ---- */

/* A tensor a reader cuts from its sources, as it collects its chunks. The
 * sort keys are for readers that order their outputs (megatron_dist.c). */
struct ckfs_out {
	const char *name;          /* arena string of the model */
	const char *placement;     /* for inspect */
	enum ckfs_dtype dtype;     /* CKFS_DTYPE_INVALID until a chunk sets it */
	int ndim;
	int64_t shape[CKFS_MAX_DIMS];
	struct ckfs_chunk_list chunks;
	int group;                 /* sort keys */
	long layer;
	int order;
};
struct ckfs_outs {
	struct ckfs_out *v;
	size_t n, cap;
};
/* What a new output is: the fields of struct ckfs_out but its chunks. */
struct ckfs_out_spec {
	const char *name;          /* copied into the model's arena */
	const char *placement;
	enum ckfs_dtype dtype;
	int ndim;
	const int64_t *shape;
	int group;                 /* sort keys */
	long layer;
	int order;
};
/* A new output as s says, appended to l: NULL with err set when out of
 * memory. Pointers into l move on the next add. */
struct ckfs_out *ckfs_outs_add(struct ckfs_model *m, struct ckfs_outs *l,
			       const struct ckfs_out_spec *s, struct ckfs_error *err);
void ckfs_outs_release(struct ckfs_outs *l);
/* t's dtype and shape: stored and served as dtype (ckfs_model_open applies
 * --dtype later, to the whole model), its element count; false when that
 * overflows. */
bool ckfs_tensor_set(struct ckfs_tensor *t, enum ckfs_dtype dtype, int ndim,
		     const int64_t *shape);
/* l's outputs as m's tensors, in l's order (ckfs_tensor_set), each validated
 * (ckfs_plan_validate_tensor; a failure is prefixed with label). */
enum ckfs_code ckfs_outs_to_model(struct ckfs_model *m, const struct ckfs_outs *l,
				  const char *label, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* The part of tensor r inside box as the tensor *out named name (copied
 * into m's arena), without the box's dropped dims, validated. */
enum ckfs_code ckfs_tensor_cut(struct ckfs_model *m, const struct ckfs_tensor *r,
			       const struct ckfs_box *box, const char *name,
			       struct ckfs_tensor *out, struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- megatron_vocab.c: what both Megatron readers share ---- */

/* The model config.json describes, as the Megatron readers need it. */
struct ckfs_megatron_arch {
	int64_t hidden, nh, nkv, head_dim, ffn, vocab, n_layers;
	int64_t n_experts;   /* num_experts, num_local_experts or n_routed_experts;
			      * 0: dense */
	int64_t expert_ffn;  /* an expert's width (moe_intermediate_size;
			      * Mixtral: intermediate_size) */
	int64_t shared_ffn;  /* shared_expert_intermediate_size (Qwen2-MoE), or
			      * n_shared_experts x moe_intermediate_size */
	bool mixtral;        /* block_sparse_moe.gate, experts.{e}.w1 w3 w2 */
	bool qwen2_moe;      /* mlp.shared_expert.*, mlp.shared_expert_gate */
	bool deepseek_moe;   /* DeepSeek-V2/V3, Kimi-K2, GLM-4.5: mlp.shared_experts.*
			      * (no gate), MTP layers as model.layers.{L + i} */
	bool mla;            /* multi-head latent attention (kv_lora_rank > 0) */
	int64_t q_lora, kv_lora, qk_nope, qk_rope, v_dim; /* MLA's widths */
	int64_t mtp_layers;  /* num_nextn_predict_layers; -1 when absent */
};
/* Read from m's config.json; integer values must be whole numbers from 0
 * to 2^31, and the attention shape complete and consistent. */
enum ckfs_code ckfs_megatron_arch(const struct ckfs_model *m, struct ckfs_megatron_arch *a,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* config.json's key for an expert's width, for messages. */
const char *ckfs_megatron_expert_width_key(const struct ckfs_megatron_arch *a);

/* What a layer-local Megatron key is. */
enum ckfs_megatron_part {
	MG_REPLICATED,       /* whole on every TP rank: norms, biases, router */
	MG_ROW,              /* row-parallel: split on its last dim over TP */
	MG_QKV,              /* fused [q; k; v] per query group */
	MG_FC1,              /* SwiGLU [gate; up] */
	MG_ROUTER,           /* the MoE router (TP-replicated), named per model */
	MG_SHARED_FC1,       /* the shared expert's (Qwen2-MoE) [gate; up], */
	MG_SHARED_ROW,       /* its fc2 */
	MG_SHARED_REPLICATED,/* and its gate */
	MG_COL,              /* column-parallel: split on dim 0 over TP */
	MG_COL_OR_DUP,       /* MLA's down projections: split on dim 0
			      * (ColumnParallelLinear) or whole on every TP
			      * rank (Transformer Engine's duplicated TELinear) */
};
/* Output order slots inside a layer past those of the dense keys: the
 * router, the shared expert, an MTP layer's own tensors, then three per
 * expert. MLA's attention takes slots 0 to 5 (no linear_qkv there). */
enum { MG_ORDER_ROUTER = 18, MG_ORDER_SHARED = 20, MG_ORDER_MTP = 24, MG_ORDER_EXPERTS = 32 };
struct ckfs_megatron_key {
	const char *mg;      /* after "decoder.layers.<N>." (MTP: "mtp.layers.<i>.") */
	const char *hf;      /* the Hugging Face name after "model.layers.<N>." (MG_QKV:
			      * "weight"/"bias"; MG_FC1 and MG_SHARED_FC1: the module) */
	enum ckfs_megatron_part part;
	int order;           /* slot inside the layer (a QKV takes 3, fc1 2) */
	int family;          /* MGF_*: the models the key belongs to */
};
enum { MGF_ANY, MGF_GQA, MGF_MLA, MGF_QWEN2_SHARED, MGF_DEEPSEEK_SHARED };
/* MTP layers past this many are refused (DeepSeek-V3 and GLM-4.5 have 1). */
#define CKFS_MEGATRON_MAX_MTP 16
/* The entry for a layer-local suffix, or NULL when it is not one ckfs maps
 * for this model. */
const struct ckfs_megatron_key *ckfs_megatron_layer_entry(const struct ckfs_megatron_arch *a,
							  const char *rest);
/* "decoder.layers.<N>.<rest>" (*layer = N) or, stacked, "decoder.layers.
 * <rest>" (*layer = -1): 1; 0 for other keys. */
int ckfs_megatron_layer_key(const char *key, long *layer, const char **rest);
/* The global [rows, cols] k's tensor must have (MLA's projections, MTP's
 * eh_proj): 1; 0 when the key has no such check. */
int ckfs_megatron_global_shape(const struct ckfs_megatron_arch *a,
			       const struct ckfs_megatron_key *k, int64_t shape[2]);
/* "mtp.layers.<i>.<rest>": 1 with *i; *rest is the key inside the MTP
 * layer's transformer layer ("mtp_model_layer." or, in sharded keys and
 * older releases, "transformer_layer." taken off; *inner = 1) or an MTP
 * layer's own key (*inner = 0). 0 for other keys. */
int ckfs_megatron_mtp_key(const char *key, long *i, const char **rest, int *inner);
/* An MTP layer's own key (enorm, hnorm, eh_proj, final_layernorm), or NULL. */
const struct ckfs_megatron_key *ckfs_megatron_mtp_entry(const struct ckfs_megatron_arch *a,
							const char *rest);
/* What an MTP layer serves of the model's own tensors, under DeepSeek-V3's
 * names: its embedding and output layer (Megatron's MTP shares both). */
extern const struct ckfs_megatron_key ckfs_megatron_mtp_embed, ckfs_megatron_mtp_head;
/* The MTP layers found (n, numbered 0 .. n - 1) against config.json's
 * num_nextn_predict_layers: a different count is refused, an absent one
 * or MTP-less checkpoint of an MTP config said in a warning. */
enum ckfs_code ckfs_megatron_check_mtp(struct ckfs_model *m, const struct ckfs_megatron_arch *a,
				       long n, const char *where,
				       struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The Hugging Face name of a key outside the layers (embedding, final
 * norm, output layer), or NULL. */
const char *ckfs_megatron_top_name(const char *key);
/* The Hugging Face name of part `part` of key k in `layer` (MG_QKV: 0 q,
 * 1 k, 2 v; MG_FC1, MG_SHARED_FC1: 0 gate, 1 up; else 0). */
void ckfs_megatron_name(const struct ckfs_megatron_arch *a, long layer,
			const struct ckfs_megatron_key *k, int part, char *out, size_t cap);
/* Expert `expert` of `layer`: which 0 gate (w1), 1 up (w3), 2 down (w2). */
void ckfs_megatron_expert_name(const struct ckfs_megatron_arch *a, long layer, int64_t expert,
			       int which, char *out, size_t cap);
/* Keys not understood: the first few listed for the error. */
struct ckfs_megatron_unknown {
	char list[1024];
	size_t n;
};
void ckfs_megatron_unknown(struct ckfs_megatron_unknown *u, const char *key);
/* CKFS_OK when none, else the error naming `where` and the keys. */
enum ckfs_code ckfs_megatron_unknown_fail(const struct ckfs_megatron_unknown *u,
					  const char *where,
					  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Megatron's tie rule, applied while its keys are mapped (the head never
 * becomes a tensor): output_layer is left out when config.json ties the
 * embeddings, saying so. */
enum ckfs_code ckfs_megatron_warn_tied(struct ckfs_model *m,
				       struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- the layouts: one row each (include/ckfs/layouts.h), table.c lists them ---- */

/* The rows, in their files: verl FSDP rank files (fsdp.c), legacy Megatron
 * per-rank files (megatron.c), Megatron dist_checkpointing (megatron_dist.c),
 * torch.distributed.checkpoint (dcp.c), DeepSpeed ZeRO (deepspeed.c, its
 * files found by deepspeed_files.c), Hugging Face safetensors (hf.c). */
extern const struct ckfs_layout ckfs_layout_fsdp, ckfs_layout_megatron,
	ckfs_layout_megatron_dist, ckfs_layout_dcp, ckfs_layout_deepspeed, ckfs_layout_hf;

/* The first layout of the table that claims dir into *out: 1; 0 when none
 * does; -1 (errno set) when a detect cannot tell (table.c). */
int ckfs_layout_find(const char *dir, const struct ckfs_file_policy *pol,
		     const struct ckfs_layout **out);
/* The error for a folder no layout claims (src: as the user named it),
 * listing what each looked for. */
enum ckfs_code ckfs_layout_not_found(const char *dir, const char *src, struct ckfs_error *err);
/* For detects: does dir hold a name match() accepts? 1, 0, or -1 (errno
 * set) when dir cannot be listed. */
int ckfs_dir_has(const char *dir, bool (*match)(const char *name));

/* ---- facts.c: for describes ---- */

struct ckfs_strbuf;
/* Append a fact: the text line (label NULL: none; text's buffer becomes
 * the fact's, a failed one is out of memory) and the JSON member key:
 * value (key NULL: none; value taken, NULL with a key: out of memory). */
enum ckfs_code ckfs_facts_add(struct ckfs_facts *f, const char *label, struct ckfs_strbuf *text,
			      const char *key, struct cJSON *value,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* o when ok, else NULL (o freed): for values built with calls that fail
 * on want of memory. */
struct cJSON *ckfs_facts_json(struct cJSON *o, bool ok);
/* The "layout" line: "<name>, N source files", then ", saved by W ranks"
 * when saved_by and the world size is known. */
enum ckfs_code ckfs_facts_layout_line(struct ckfs_facts *f, const struct ckfs_model *m,
				      bool saved_by, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The describe of layouts whose metadata says how many ranks saved them
 * (dcp, megatron-dist): the layout line, "saved by W ranks" included. */
enum ckfs_code ckfs_facts_saved_by(const struct ckfs_model *m, struct ckfs_facts *f,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* A device mesh as inspect --json shows it: {"shape", "dim_names"} (a
 * name NULL: null); NULL when out of memory. */
struct cJSON *ckfs_facts_mesh_json(int ndim, const int64_t *shape, const char *const *names);

/* ---- what one layout's files offer the others: fsdp.c, dcp.c, deepspeed_files.c ---- */

/* What a file name says about verl FSDP rank files. Every name matching
 * model_world_size_*_rank_*.pt is a rank file name, and it must spell both
 * numbers as verl does (plain decimals: no sign, no leading zero, no other
 * characters), a world size from 1, both within CKFS_MAX_RANKS. */
enum ckfs_rank_name {
	CKFS_RANK_NAME_NONE,     /* not model_world_size_*_rank_*.pt */
	CKFS_RANK_NAME_OK,       /* as verl writes it; ws and rank set */
	CKFS_RANK_NAME_RESPELT,  /* readable but signed or zero-padded: ws
				  * and rank hold the values, why the cause */
	CKFS_RANK_NAME_BAD,      /* a number that is not one, too large, or a
				  * world size of 0: why says which */
};
struct ckfs_rank_file {
	long ws, rank;
	bool over_limit;         /* BAD because a number is too large */
	char why[160];           /* the cause, for RESPELT and BAD */
};
/* Detection and the rank scan (fsdp.c) use this one parser. */
enum ckfs_rank_name ckfs_fsdp_rank_file_name(const char *name, struct ckfs_rank_file *out);
/* torch.distributed.checkpoint (dcp.c) from .metadata bytes already in
 * memory (the fuzz target). */
enum ckfs_code ckfs_dcp_build_from(struct ckfs_model *m,
				   const struct ckfs_model_options *opt,
				   const char *bytes, size_t len,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* A DCP folder to read raw: where it is, which FQNs to read, and what
 * the read skipped. */
struct ckfs_dcp_raw {
	const char *dir;
	const char *rel_dir;          /* dir relative to SRC; NULL: SRC */
	int (*keep)(const char *fqn); /* NULL: every FQN */
	size_t n_left_out;            /* set: FQNs keep refused */
	size_t n_bytes;               /* set: bytes entries skipped */
};
/* The tensors of the DCP folder raw->dir under their FQNs, with global
 * shapes and chunks, into m->tensors: no renaming, config or tie rule.
 * For megatron_dist.c. */
enum ckfs_code ckfs_dcp_read_raw(struct ckfs_model *m, struct ckfs_dcp_raw *raw,
				 const struct ckfs_model_options *opt,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The files of a DeepSpeed checkpoint's step folder (deepspeed_files.c). */
struct ckfs_ds_files {
	const char *step;          /* the step folder (an arena string of the model) */
	const char *step_rel;      /* it relative to SRC: "" or "<tag>/" */
	const char *tag;           /* the tag SRC/latest names; NULL: SRC is the step folder */
	/* file names by rank, malloc'd, NULL where absent */
	char **optim;              /* [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt */
	char **model_rank;         /* zero_pp_rank_R_mp_rank_00_model_states.pt (ZeRO-3) */
	char *model_all;           /* mp_rank_00_model_states.pt (ZeRO-1/2) */
	long n_optim, n_model_rank;
	int ws, stage;             /* set by the caller for ckfs_ds_check_files */
};
/* The step folder of m->src_dir (SRC, or the tag in SRC/latest) and its
 * DeepSpeed files; refused: files ckfs does not read,
 * two files of one rank, no optimizer file. */
enum ckfs_code ckfs_ds_find_files(struct ckfs_model *m, struct ckfs_ds_files *f,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Every rank 0 .. f->ws-1 has its optimizer file and none past it, and the
 * model states files are those of f->stage (0: BF16_Optimizer). */
enum ckfs_code ckfs_ds_check_files(const struct ckfs_ds_files *f,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The name DeepSpeed gives rank r's optimizer file (bf16_ as the others). */
void ckfs_ds_optim_name(const struct ckfs_ds_files *f, long r, char *out, size_t size);
void ckfs_ds_files_release(struct ckfs_ds_files *f);
/* DeepSpeed's detect: SRC or one of its folders (a step folder beside
 * `latest`) holds a DeepSpeed *_model_states.pt or *_optim_states.pt name. */
int ckfs_ds_detect(const char *dir, const struct ckfs_file_policy *pol);

#endif
