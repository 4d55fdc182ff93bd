/* SPDX-License-Identifier: MIT */
/*
 * A pickle interpreter that builds a value tree and never imports or
 * executes anything. It accepts the opcodes of protocols 2-5 that torch.save
 * and torch.distributed.checkpoint emit (formats.md section 2.2); text-mode
 * and extension opcodes are refused. GLOBAL / STACK_GLOBAL become
 * CKFS_PV_GLOBAL nodes holding the module and name; REDUCE becomes a
 * CKFS_PV_CALL node and NEWOBJ / NEWOBJ_EX a CKFS_PV_OBJECT node, to be
 * interpreted by the caller (src/fmt/torch.c). A few calls are evaluated
 * because they only build plain data:
 *   collections.OrderedDict()          -> empty CKFS_PV_DICT
 *   torch.Size(tuple)                  -> that CKFS_PV_TUPLE
 *   _codecs.encode(str, 'latin1')      -> CKFS_PV_BYTES
 *   builtins/__builtin__ set|frozenset(list) -> CKFS_PV_SET
 *   builtins/__builtin__ bytearray(bytes)    -> CKFS_PV_BYTES
 *   builtins/__builtin__ getattr(GLOBAL, str) -> GLOBAL named "Cls.attr"
 *   builtins/__builtin__ bytes()       -> empty CKFS_PV_BYTES (protocol 2's b'')
 * Memo references return the same node (shared objects stay shared); small
 * constants (None, booleans, (), ints 0-255) are shared too, so compare
 * values, never addresses.
 * No cycles: a container can be filled (APPEND, SETITEMS, ADDITEMS, BUILD)
 * only until something refers to it, as Python's pickler always does; a
 * self-referencing pickle is refused. Every path is at most
 * CKFS_MAX_PICKLE_NESTING deep and the tree's size with shared nodes
 * counted per use is bounded (CKFS_MAX_PICKLE_TREE), so consumers may walk
 * it recursively without a visited set.
 * BUILD stores its argument in the target's `state` (OBJECT or CALL; on a
 * DICT it is ignored, as for nn.Module state-dict metadata).
 *
 * All nodes live in the caller's arena. Depth, size and count limits come
 * from limits.h; every failure is one line naming `label` and the byte
 * offset, e.g. "'archive/data.pkl': memo index 9 out of range at offset 130".
 */
#ifndef CKFS_PICKLE_H
#define CKFS_PICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "ckfs/arena.h"
#include "ckfs/err.h"

enum ckfs_pv_kind {
	CKFS_PV_NONE,
	CKFS_PV_BOOL,   /* .i is 0 or 1 */
	CKFS_PV_INT,    /* .i */
	CKFS_PV_BIGINT, /* int outside int64: .str holds its LE two's-complement bytes */
	CKFS_PV_FLOAT,  /* .f */
	CKFS_PV_STR,    /* .str, UTF-8 as stored, NUL-terminated */
	CKFS_PV_BYTES,  /* .str */
	CKFS_PV_TUPLE,  /* .seq */
	CKFS_PV_LIST,   /* .seq */
	CKFS_PV_SET,    /* .seq */
	CKFS_PV_DICT,   /* .dict, insertion order kept, keys may be any node */
	CKFS_PV_GLOBAL, /* .global */
	CKFS_PV_CALL,   /* .call: fn(*args) not evaluated; .state from BUILD */
	CKFS_PV_OBJECT, /* .obj: cls.__new__(cls, *args); .state from BUILD */
	CKFS_PV_PERSID, /* .persid: BINPERSID with its id (a tuple for torch) */
};

struct ckfs_pv {
	enum ckfs_pv_kind kind;
	uint32_t at; /* offset of the opcode that made it (see ckfs_pv_made_once) */
	union {
		int64_t i;
		double f;
		struct {
			const char *s;
			size_t len;
		} str;
		struct {
			struct ckfs_pv **items;
			size_t n, cap;
		} seq;
		struct {
			struct ckfs_pv **keys, **vals;
			size_t n, cap;
		} dict;
		struct {
			const char *module, *name;
		} global;
		struct {
			struct ckfs_pv *fn, *args, *state;
		} call;
		struct {
			struct ckfs_pv *cls, *args, *kwargs, *state;
		} obj;
		struct {
			struct ckfs_pv *pid;
		} persid;
	} u;
};

/*
 * Run the pickle in bytes[0..len) and return the value left by STOP.
 * label is used in messages. The tree is allocated from arena and valid until
 * the arena is released.
 */
enum ckfs_code ckfs_pickle_load(const void *bytes, size_t len,
				const char *label, struct ckfs_arena *arena,
				struct ckfs_pv **out,
				struct ckfs_error *err) CKFS_WARN_UNUSED;

/*
 * ckfs_pickle_load, with flags: CKFS_PICKLE_ORIGINS gives every int its own
 * node (no sharing of 0..255), so that ckfs_pv_made_once can tell where
 * each value of the tree came from.
 */
#define CKFS_PICKLE_ORIGINS 1u
enum ckfs_code ckfs_pickle_load_ex(const void *bytes, size_t len, const char *label,
				   struct ckfs_arena *arena, unsigned flags, struct ckfs_pv **out,
				   struct ckfs_error *err) CKFS_WARN_UNUSED;
/*
 * Whether v was pushed once only (never fetched from the memo, never
 * duplicated), so that the tree reaches it from one parent at most; then
 * *at is the offset of the opcode that made it. For an int, only from a
 * load with CKFS_PICKLE_ORIGINS (else small ints are shared).
 */
int ckfs_pv_made_once(const struct ckfs_pv *v, uint32_t *at);

/* Helpers for the interpreters of the tree. All tolerate NULL. */
int ckfs_pv_is_global(const struct ckfs_pv *v, const char *module,
		      const char *name);
/* True when v is a GLOBAL whose name is `name` and whose module starts with
 * module_prefix (torch moved classes between modules across releases). */
int ckfs_pv_is_global_named(const struct ckfs_pv *v, const char *module_prefix,
			    const char *name);
/* Value of a string key in a DICT, or NULL. */
struct ckfs_pv *ckfs_pv_dict_get(const struct ckfs_pv *dict, const char *key);
int ckfs_pv_is_str(const struct ckfs_pv *v, const char *s);
/* A LIST or TUPLE (what a torch.Size is after the VM). */
int ckfs_pv_is_seq(const struct ckfs_pv *v);
/* The items of a LIST or TUPLE; 0 for anything else. */
size_t ckfs_pv_seq_len(const struct ckfs_pv *v);
/* NULL (absent) or None. */
int ckfs_pv_is_none(const struct ckfs_pv *v);
/* An INT (not a BOOL) into *out: 1, else 0. */
int ckfs_pv_get_int(const struct ckfs_pv *v, int64_t *out);
/* Name of a kind for messages ("tuple", "global", ...). */
const char *ckfs_pv_kind_name(enum ckfs_pv_kind kind);

#endif
