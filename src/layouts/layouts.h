/* SPDX-License-Identifier: MIT */
/* Shared inside src/layouts only: helpers of the layout readers. */
#ifndef CKFS_LAYOUTS_INT_H
#define CKFS_LAYOUTS_INT_H

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
	struct ckfs_chunk *v;
	size_t n, cap;
};

/* Append a copy of c (out->v grows as needed; the caller frees it). */
enum ckfs_code ckfs_chunk_list_push(struct ckfs_chunk_list *out, const struct ckfs_chunk *c,
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
 * becomes empty, and names not read yet (names.c): PEFT names, and with
 * in_memory (names a module holds, FSDP and DCP; not a safetensors file's)
 * transformers 5's fused expert stacks and vision-language prefixes.
 */
enum ckfs_code ckfs_hf_names(struct ckfs_model *m, const char *label, const char *const *keys,
			     const char **names, size_t n, bool in_memory,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;

/* ---- layouts: detect.c detects, one builder per layout fills m ---- */

/* verl FSDP rank files (fsdp.c). */
enum ckfs_code ckfs_fsdp_build(struct ckfs_model *m,
			       const struct ckfs_model_options *opt,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
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
/* Detection (detect.c) and the rank scan (fsdp.c) use this one parser. */
enum ckfs_rank_name ckfs_fsdp_rank_file_name(const char *name, struct ckfs_rank_file *out);
/* torch.distributed.checkpoint: SRC/.metadata and __R_I.distcp (dcp.c). */
enum ckfs_code ckfs_dcp_build(struct ckfs_model *m,
			      const struct ckfs_model_options *opt,
			      struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The same from .metadata bytes already in memory (the fuzz target). */
enum ckfs_code ckfs_dcp_build_from(struct ckfs_model *m,
				   const struct ckfs_model_options *opt,
				   const char *bytes, size_t len,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The tensors of the DCP folder dir (SRC/rel_dir) under their FQNs, with
 * global shapes and chunks, into m->tensors: no renaming, config or tie
 * rule. FQNs keep() refuses are not read (*n_left_out counts them), bytes
 * entries are skipped (*n_bytes). For megatron_dist.c. */
enum ckfs_code ckfs_dcp_read_raw(struct ckfs_model *m, const char *dir, const char *rel_dir,
				 const struct ckfs_model_options *opt,
				 int (*keep)(const char *fqn), size_t *n_left_out,
				 size_t *n_bytes, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Legacy Megatron per-rank torch.save files: SRC/model/mp_rank_TT[_PPP]/
 * model.pt (megatron.c). detect: SRC/model holds an mp_rank_* folder. */
int ckfs_megatron_detect(const char *src_dir);
enum ckfs_code ckfs_megatron_build(struct ckfs_model *m,
				   const struct ckfs_model_options *opt,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Megatron-Core dist_checkpointing (torch_dist) folders as verl writes
 * them: SRC/dist_ckpt, SRC/model/dist_ckpt (ckpt_contents.json) or SRC
 * itself (megatron_dist.c). detect: one of them is there. */
int ckfs_megatron_dist_detect(const struct ckfs_model *m);
enum ckfs_code ckfs_megatron_dist_build(struct ckfs_model *m,
				     const struct ckfs_model_options *opt,
				     struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Hugging Face safetensors weights in dir (SRC, SRC/huggingface or
 * SRC/model/huggingface), served as they are (hf.c). */
enum ckfs_code ckfs_hf_build(struct ckfs_model *m,
			     const struct ckfs_model_options *opt,
			     const char *dir,
			     struct ckfs_error *err) CKFS_WARN_UNUSED;
/* verl's tie rule: drop lm_head.weight from m->tensors when config.json
 * says tie_word_embeddings and model.embed_tokens.weight exists (with a
 * warning). */
enum ckfs_code ckfs_model_drop_tied(struct ckfs_model *m,
				    struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
