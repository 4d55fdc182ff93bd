/* SPDX-License-Identifier: MIT */
/* Internal to the GGUF view (src/folder/gguf*.c). */
#ifndef CKFS_FOLDER_GGUF_INT_H
#define CKFS_FOLDER_GGUF_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckfs/gguf.h"
#include "ckfs/strbuf.h"

struct cJSON;

/* GGUF's value types, by their numbers in the file. */
enum gguf_value {
	GGUF_UINT32 = 4, GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7,
	GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10,
};

/* Key-values as bytes, in the order they are added (gguf_kv.c). */
struct gguf_kv {
	struct ckfs_strbuf b;
	uint64_t n;
};

void gguf_put_u32(struct ckfs_strbuf *b, uint32_t v);
void gguf_put_u64(struct ckfs_strbuf *b, uint64_t v);
void gguf_put_str(struct ckfs_strbuf *b, const char *s, size_t len);
void gguf_kv_str(struct gguf_kv *kv, const char *key, const char *val);
void gguf_kv_u32(struct gguf_kv *kv, const char *key, uint32_t val);
void gguf_kv_i32(struct gguf_kv *kv, const char *key, int32_t val);
void gguf_kv_f32(struct gguf_kv *kv, const char *key, float val);
void gguf_kv_bool(struct gguf_kv *kv, const char *key, bool val);
/* An array's key and head; its n elements are put by the caller. */
void gguf_kv_array(struct gguf_kv *kv, const char *key, enum gguf_value type, uint64_t n);

/* The text of the checkpoint's side file `name` (huggingface/), read
 * under the model's file policy and recorded in g->from: CKFS_OK with
 * *text NULL when it does not exist. */
enum ckfs_code gguf_side_file(const struct ckfs_model *m, struct ckfs_gguf_file *g,
			      const char *name, size_t max, char **text, size_t *len,
			      struct ckfs_error *err);
/* The same, parsed as a JSON object (*obj NULL when absent). */
enum ckfs_code gguf_side_json(const struct ckfs_model *m, struct ckfs_gguf_file *g,
			      const char *name, struct cJSON **obj, struct ckfs_error *err);

/* The tokenizer's key-values (gguf_vocab.c): SentencePiece's
 * tokenizer.model, or without one (or with bpe_only: an architecture the
 * converter reads as GPT-2 BPE alone) tokenizer.json (gguf_bpe.c); the
 * special token ids of config.json and the add_* flags and chat template
 * of tokenizer_config.json, as the converter writes them for n_vocab
 * tokens. */
enum ckfs_code gguf_vocab(const struct ckfs_model *m, struct ckfs_gguf_file *g,
			  const struct cJSON *config, int64_t n_vocab, bool llama, bool bpe_only,
			  struct gguf_kv *kv, struct ckfs_error *err);

/* A MoE architecture's experts (gguf_moe.c). */
struct gguf_moe {
	const char *arch; /* general.architecture */
	bool norm_topk;   /* llama.cpp renormalizes top-k weights */
	bool shared;      /* Qwen2-MoE's gated shared expert */
	int64_t n_expert, n_used, ff, shexp_ff, n_layers;
	int64_t first_moe;               /* layers below it are dense (DeepSeek) */
	const struct ckfs_tensor **slot; /* [layer][down, gate, up][expert] */
	int64_t *seen;                   /* expert weights seen per layer */
};

/* config.json's expert keys (all given, as the converter would otherwise
 * write transformers' defaults), the dense-layer and norm_topk_prob
 * refusals; x's arch, norm_topk and shared are set by the caller. */
enum ckfs_code gguf_moe_config(struct gguf_moe *x, const struct cJSON *config, const char *path,
			       int64_t n_layers, struct ckfs_arena *ar, struct ckfs_error *err);
/* x's slots for n_layers layers (n_expert set). */
enum ckfs_code gguf_moe_alloc(struct gguf_moe *x, int64_t n_layers, struct ckfs_arena *ar,
			      struct ckfs_error *err);
/* t, when it is one expert's weight: recorded, 1; 2 when its layer's are
 * now all seen (*layer says which); 0 for any other tensor. */
int gguf_moe_take(struct gguf_moe *x, const struct ckfs_tensor *t, int64_t *layer);
/* A complete layer's stack w (0 down, 1 gate, 2 up) into o: name, sources
 * and row layout; the experts' shapes must agree. */
enum ckfs_code gguf_moe_stack(const struct gguf_moe *x, int64_t layer, int w,
			      struct ckfs_gguf_tensor *o, struct ckfs_arena *ar,
			      struct ckfs_error *err);
/* Every layer's expert weights were all seen. */
enum ckfs_code gguf_moe_complete(const struct gguf_moe *x, struct ckfs_error *err);
/* The key-values in the converter's order: expert_count and
 * expert_used_count (after the rms epsilon), then the expert and shared
 * expert feed-forward lengths (after general.file_type). */
void gguf_moe_counts(const struct gguf_moe *x, struct gguf_kv *kv);
void gguf_moe_lengths(const struct gguf_moe *x, struct gguf_kv *kv);

/* DeepSeek's MLA and MoE hyperparameters (gguf_mla.c: deepseek2). */
struct gguf_mla {
	int64_t q_lora, kv_lora, nope, rope, v_head; /* q_lora -1: q_proj */
	int64_t n_shared, n_group, topk_group;
	double scale;       /* routed_scaling_factor */
	bool norm, sigmoid; /* norm_topk_prob; scoring_func "sigmoid" */
	/* YaRN (rope_parameters): yarn set, its keys as given (NULL: absent) */
	bool yarn;
	double factor, orig_ctx;
	const struct cJSON *ext, *attn, *beta_fast, *beta_slow, *mscale_all;
};

/* config.json's MLA and expert keys, all given (the converter would
 * write transformers' defaults otherwise), its rope (default or YaRN),
 * and what llama.cpp would run otherwise than transformers refused;
 * moe's experts set up. */
enum ckfs_code gguf_mla_config(struct gguf_mla *x, struct gguf_moe *moe, const struct cJSON *c,
			       const char *path, int64_t n_layers, struct ckfs_arena *ar,
			       struct ckfs_error *err);
/* YaRN's keys, after head_count_kv (nothing for the default rope). */
void gguf_mla_kv_rope(const struct gguf_mla *x, struct gguf_kv *kv);
/* The key-values after the rms epsilon (experts, groups, gating, the
 * MQA key and value lengths) and after general.file_type. */
void gguf_mla_kv_experts(const struct gguf_mla *x, const struct gguf_moe *moe, struct gguf_kv *kv);
void gguf_mla_kv_rest(const struct gguf_mla *x, const struct gguf_moe *moe, int64_t n_vocab,
		      struct gguf_kv *kv);
/* kv_b_proj t ([heads * (nope + v_head), kv_lora]) as attn_k_b and
 * attn_v_b of layer into o[0], o[1] (names, sources, row layout). */
enum ckfs_code gguf_mla_split(const struct gguf_mla *x, const struct ckfs_tensor *t, int64_t layer,
			      int64_t heads, struct ckfs_gguf_tensor o[2], struct ckfs_arena *ar,
			      struct ckfs_error *err);

/* The byte-level BPE path (gguf_bpe.c): tokenizer.json (text, len, read
 * from path) with tokenizer_config.json (tc, NULL if absent) as
 * _set_vocab_gpt2 and SpecialVocab write it. */
enum ckfs_code gguf_bpe_vocab(const struct ckfs_model *m, struct ckfs_gguf_file *g,
			      const struct cJSON *config, const struct cJSON *tc, int64_t n_vocab,
			      const char *path, const char *text, size_t len, struct gguf_kv *kv,
			      struct ckfs_error *err);
/* tokenizer.ggml.pre of tokenizer.json as the converter names it, by the
 * hash of its ids for chktxt (gguf_pre.c); refused, naming path, when
 * the pipeline is not one ckfs runs or the hash is not in its table. */
struct gguf_bpe_seen {
	bool qwen2_regex; /* Qwen2's Split regex (else Llama 3's or DeepSeek-V3's) */
	bool nfc;         /* an NFC normalizer (else none) */
	bool bos;         /* a template putting a BOS first */
	bool ignore_merges;
};
/* tc: tokenizer_config.json (NULL: none), whose tokenizer_class can
 * change the post-processor. */
enum ckfs_code gguf_bpe_pre(const char *path, const struct cJSON *tok, const struct cJSON *tc,
			    const char **pre, struct gguf_bpe_seen *seen, struct ckfs_error *err);
void gguf_sha256_hex(const void *data, size_t len, char hex[65]);
/* The pre-tokenizer's pieces of text (code point counts into lens, which
 * holds one per code point); -1 for a regex not run (tests). */
ssize_t gguf_bpe_split(const char *regex, const char *text, size_t *lens);
/* Added tokens the converter makes CONTROL although not special, and
 * SentencePiece's U+2581 made spaces (in ar) (gguf_vocab.c). */
bool gguf_looks_special(const char *t);
const char *gguf_spaces(struct ckfs_arena *ar, const char *text, size_t *len);

#endif
