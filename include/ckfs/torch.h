/* SPDX-License-Identifier: MIT */
/*
 * Metadata of a torch.save file: the zip directory plus data.pkl, turned
 * into state-dict entries that describe where each tensor's bytes are. No
 * tensor data is read here (except by the caller, through the offsets).
 *
 * Understood values: plain tensors (_rebuild_tensor, _v2, _v3, any storage
 * offset and strides, the neg bit), nn.Parameter, DTensor (under
 * torch.distributed._tensor or torch.distributed.tensor; placements Shard,
 * Replicate, _StridedShard and Partial; the DeviceMesh of every torch
 * release from 2.4 to 2.15: a rank tensor, or a layout over a rank map)
 * and ShardedTensor (local shards with their offsets). Anything else, and
 * any field of the distributed classes ckfs does not know, is reported
 * with the key it sits under.
 */
#ifndef CKFS_TORCH_H
#define CKFS_TORCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckfs/arena.h"
#include "ckfs/dtype.h"
#include "ckfs/err.h"
#include "ckfs/limits.h"
#include "ckfs/pickle.h"
#include "ckfs/zip.h"

/* A strided view into one storage record of the file. */
struct ckfs_tensor_view {
	enum ckfs_dtype dtype;
	int ndim;
	int64_t shape[CKFS_MAX_DIMS];
	int64_t stride[CKFS_MAX_DIMS];  /* in elements */
	int64_t storage_offset;         /* in elements */
	uint64_t storage_pos;           /* absolute file offset of the storage */
	uint64_t storage_bytes;         /* bytes of the storage record */
	const char *storage_key;
	/* its zip record, while the file is open: a derived one
	 * (.derive_locals) is checked before its bytes are read */
	const struct ckfs_zip_entry *storage_entry;
	bool neg;                       /* values must be negated (neg bit) */
};

enum ckfs_placement_kind {
	CKFS_PLACE_REPLICATE,
	CKFS_PLACE_SHARD,
	CKFS_PLACE_STRIDED_SHARD,
	CKFS_PLACE_PARTIAL,
};

struct ckfs_placement {
	enum ckfs_placement_kind kind;
	int dim;
	int64_t split_factor; /* _StridedShard only */
};

/* A DTensor's distribution as pickled on one rank. */
struct ckfs_dtensor_info {
	int ndim;
	int64_t global_shape[CKFS_MAX_DIMS];
	int mesh_ndim;
	int64_t mesh_shape[CKFS_MAX_DIMS];
	const char *mesh_dim_names[CKFS_MAX_DIMS]; /* NULL when unnamed */
	bool have_coord;
	int64_t coord[CKFS_MAX_DIMS];          /* this rank's mesh coordinate */
	struct ckfs_placement placements[CKFS_MAX_DIMS];
	bool have_mesh_tensor;
	struct ckfs_tensor_view mesh_tensor;   /* global ranks, shape = mesh */
};

/* A ShardedTensor's local shard (at most one for FSDP1). */
struct ckfs_sharded_info {
	int ndim;
	int64_t global_shape[CKFS_MAX_DIMS];
	bool have_local;
	int64_t offsets[CKFS_MAX_DIMS];
	int64_t sizes[CKFS_MAX_DIMS];
};

enum ckfs_entry_kind {
	CKFS_ENTRY_TENSOR,
	CKFS_ENTRY_DTENSOR,
	CKFS_ENTRY_SHARDED,
};

struct ckfs_sd_entry {
	const char *key;
	enum ckfs_entry_kind kind;
	struct ckfs_tensor_view local; /* the whole tensor for TENSOR */
	struct ckfs_dtensor_info *dtensor;
	struct ckfs_sharded_info *sharded;
};

/* A value of a template's data.pkl that may differ from rank to rank: a
 * mesh coordinate's int (dim >= 0), or one the decode never reads: an int
 * (SPAN_UNREAD_INT: the mesh's _hash, _thread_id, _rank, each
 * DTensorSpec's _hash) or a string (SPAN_UNREAD_STR: the mesh's
 * _dim_group_names); at is its opcode's offset. */
#define SPAN_UNREAD_INT (-1)
#define SPAN_UNREAD_STR (-2)
struct ckfs_torch_span {
	uint32_t at;
	int dim;
};

struct ckfs_torch_file {
	const char *label;         /* borrowed, for messages */
	struct ckfs_zip zip;
	struct ckfs_arena arena;   /* pickle tree and entries */
	struct ckfs_pv *root;
	struct ckfs_sd_entry *entries;
	size_t n_entries;
	/* Entries of state dict p are [part_end[p-1], part_end[p]) (0 for
	 * p = 0); n_parts dicts (1 but for CKFS_TORCH_ROOT_LIST); n_skipped
	 * entries left out by its skip_suffix. */
	size_t *part_end;
	size_t n_parts;
	size_t n_skipped;
	int writer_lo, writer_hi;  /* torch 2.lo .. 2.hi: see ckfs_torch_writer */
	/* The last DeviceMesh decoded and its result: every DTensor of a
	 * file shares one mesh object, decoded once. */
	const struct ckfs_pv *mesh_pv;
	const struct ckfs_dtensor_info *mesh_di;
	/* Opened .as_template; for a template (ckfs_torch_like_new):
	 * data.pkl's bytes, the meshes decoded and the ints that may differ
	 * (only those the tree reaches by one path). */
	bool is_template;
	unsigned char *pkl;
	size_t pkl_len;
	int n_meshes;
	bool spans_lost; /* out of memory while recording them */
	struct ckfs_torch_span *spans;
	size_t n_spans, spans_cap;
	bool has_format_version;
	/* Read by its template (.like): no entries array;
	 * each entry is the template's with the record recs[i] and the
	 * DTensor info like_dis[...] (see ckfs_torch_entry). */
	bool from_like;
	const struct ckfs_torch_like *like;
	const struct ckfs_zip_entry **recs;
	struct ckfs_dtensor_info *like_dis;
};

/* What ckfs_torch_open reads data.pkl's root as. */
enum ckfs_torch_root {
	/* a state dict: its entries in tf->entries, in pickle order (the
	 * default; refuses big-endian files, unknown storages, non-tensors) */
	CKFS_TORCH_ROOT_DICT,
	/* a LIST of state dicts (the legacy Megatron model.pt: one per
	 * virtual-pipeline chunk), their entries flattened in order and
	 * delimited by tf->part_end */
	CKFS_TORCH_ROOT_LIST,
	/* anything (DeepSpeed's checkpoint dicts hold tensors at known places
	 * among other values): the value tree in tf->root, nothing decoded;
	 * the caller decodes what it needs with ckfs_torch_decode_value */
	CKFS_TORCH_ROOT_TREE,
	/* a torch.save zip embedded in f (a DCP .distcp item) whose root is a
	 * bare _rebuild_tensor_v2 call: see item below */
	CKFS_TORCH_ROOT_ITEM,
};

struct ckfs_torch_like;

/*
 * How ckfs_torch_open reads a file; fields left out (designated
 * initializers) are off. Options that do not fit the root (a template
 * for anything but a state dict, an item's fields for a whole file) are
 * refused with CKFS_E_INVALID.
 */
struct ckfs_torch_open_opts {
	const char *label;          /* the file in messages (borrowed) */
	enum ckfs_torch_root root;
	/*
	 * The zip opened with CKFS_ZIP_DERIVE_LOCALS (zip.h): storage records
	 * whose local header was not read are marked derived in tf->zip, and
	 * the caller takes on their checks (ckfs_zip_check_derived,
	 * ckfs_zip_check_local_at) before serving any of their bytes.
	 */
	bool derive_locals;
	/* Record what ckfs_torch_like_new needs (below): ints get their own
	 * pickle nodes, data.pkl's bytes are kept. ROOT_DICT only. */
	bool as_template;
	/* Blocks of an arena the parse takes for its own (left empty), from
	 * ckfs_torch_close_keep of an earlier file; NULL for none. */
	struct ckfs_arena *spare;
	/* Read f by rank 0's template (below) when its data.pkl allows, its
	 * mesh coordinate coord (may be NULL when the template found none).
	 * ROOT_DICT only; like must outlive tf. */
	const struct ckfs_torch_like *like;
	const int64_t *coord;
	/* ROOT_LIST: keys ending in it (e.g. "_extra_state") are not decoded
	 * and are counted in tf->n_skipped; NULL for none. */
	const char *skip_suffix;
	/* ROOT_ITEM: the zip at [base, base + length) of f; its root is
	 * decoded as a plain tensor into *out, named key in messages, with
	 * storage positions as absolute file offsets. */
	struct {
		uint64_t base, length;
		const char *key;
		struct ckfs_sd_entry *out;
	} item;
};

/*
 * The one way a torch.save file open as f (borrowed) is read: its zip
 * directory and data.pkl, as o says. On success the caller releases tf
 * with ckfs_torch_close (or _close_keep); on failure it is already
 * released.
 */
enum ckfs_code ckfs_torch_open(struct ckfs_torch_file *tf, struct ckfs_file f,
			       const struct ckfs_torch_open_opts *o,
			       struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_torch_close(struct ckfs_torch_file *tf);

/*
 * A rank file read without running its pickle. The ranks of one FSDP2
 * save write the same data.pkl but for a few ints: the mesh coordinate
 * (_coordinate_on_dim), and hashes and ids the decode does not read
 * (struct ckfs_torch_span). Once rank 0's was parsed, another
 * rank's entries are rank 0's with its coordinate and its own storage
 * records, provided its bytes equal rank 0's everywhere else.
 *
 * Rank 0 opened with .as_template records what that needs;
 * ckfs_torch_like_new then keeps it, with a copy of the entries, and
 * takes tf's bytes; *out is NULL (and the call succeeds) where tf cannot
 * serve as a template (a ShardedTensor; not opened as a template).
 * Another rank opened with .like (and .derive_locals, as rank 0 was)
 * takes the entries from like when its data.pkl is like's but for the
 * coordinate ints, which must hold .coord: same checks of the zip, same
 * binding of every storage to its record, same messages. Anything else
 * runs the pickle. tf->from_like says which. Its entries are read with
 * ckfs_torch_entry (there is no tf->entries array then).
 */
enum ckfs_code ckfs_torch_like_new(struct ckfs_torch_file *tf, struct ckfs_torch_like **out,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
void ckfs_torch_like_free(struct ckfs_torch_like *like);

/* Entry i of tf: &tf->entries[i], or for a file read by its template the
 * template's entry bound to tf's records, made in *scratch. */
const struct ckfs_sd_entry *ckfs_torch_entry(const struct ckfs_torch_file *tf, size_t i,
					     struct ckfs_sd_entry *scratch);

/* ckfs_torch_close, the parse's memory kept in keep's spares (a caller
 * parsing many files in turn; ckfs_arena_release(keep) frees it). */
void ckfs_torch_close_keep(struct ckfs_torch_file *tf, struct ckfs_arena *keep);

/* Decode a tensor value (any supported kind) found in the pickle tree of
 * tf; used by ckfs_torch_open for each state-dict value. */
enum ckfs_code ckfs_torch_decode_value(struct ckfs_torch_file *tf,
				       const struct ckfs_pv *v, const char *key,
				       struct ckfs_sd_entry *out,
				       struct ckfs_error *err) CKFS_WARN_UNUSED;

/* Largest element index a view can touch + 1, checked against its storage;
 * CKFS_E_FORMAT when the view reaches outside. */
enum ckfs_code ckfs_view_check_bounds(const struct ckfs_tensor_view *v,
				      const char *what,
				      struct ckfs_error *err) CKFS_WARN_UNUSED;

/* The torch releases tf can have been written by, as far as its zip
 * records and pickled classes tell ("torch 2.9-2.12", "torch 2.13 or
 * newer"), in buf; NULL when they tell nothing or contradict each other. */
const char *ckfs_torch_writer(const struct ckfs_torch_file *tf, char *buf, size_t size);

/* "Shard(0)", "Replicate()", "_StridedShard(dim=0, sf=2)", "Partial()". */
void ckfs_placement_format(const struct ckfs_placement *p, char *buf,
			   size_t size);

#endif
