/* SPDX-License-Identifier: MIT */
/*
 * A checkpoint as a set of output tensors, each described by chunks of
 * source files (the plan). Opening a model reads metadata only: rank files'
 * zip directories and pickles, fsdp_config.json, huggingface/config.json.
 * Reading a tensor's elements (ckfs_tensor_read) preads exactly the source
 * bytes they come from and converts them to the output dtype.
 *
 * The invariants checked before a model is handed out: every element of
 * every tensor is covered by exactly one chunk; every chunk's view lies
 * inside its storage record; shapes, dtypes and placements agree across
 * ranks. After ckfs_model_open (include/ckfs/layouts.h: the layout
 * readers fill a model) it is immutable and may be read from many threads
 * at once.
 *
 * This is the read-time engine (src/model/): the plan's types, its
 * validation, the element read path and source identity. It knows nothing
 * of checkpoint formats.
 */
#ifndef CKFS_MODEL_H
#define CKFS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "ckfs/arena.h"
#include "ckfs/dtype.h"
#include "ckfs/err.h"
#include "ckfs/file.h"
#include "ckfs/limits.h"

/* A source file, opened read-only when the model is opened. */
struct ckfs_source {
	const char *path;      /* as opened */
	const char *name;      /* relative to the checkpoint folder */
	struct ckfs_file f;
	uint64_t size;         /* identity recorded at open */
	dev_t dev;
	ino_t ino;
	struct timespec mtime;
	mode_t mode;           /* who may read it (type and permission bits), */
	uid_t uid;             /* part of the identity too */
	gid_t gid;
	bool acl;              /* it has an access ACL (ckfs_fd_has_acl) */
	/* Ranges read only once their check passed (guards.c); NULL: none.
	 * Owned by the source: freed with the model that holds it. */
	struct ckfs_guards *guards;
};

/*
 * Guards (src/model/guards.c): ranges of a source whose bytes a layout
 * located on trust, each with a check that must pass before any byte of
 * it is read. verl FSDP rank files are the case: a storage's data start
 * is derived from torch.save's alignment rule instead of read from its
 * local zip header at open (a frontier MoE rank file has 37,000 of them,
 * include/ckfs/zip.h), and the header is read and compared before the
 * first byte of that storage is served. The read path calls
 * ckfs_source_guard before every pread; a range passes once (the bit is
 * kept), and a failing one fails every read that touches it with the
 * same message (EIO through FUSE).
 *
 * A guard packs into 16 bytes (millions of them): the range's start (48
 * bits) and 16 bits of the check's own in `at`; its length (31 bits),
 * the passed bit and 32 bits of the check's own in `word`.
 */
#define CKFS_GUARD_MAX_START ((1ull << 48) - 1)
#define CKFS_GUARD_MAX_LEN ((1ull << 31) - 1)
struct ckfs_guard {
	uint64_t at;
	_Atomic uint64_t word;
};
struct ckfs_guards;
/* The check of the range starting at `start`, given its two values. */
typedef enum ckfs_code (*ckfs_guard_fn)(const struct ckfs_source *s, const char *ctx,
					 uint64_t start, uint16_t x, uint32_t y,
					 struct ckfs_error *err);
struct ckfs_guards {
	ckfs_guard_fn check;
	char *ctx;                      /* the check's text (owned) */
	size_t n;
	struct ckfs_guard *v;           /* sorted by start, disjoint */
};
/* A guard's values: start <= CKFS_GUARD_MAX_START, len <= CKFS_GUARD_MAX_LEN. */
struct ckfs_guard ckfs_guard_make(uint64_t start, uint64_t len, uint16_t x, uint32_t y);
/* A new, empty table for up to cap guards (NULL when out of memory). */
struct ckfs_guards *ckfs_guards_new(ckfs_guard_fn check, const char *ctx, size_t cap);
/* Add g; ckfs_guards_seal sorts them and refuses overlaps (CKFS_E_INVALID:
 * a bug of the layout). */
void ckfs_guards_add(struct ckfs_guards *gs, struct ckfs_guard g);
enum ckfs_code ckfs_guards_seal(struct ckfs_guards *gs, struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_guards_free(struct ckfs_guards *gs);
/* Every guard of s meeting [pos, pos + len) checked, unless it passed. */
enum ckfs_code ckfs_source_guard(const struct ckfs_source *s, uint64_t pos, uint64_t len,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
/* A guard's start and length, and how many of s's passed (for tests). */
uint64_t ckfs_guard_start(const struct ckfs_guard *g);
uint64_t ckfs_guard_len(const struct ckfs_guard *g);
size_t ckfs_guards_passed(const struct ckfs_guards *gs);
/* The table as words for the plan cache (their count with v NULL), and
 * back: a table with check from the words at v (n left), *used of them. */
size_t ckfs_guards_words(const struct ckfs_guards *gs, uint64_t *v);
enum ckfs_code ckfs_guards_from_words(ckfs_guard_fn check, const uint64_t *v, size_t n,
				      size_t *used, struct ckfs_guards **out,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;


/* A block of a source tensor placed in the global tensor, as the readers
 * build it (src/layouts/: struct ckfs_chunk_list). */
struct ckfs_chunk_spec {
	uint32_t source;
	int rank;                       /* for messages and inspect */
	enum ckfs_dtype dtype;
	bool neg;
	uint64_t pos;                   /* file offset of local element 0 */
	int64_t shape[CKFS_MAX_DIMS];   /* local extent */
	int64_t stride[CKFS_MAX_DIMS];  /* source strides, in elements */
	int64_t offset[CKFS_MAX_DIMS];  /* global index of local element 0 */
};

/* The same block as a model holds it: 48 bytes instead of 400, its dims
 * interned in the model (ckfs_model_dims), since a frontier MoE actor has
 * millions of chunks and only a few thousand distinct dim vectors. Each
 * array holds max(ndim, 1) values of its tensor's ndim. */
struct ckfs_chunk {
	uint32_t source;
	int rank;                       /* for messages and inspect */
	enum ckfs_dtype dtype;
	bool neg;
	uint64_t pos;                   /* file offset of local element 0 */
	const int64_t *shape;           /* local extent */
	const int64_t *stride;          /* source strides, in elements */
	const int64_t *offset;          /* global index of local element 0 */
};

struct ckfs_model;
struct ckfs_view_config;
struct ckfs_tensor;
struct ckfs_read_scratch;

/*
 * A served view: a tensor whose bytes are computed on read from other
 * tensors' (src/model/view_*.c), after ggml's type traits. One row per
 * view; a view's tensor may read another view's (FP8 of a LoRA-fused
 * weight reads the fused weight), as curl's content writers chain.
 */
struct ckfs_view {
	const char *name;
	/* Elements [first, first + count) of t as t->out_dtype into dst. */
	enum ckfs_code (*read)(const struct ckfs_model *m, const struct ckfs_tensor *t,
			       uint64_t first, uint64_t count, void *dst,
			       struct ckfs_read_scratch *scratch, struct ckfs_error *err);
	/* The tensors t is computed from beyond its own chunks (what may
	 * read it: src/folder/perm.c), into in[0..2); how many. */
	size_t (*inputs)(const struct ckfs_tensor *t, const struct ckfs_tensor *in[2]);
	/* A view of the whole model (m->view; NULL here for a tensor-only
	 * view, LoRA): what config.json says of it, and the release of
	 * m->view_state's locks and buffers (freed with m's arena). */
	enum ckfs_code (*config)(const struct ckfs_model *m, struct ckfs_view_config *c,
				 struct ckfs_error *err);
	void (*release)(struct ckfs_model *m);
	/* Serves the model quantized: its weight files list tensors by name
	 * (each weight beside its parts), and the rest is announced bf16. */
	bool quantizes;
	/* A compressed-tensors scheme's tensors in each weight's place (the
	 * selector src/layouts/ct_select.c makes them); NULL for others. */
	const struct ckfs_ct_scheme *ct;
};
/* config.json of a model served through a view. */
struct ckfs_view_config {
	char *quantization;     /* quantization_config (malloc'd), or NULL */
	bool drop_quantization; /* the source's quantization_config goes */
};
extern const struct ckfs_view ckfs_view_fp8;          /* --dtype fp8: view_fp8.c */
extern const struct ckfs_view ckfs_view_fp8_dequant;  /* a block-FP8 release in bf16 */
extern const struct ckfs_view ckfs_view_w4a16;        /* --dtype w4a16: view_w4a16.c */
extern const struct ckfs_view ckfs_view_nvfp4;        /* --dtype nvfp4: view_nvfp4.c */
extern const struct ckfs_view ckfs_view_lora;         /* --lora=fuse: view_lora.c */

struct ckfs_tensor {
	const char *name;
	enum ckfs_dtype stored_dtype;
	enum ckfs_dtype out_dtype;
	int ndim;
	int64_t shape[CKFS_MAX_DIMS];
	uint64_t numel;
	uint32_t n_chunks;
	struct ckfs_chunk *chunks;
	/* A plain (replicated) tensor of a multi-rank checkpoint: the other
	 * ranks' copies, one whole-tensor chunk each. Never served (chunks
	 * holds the first rank's); ckfs verify compares their values. */
	uint32_t n_copies;
	struct ckfs_chunk *copies;
	const char *placement;          /* e.g. "Shard(0)", for inspect */
	/* A served view (struct ckfs_view): NULL for a tensor served from
	 * its chunks. view_state is the view's own: --lora=fuse's struct
	 * ckfs_lora_pair, --dtype fp8's struct ckfs_fp8, a compressed-tensors
	 * view's struct ckfs_ct_weight, a release's scale tensor. view_part 0
	 * is the tensor the view is named by; a later part (FP8 scales, a
	 * compressed-tensors weight's other tensors) is served right after
	 * it, in its shard. */
	const struct ckfs_view *view;
	void *view_state;
	int view_part;
};

/* view_part of an --dtype fp8 weight's scales. */
#define CKFS_FP8_SCALES 1

/*
 * A compressed-tensors scheme (--dtype w4a16, nvfp4; docs/formats.md): the
 * tensors <module>.<suffix> each quantized 2-D weight W [rows, cols]
 * becomes, in name order (view_part is the index), scales per group of
 * `group` consecutive elements of a row.
 */
struct ckfs_ct_part {
	const char *suffix;
	enum ckfs_dtype dtype;
	uint32_t per; /* [rows, cols / per]; 0: 1-D [len] */
	uint32_t len;
};
struct ckfs_ct_scheme {
	const char *word; /* the --dtype word, for messages */
	uint32_t group;
	uint32_t scale_part; /* the part holding the group scales */
	uint32_t n_parts;
	struct ckfs_ct_part parts[3];
};
/* W4A16 (view_w4a16.c): per group of 128, from W as bf16,
 * s = bf16(max|w| / 7.5) (the bf16 eps when that is 0) and
 * q = round_half_even(clamp(bf16(w / s), -8, 7)), packed 8 to an int32
 * along the row, element k in bits 4k..4k+3 as q + 8. NVFP4
 * (view_nvfp4.c): FP4 E2M1 values two to a byte, FP8 E4M3 scales per 16,
 * one float32 global scale. */
#define CKFS_W4A16_GROUP 128
#define CKFS_NVFP4_GROUP 16
struct ckfs_ct_weight {
	struct ckfs_tensor weight;      /* the weight as planned, served as bf16 */
	const struct ckfs_ct_scheme *scheme;
	/* Scales computed by reads of the packed values, kept for the read
	 * of the scales that follows (so it need not read the weight again):
	 * one scale and one "known" byte per group, allocated by the first
	 * such read within the model's budget, freed once every scale was
	 * served from it (view_ct.c). Guarded by lock, as global is. */
	pthread_mutex_t lock;
	unsigned char *scales;
	unsigned char *known;
	uint64_t served;                /* scales served from them */
	struct ckfs_ct_kept *kept;      /* the model's budget */
	/* NVFP4's per-tensor global scale, once computed (global_known). */
	float global;
	bool global_known;
};
/* A compressed-tensors view's model state (m->view_state; ct_select.c):
 * its weights, and the Linear modules left bf16 (its "ignore" list). */
struct ckfs_ct_set {
	struct ckfs_ct_weight *weights;
	size_t n;
	const char **ignore;
	size_t n_ignore;
	struct ckfs_ct_kept *kept;
};
/* The bytes all weights of a model keep scales in, at most
 * CKFS_CT_KEPT_BYTES: past it, scales are computed again. */
#define CKFS_CT_KEPT_BYTES (256u << 20)
struct ckfs_ct_kept {
	pthread_mutex_t lock;
	uint64_t bytes;
};
/* view_ct.c, shared by the compressed-tensors views: scales [g, g + n)
 * of w kept; scales [first, first + count) copied into dst when all are
 * kept (1, else 0); the set's kept scales and locks released (their
 * release); groups [g, g + n) of w's weight as bf16 into the scratch
 * buffer; their inputs (the weight); max |w|; their quantization_config,
 * `head` up to the "ignore" list's "[" (keys sorted). */
void ckfs_ct_keep(struct ckfs_ct_weight *w, uint64_t g, uint64_t n, const void *sc);
int ckfs_ct_take(struct ckfs_ct_weight *w, uint64_t first, uint64_t count, void *dst);
void ckfs_ct_release(struct ckfs_model *m);
enum ckfs_code ckfs_ct_read_groups(const struct ckfs_model *m, const struct ckfs_ct_weight *w,
				   uint64_t g, uint64_t n, const uint16_t **out,
				   struct ckfs_read_scratch *scratch, struct ckfs_error *err);
size_t ckfs_ct_inputs(const struct ckfs_tensor *t, const struct ckfs_tensor *in[2]);
/* max |w| over n bf16 values, NaN when one is (a group's, a weight's). */
float ckfs_ct_amax(const uint16_t *w, size_t n);
enum ckfs_code ckfs_ct_config(const struct ckfs_model *m, const char *head,
			      struct ckfs_view_config *c, struct ckfs_error *err);

/*
 * Block-wise FP8 of a 2-D weight W [rows, cols] (src/model/view_fp8.c): per
 * block of CKFS_FP8_BLOCK x CKFS_FP8_BLOCK (partial at the edges) a scale
 * s = max(amax(|block|), 1e-10) / 448 (never 0: vLLM's floor), and values
 * float8_e4m3fn(clamp(W / s, -448, 448)). The scales of a block row are
 * computed on the first read that needs them, from the whole block row,
 * and kept: a later read of any rows in it reads only those rows.
 */
#define CKFS_FP8_BLOCK 128
struct ckfs_fp8 {
	struct ckfs_tensor weight;      /* the weight as planned (a view of
					 * its own when LoRA is fused) */
	int64_t rows, cols, block_rows, block_cols;
	float *scales;                  /* block_rows x block_cols */
	_Atomic unsigned char *ready;   /* per block row: unknown, being
					 * computed, set (view_fp8.c) */
	pthread_mutex_t lock;           /* guards the states' changes */
	pthread_cond_t done;            /* a block row was computed */
	struct ckfs_fp8_kept *kept;     /* the model's */
};

/* Block rows quantized whole and kept for the reads that want them
 * (view_fp8.c): up to CKFS_FP8_KEPT block rows and CKFS_FP8_KEPT_BYTES, least
 * recently used first out. */
#define CKFS_FP8_KEPT 1024
#define CKFS_FP8_KEPT_BYTES (128u << 20)
struct ckfs_fp8_kept {
	pthread_mutex_t lock;
	uint64_t clock, bytes;
	struct {
		const struct ckfs_fp8 *q;
		int64_t block_row;
		unsigned char *bytes;   /* malloc'd; NULL: a free slot */
		uint64_t size, used;
	} slot[CKFS_FP8_KEPT];
};
/* --dtype fp8's model state (m->view_state; src/layouts/fp8_select.c):
 * one per quantized weight, and the modules left unquantized, as
 * transformers names them. */
struct ckfs_fp8_set {
	struct ckfs_fp8 *weights;
	size_t n;
	const char **unconverted;
	size_t n_unconverted;
	struct ckfs_fp8_kept *kept;
};
/* A block-FP8 release served in a float dtype (m->view_state of
 * ckfs_view_fp8_dequant): how many weights are dequantized. */
struct ckfs_fp8_dequant_set {
	size_t n;
};

/*
 * A LoRA (PEFT) adapter of a linear layer: W' = W + scale * (B @ A), with
 * A [r, in] and B [out, r] the adapter tensors of m->lora. The read path
 * keeps A and B in memory as fp32, read on the first fused read of W (an
 * adapter is small next to its base), so a slice never reads them again.
 */
struct ckfs_lora_pair {
	const struct ckfs_tensor *a, *b;
	float scale;
	pthread_mutex_t lock;           /* guards the first read */
	float *_Atomic ab;              /* A then B, fp32; NULL until read */
};

enum ckfs_lora_mode {
	CKFS_LORA_ADAPTER,  /* verl's folder: base + lora_adapter/ (default) */
	CKFS_LORA_FUSE,     /* one model, W + scale * (B @ A) computed on read */
	CKFS_LORA_BASE,     /* the base weights alone */
};

/* A LoRA actor's adapter (src/layouts/peft.c): verl's merger writes it to
 * lora_adapter/ (adapter_model.safetensors, adapter_config.json). */
struct ckfs_lora {
	enum ckfs_lora_mode mode;
	struct ckfs_tensor *tensors;    /* adapter_model.safetensors */
	size_t n_tensors;
	struct ckfs_lora_pair *pairs;   /* one per adapted module, */
	const char **modules;           /* whose names (as held in memory) */
	size_t n_pairs;                 /* are these */
	int64_t r;                      /* adapter_config.json's r, */
	int64_t alpha;                  /* lora_alpha, */
	bool rslora;                    /* use_rslora, */
	const char *task_type;          /* task_type (NULL: null) */
	const char **target_modules;    /* and target_modules, sorted */
	size_t n_target_modules;
	bool only;                      /* the checkpoint held no base weights */
};

struct ckfs_layout;

struct ckfs_model {
	struct ckfs_arena arena;
	const char *src_dir;
	/* The layout that read it (include/ckfs/layouts.h: its name, as
	 * inspect shows it, and what it can say of the model), and what only
	 * that layout knows (its describe turns it into facts). */
	const struct ckfs_layout *layout;
	void *layout_info;
	const char *written_by;         /* the torch release(s) the files show
					 * they were written by, or NULL */
	int world_size;                 /* ranks that saved it (hf: 1) */
	size_t n_ranks_read;            /* the ranks whose files are read */
	int *ranks_read;
	struct ckfs_source *sources;
	size_t n_sources;
	bool remote_sources;            /* some are in a store: reads fetch
					 * ahead (ckfs_file_ahead) */
	struct ckfs_tensor *tensors;    /* output tensors, state-dict order */
	size_t n_tensors;
	const char *hf_dir;             /* side files, NULL when absent */
	const char *config_path;
	char *config_json;              /* the source config, NUL-terminated */
	size_t config_len;
	struct ckfs_file_access config_access; /* of config_path */
	/* The layout's metadata files the tensors' names, shapes and
	 * placement were read from (fsdp_config.json, .metadata, ...). */
	struct ckfs_file_access *meta_files;
	size_t n_meta_files;
	bool tie_word_embeddings;       /* as transformers reads config.json */
	const char *model_type;         /* config.json's; NULL when absent */
	/* A LoRA actor's adapter; NULL for other models. */
	struct ckfs_lora *lora;
	/* The view the whole model is served through (--dtype fp8 or
	 * w4a16, a block-FP8 release dequantized) and its state: NULL for
	 * a model served as planned. */
	const struct ckfs_view *view;
	void *view_state;
	/* --base: the model the base weights were taken from (its sources
	 * moved into m's); freed with m. */
	struct ckfs_model *base;
	/* Where its files may come from: root = src_dir (alt_root a --config
	 * folder), follow_symlinks from the options (include/ckfs/file.h). */
	struct ckfs_file_policy policy;
	const char **warnings;
	size_t n_warnings;
	/* Interned dim vectors of the chunks (src/model/dims.c). */
	struct ckfs_dims *dims;
	/* Sources still being checked by a thread (src/model/checks.c);
	 * NULL when every check ran at open. */
	struct ckfs_checks *checks;
};

/*
 * Deferred checks (checks.c): a layout's build that leaves some sources to
 * be checked after open hands a job to ckfs_checks_defer (which takes it:
 * free_ctx(ctx) is called when the model is freed, or now on failure);
 * ckfs_model_open starts it with ckfs_checks_start once the model is
 * complete. ready(ctx, m, err), when set, first confirms that m's tensors
 * are still those the job completes. run(ctx, stop, err) then runs in a
 * thread: it checks what the plan was not built from and completes the
 * plan (file positions) before it returns, and returns early with any code
 * when *stop is set (the model is being freed). Until run has returned
 * CKFS_OK no tensor byte may be served: readers call ckfs_model_checked
 * first.
 */
typedef enum ckfs_code (*ckfs_checks_fn)(void *ctx, _Atomic bool *stop,
					  struct ckfs_error *err);
struct ckfs_checks_job {
	ckfs_checks_fn run;
	enum ckfs_code (*ready)(void *ctx, const struct ckfs_model *m,
				struct ckfs_error *err);
	void (*free_ctx)(void *ctx);
	void *ctx;
};
enum ckfs_code ckfs_checks_defer(struct ckfs_model *m, const struct ckfs_checks_job *job,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
/* The deferred job's thread started (CKFS_OK when there is none). */
enum ckfs_code ckfs_checks_start(struct ckfs_model *m, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* CKFS_OK once the deferred checks (if any) have passed, waiting for them
 * if they are running; their failure (the same message every time)
 * after they failed. */
enum ckfs_code ckfs_model_checked(const struct ckfs_model *m,
				  struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Stop and join the checks' thread (ckfs_model_free). */
void ckfs_checks_free(struct ckfs_model *m);

/* Close the sources and free everything of m (made by ckfs_model_open,
 * include/ckfs/layouts.h). */
void ckfs_model_free(struct ckfs_model *m);

/*
 * Check that a source is still the file that was opened: same size, mtime,
 * permissions and owner through its descriptor, not deleted, and its path
 * still naming the same inode. CKFS_E_CHANGED otherwise, with a message
 * saying what changed. (An object in a store is always CKFS_OK here:
 * every read of it is pinned to the version opened, see file.h.)
 * The read path calls it before and after reading, so bytes assembled
 * while a file changed are never returned.
 */
enum ckfs_code ckfs_source_check(const struct ckfs_source *s,
				 struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Open the file at path as the source s (the one way sources are opened:
 * ckfs_file_open under pol, then ckfs_source_init). path and name must
 * outlive s; name is relative to the checkpoint folder. */
enum ckfs_code ckfs_source_open(struct ckfs_source *s, const struct ckfs_file_policy *pol,
				const char *path, const char *name,
				struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Record the identity of an open file into s (f and path kept). */
enum ckfs_code ckfs_source_init(struct ckfs_source *s, struct ckfs_file f, const char *path,
				const char *name, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* Bytes of source files this process has read to serve data (not the
 * metadata read at open), for the mount's stats.
 * Readers call ckfs_source_note_read as they go. */
uint64_t ckfs_source_bytes_read(void);
void ckfs_source_note_read(uint64_t n);

/*
 * The interned copy of v[0..n) in m (dims.c): equal vectors share one
 * array, which lives as long as m. NULL when out of memory. Not thread
 * safe: readers intern while they build the model.
 */
const int64_t *ckfs_model_dims(struct ckfs_model *m, const int64_t *v, int n);
/* Free the index of the interned vectors (ckfs_model_free; the vectors
 * stay in the arena). */
void ckfs_model_dims_release(struct ckfs_model *m);
/* s as a chunk of m for a tensor of ndim dims (dims interned). */
enum ckfs_code ckfs_chunk_pack(struct ckfs_model *m, const struct ckfs_chunk_spec *s, int ndim,
			       struct ckfs_chunk *out, struct ckfs_error *err) CKFS_WARN_UNUSED;
/* v[0..n) packed into an array of n + 1 chunks in m's arena; NULL when
 * out of memory. */
struct ckfs_chunk *ckfs_model_chunks(struct ckfs_model *m, const struct ckfs_chunk_spec *v,
				     size_t n, int ndim);
/* c of a tensor of ndim dims, unpacked (the other dims zero). */
void ckfs_chunk_unpack(const struct ckfs_chunk *c, int ndim, struct ckfs_chunk_spec *out);

/* Bytes of one output tensor. */
uint64_t ckfs_tensor_out_bytes(const struct ckfs_tensor *t);

/* Reusable buffers for ckfs_tensor_read; one per thread. A view being
 * read holds the buffer of its depth (ckfs_view_scratch), so a view that
 * reads another view's tensor does not lose its own. */
#define CKFS_VIEW_DEPTH 4
struct ckfs_read_scratch {
	void *buf;                      /* bounce buffer of plain reads */
	size_t cap;
	struct {
		void *p;
		size_t cap;
	} view[CKFS_VIEW_DEPTH];
	int depth;                      /* views being read */
};
/* The buffer of the view being read, at least bytes long; NULL when out
 * of memory. */
void *ckfs_view_scratch(struct ckfs_read_scratch *s, size_t bytes);
/* A quantizing view's quantization_config into c: head, the module
 * names as a JSON list (", " between them), tail. */
enum ckfs_code ckfs_view_quantization(struct ckfs_view_config *c, const char *head,
				      const char *const *names, size_t n, const char *tail,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_read_scratch_release(struct ckfs_read_scratch *s);

/*
 * Write elements [first, first + count) of t, in row-major order of the
 * global tensor, to dst as t->out_dtype. Short reads (a source that
 * shrank) give CKFS_E_CHANGED naming the file.
 */
enum ckfs_code ckfs_tensor_read(const struct ckfs_model *m,
				const struct ckfs_tensor *t, uint64_t first,
				uint64_t count, void *dst,
				struct ckfs_read_scratch *scratch,
				struct ckfs_error *err) CKFS_WARN_UNUSED;

/*
 * The source ranges a ckfs_tensor_read of [first, first + count) of t
 * will read, one per chunk, written to v[0..cap) (a chunk not stored as
 * whole rows in order gives whole rows: a little more than the read may
 * need): the number written. Chunks whose bytes lie too far apart for
 * one range, and views' tensors, give none. A hint for
 * fetching ahead (ckfs_file_ahead), never a promise: the read fetches
 * what it was not given.
 */
size_t ckfs_tensor_ranges(const struct ckfs_model *m, const struct ckfs_tensor *t,
			  uint64_t first, uint64_t count, struct ckfs_file_range *v,
			  size_t cap);

/* Validation (plan.c) of a finished tensor plan, by the layout readers as
 * they make each tensor, and of the finished model (its served dtypes
 * chosen), by ckfs_model_open: every name and served size again, each
 * name served once. */
enum ckfs_code ckfs_plan_validate_tensor(const struct ckfs_model *m,
					 const struct ckfs_tensor *t,
					 struct ckfs_error *err) CKFS_WARN_UNUSED;
enum ckfs_code ckfs_plan_validate_model(const struct ckfs_model *m,
					struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
