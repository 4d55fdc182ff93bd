/* SPDX-License-Identifier: MIT */
/*
 * The checkpoint layouts ckfs reads (src/layouts/): the one entry point
 * that detects a folder's layout and fills a struct ckfs_model
 * (include/ckfs/model.h) with its tensors as chunks of its files, reading
 * metadata only. Detection order and every layout's rules:
 * docs/formats.md.
 */
#ifndef CKFS_LAYOUTS_H
#define CKFS_LAYOUTS_H

#include <stdbool.h>

#include "ckfs/dtype.h"
#include "ckfs/err.h"
#include "ckfs/model.h"

/* When a verl FSDP actor's ranks other than rank 0 are checked (mount's
 * -o rank_checks): all at open (every command but mount), or after it,
 * by a thread, before any tensor byte is served (read), or read when
 * there are many entries to check (auto: mount's default). */
enum ckfs_rank_checks {
	CKFS_RANK_CHECKS_OPEN,
	CKFS_RANK_CHECKS_READ,
	CKFS_RANK_CHECKS_AUTO,
};

/* A view quantizing the linear weights (--dtype fp8, w4a16, nvfp4): its
 * selector in src/layouts/ picks the weights, its row in src/model/
 * serves them. */
enum ckfs_quant {
	CKFS_QUANT_NONE,
	CKFS_QUANT_FP8,   /* block-wise float8_e4m3fn: fp8_select.c */
	CKFS_QUANT_W4A16, /* compressed-tensors' pack-quantized INT4: ct_select.c */
	CKFS_QUANT_NVFP4, /* compressed-tensors' nvfp4-pack-quantized */
};

struct ckfs_model_options {
	/* What --dtype asks: every tensor as out_dtype, or with as_stored
	 * (--dtype auto) each as its layout serves it; with quant, that view
	 * of the linear weights and out_dtype (bf16) for the rest. Neither a
	 * dtype nor as_stored (options left zero) is refused. */
	enum ckfs_dtype out_dtype;
	bool as_stored;
	enum ckfs_quant quant;
	/* out_dtype is the command's default, not asked for: a block-FP8
	 * release (DeepSeek-V3's) is then served as stored, scales and all;
	 * asked, it is dequantized to out_dtype (src/layouts/fp8_release.c). */
	bool dtype_is_default;
	/* --config: a config.json, or a folder holding one; NULL for the
	 * checkpoint's huggingface/config.json. */
	const char *config_path;
	/* --follow-symlinks: serve files whose symlinks lead outside the
	 * checkpoint folder (refused by default: include/ckfs/file.h). */
	bool follow_symlinks;
	/* --raw-names: serve Megatron keys without a Hugging Face name under
	 * their own names, one tensor per rank (megatron.c raw_key); refused
	 * otherwise. */
	bool raw_names;
	/* LoRA actors (src/layouts/peft.c): what to serve (--lora), the
	 * folder of base weights of an adapter-only checkpoint (--base, NULL
	 * without), lora_alpha when the checkpoint does not record it or
	 * records it wrongly (--lora-alpha; 0: as recorded) and rsLoRA
	 * scaling, alpha / sqrt(r) (--rslora). */
	enum ckfs_lora_mode lora;
	const char *base_path;
	int64_t lora_alpha;
	bool rslora;
	/* --quant-skip: weights a quantizing view leaves unquantized, a POSIX
	 * extended regular expression against the served names; NULL for the
	 * default (vision towers; src/layouts/fp8_select.c). */
	const char *quant_skip;
	/* Default CKFS_RANK_CHECKS_OPEN. */
	enum ckfs_rank_checks rank_checks;
};

/* What ckfs_model_open does after a layout's build, by its flags. */
enum ckfs_layout_flags {
	/* Its tensors carry the names a module holds in memory (torch
	 * state-dict keys): made what verl's merger writes (the LoRA split,
	 * the tie rule, save_pretrained's conversions, --base: hf_save.c). */
	CKFS_LAYOUT_HELD_NAMES = 1u << 0,
	/* Its sources are rank files, each a whole torch.save zip (ckfs verify
	 * re-reads their records). */
	CKFS_LAYOUT_RANK_ZIPS = 1u << 1,
};

struct cJSON;

/* One thing a layout says of a model beyond its tensors, for ckfs inspect:
 * a line of its text ("<label>  <text>"), a member of its JSON object
 * ("<key>": value), or both. */
struct ckfs_fact {
	const char *label;      /* NULL: JSON only */
	char *text;             /* malloc'd; NULL: JSON only */
	const char *key;        /* NULL: text only */
	struct cJSON *value;    /* the list's until taken (set to NULL) */
};
struct ckfs_facts {
	struct ckfs_fact *v;
	size_t n, cap;
};

/*
 * A checkpoint layout: one row of the table src/layouts/table.c keeps in
 * detection order (docs/formats.md, "Which layout a folder has"); the
 * first row whose detect claims a folder reads it. ckfs_model_open, the
 * run scanner (a global_step_<N> folder a layout claims is a checkpoint,
 * not a step) and the message for a folder no row claims all ask the
 * table.
 */
struct ckfs_layout {
	const char *name;       /* as inspect shows it: "verl-fsdp", "hf", ... */
	const char *what;       /* for that message: "a verl FSDP checkpoint" */
	const char *looks_for;  /* what detect looks for: "model_world_size_*_rank_*.pt files" */
	/* 1 when dir holds this layout, 0 when not, -1 (errno set) when that
	 * cannot be known (dir cannot be listed, out of memory). Names and
	 * stat(2) only, but for verl's manifest ckpt_contents.json (read
	 * under pol), which says which of two layouts a folder holds. */
	int (*detect)(const char *dir, const struct ckfs_file_policy *pol);
	/* Fill m (src_dir, policy and layout set): sources, config, the
	 * tensors served as --dtype auto serves them, each validated;
	 * ckfs_model_open does the rest (flags). */
	enum ckfs_code (*build)(struct ckfs_model *m, const struct ckfs_model_options *opt,
				struct ckfs_error *err);
	/* The "layout" line and the layout's own facts (m->layout_info, which
	 * only it reads); NULL: the layout line alone ("<name>, N source
	 * files"). */
	enum ckfs_code (*describe)(const struct ckfs_model *m, struct ckfs_facts *f,
				   struct ckfs_error *err);
	unsigned flags;         /* enum ckfs_layout_flags */
};

/* Open SRC: a verl actor/critic folder (FSDP rank files, legacy Megatron
 * model/mp_rank_*, or a Megatron dist_ckpt), a torch.distributed.checkpoint
 * folder, a DeepSpeed ZeRO checkpoint or a folder of Hugging Face
 * safetensors weights: the layout found (src/layouts/table.c), its build,
 * then, once for every layout (src/layouts/open.c), the names by its
 * flags, --base, the dtype rule, --dtype fp8, the model's validation and
 * any deferred checks. On success *out is a new model the caller frees
 * with ckfs_model_free. */
enum ckfs_code ckfs_model_open(const char *src,
			       const struct ckfs_model_options *opt,
			       struct ckfs_model **out,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
/* m's layout as facts (its row's describe), in the order inspect shows
 * them: the "layout" line first, "mesh" last (empty for layouts that
 * record none: inspect --json has always had it). The caller releases
 * *out with ckfs_facts_release. */
enum ckfs_code ckfs_model_describe(const struct ckfs_model *m, struct ckfs_facts *out,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_facts_release(struct ckfs_facts *f);
/* What ckfs_model_open does after m->layout's build (for builds called
 * directly: the fuzzers). */
enum ckfs_code ckfs_model_finish(struct ckfs_model *m, const struct ckfs_model_options *opt,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The plan cache's folder into out ($CKFS_PLAN_CACHE, else
 * $XDG_CACHE_HOME/ckfs/plans, else ~/.cache/ckfs/plans; made 0700 when
 * missing): 1, or 0 when there is none (CKFS_PLAN_CACHE=off). */
int ckfs_plan_cache_dir(char *out, size_t size);

#endif
