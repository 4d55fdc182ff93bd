/* SPDX-License-Identifier: MIT */
/*
 * Pickle interpreter: see include/ckfs/pickle.h.
 *
 * A loop over the opcodes of protocols 2-5 that builds a tree of struct
 * ckfs_pv nodes in the caller's arena. It evaluates only the handful of
 * calls listed in pickle.h that merely build plain data (plus bytes(), which
 * protocol 2 emits for b''); every other REDUCE / NEWOBJ is recorded as a
 * node for src/fmt/torch.c to interpret. It deliberately does not import,
 * resolve or execute anything, does not validate UTF-8 (strings are kept as
 * stored, .len is authoritative, copies are NUL-terminated), does not
 * deduplicate set items or non-string dict keys (a later string key
 * replaces the value of an earlier equal one, as in Python; other keys are
 * appended), and does not support objects with a custom __setitem__ /
 * append (SETITEMS, APPENDS or ADDITEMS on a CALL or OBJECT node).
 *
 * Shape guarantees for consumers: the result is a DAG, never a cyclic
 * graph; no path from the root passes through more than
 * CKFS_MAX_PICKLE_NESTING container nodes (tuple, list, set, dict, call,
 * object, persistent id); and a full recursive walk, which visits a shared
 * node once per use, visits at most CKFS_MAX_PICKLE_TREE nodes. So plain
 * recursion with no visited set is safe. To enforce this every node carries
 * a private height (1 + the largest child height, 0 for scalars) and size
 * (1 + the children's sizes). A new node takes both from its children,
 * which already exist. A container filled later (APPEND(S), SETITEM(S),
 * ADDITEMS, BUILD) may only grow while nothing refers to it yet; once it is
 * some node's child it is frozen, so no parent's height or size goes stale
 * and no cycle can form. Python's pickler fills every container before
 * anything outside its contents refers to it, so the only real pickles
 * this refuses are self-referencing ones (l.append(l), an object whose
 * state points back at it): CKFS_E_UNSUPPORTED.
 *
 * Immutable leaves may be shared even where the pickle did not share them
 * (None, True, False, the empty tuple, BININT1 ints 0..255): compare ints by
 * value, never by address.
 *
 * Memory: nodes, strings and container arrays come from the arena (arrays
 * grow geometrically, old copies stay in the arena); the stack, mark list and
 * memo are scratch buffers freed before returning. The memo is a dense array
 * for indices below the input size (where the pickler's sequential indices
 * always fall) and a small hash table for any other index below
 * CKFS_MAX_PICKLE_MEMO, so a single huge LONG_BINPUT index costs no memory.
 */
#include "ckfs/pickle.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/limits.h"
#include "fmt/pickle_ops.h"

#define HIGHEST_PROTOCOL 5

static const char *const op_names[256] = {
	[OP_MARK] = "MARK", [OP_EMPTY_TUPLE] = "EMPTY_TUPLE",
	[OP_STOP] = "STOP", [OP_POP] = "POP", [OP_POP_MARK] = "POP_MARK",
	[OP_DUP] = "DUP", [OP_BINBYTES] = "BINBYTES",
	[OP_SHORT_BINBYTES] = "SHORT_BINBYTES", [OP_FLOAT] = "FLOAT",
	[OP_BINFLOAT] = "BINFLOAT", [OP_INT] = "INT", [OP_BININT] = "BININT",
	[OP_BININT1] = "BININT1", [OP_LONG] = "LONG", [OP_BININT2] = "BININT2",
	[OP_NONE] = "NONE", [OP_PERSID] = "PERSID",
	[OP_BINPERSID] = "BINPERSID", [OP_REDUCE] = "REDUCE",
	[OP_STRING] = "STRING", [OP_BINSTRING] = "BINSTRING",
	[OP_SHORT_BINSTRING] = "SHORT_BINSTRING", [OP_UNICODE] = "UNICODE",
	[OP_BINUNICODE] = "BINUNICODE", [OP_EMPTY_LIST] = "EMPTY_LIST",
	[OP_APPEND] = "APPEND", [OP_BUILD] = "BUILD", [OP_GLOBAL] = "GLOBAL",
	[OP_DICT] = "DICT", [OP_APPENDS] = "APPENDS", [OP_GET] = "GET",
	[OP_BINGET] = "BINGET", [OP_INST] = "INST",
	[OP_LONG_BINGET] = "LONG_BINGET", [OP_LIST] = "LIST", [OP_OBJ] = "OBJ",
	[OP_PUT] = "PUT", [OP_BINPUT] = "BINPUT",
	[OP_LONG_BINPUT] = "LONG_BINPUT", [OP_SETITEM] = "SETITEM",
	[OP_TUPLE] = "TUPLE", [OP_SETITEMS] = "SETITEMS",
	[OP_EMPTY_DICT] = "EMPTY_DICT", [OP_PROTO] = "PROTO",
	[OP_NEWOBJ] = "NEWOBJ", [OP_EXT1] = "EXT1", [OP_EXT2] = "EXT2",
	[OP_EXT4] = "EXT4", [OP_TUPLE1] = "TUPLE1", [OP_TUPLE2] = "TUPLE2",
	[OP_TUPLE3] = "TUPLE3", [OP_NEWTRUE] = "NEWTRUE",
	[OP_NEWFALSE] = "NEWFALSE", [OP_LONG1] = "LONG1", [OP_LONG4] = "LONG4",
	[OP_SHORT_BINUNICODE] = "SHORT_BINUNICODE",
	[OP_BINUNICODE8] = "BINUNICODE8", [OP_BINBYTES8] = "BINBYTES8",
	[OP_EMPTY_SET] = "EMPTY_SET", [OP_ADDITEMS] = "ADDITEMS",
	[OP_FROZENSET] = "FROZENSET", [OP_NEWOBJ_EX] = "NEWOBJ_EX",
	[OP_STACK_GLOBAL] = "STACK_GLOBAL", [OP_MEMOIZE] = "MEMOIZE",
	[OP_FRAME] = "FRAME", [OP_BYTEARRAY8] = "BYTEARRAY8",
	[OP_NEXT_BUFFER] = "NEXT_BUFFER",
	[OP_READONLY_BUFFER] = "READONLY_BUFFER",
};

/* Every node this file hands out is the first member of one of these. */
struct node {
	struct ckfs_pv pv;
	uint32_t size;      /* see the top of the file */
	uint16_t height;    /* likewise */
	uint8_t referenced; /* some node has (had) this one as a child */
	uint8_t again;      /* pushed a second time: a memo fetch or DUP */
};

_Static_assert(CKFS_MAX_PICKLE_NESTING < UINT16_MAX, "height is 16 bits");
_Static_assert(CKFS_MAX_PICKLE_TREE < UINT32_MAX, "size is 32 bits");

/* Height and expanded size of a node being built. */
struct shape {
	uint32_t height, size;
};

#define SHAPE_EMPTY ((struct shape){ 1, 1 })

/* DICT nodes are one of these. */
struct dict_node {
	struct node n;
	struct str_index *index; /* string keys of a large dict, or NULL */
};

static struct node *node_of(struct ckfs_pv *v)
{
	return (struct node *)v;
}

static struct str_index **index_of(struct ckfs_pv *dict)
{
	return &((struct dict_node *)dict)->index;
}

/* Open-addressing hash of the positions of a dict's string keys, built once
 * a dict is too large for a linear duplicate check. */
struct str_index {
	uint32_t *slots; /* key position + 1; 0 is empty */
	size_t cap;      /* power of two */
	size_t used;
};

#define DICT_LINEAR_MAX 32u

struct memo_slot {
	uint32_t key; /* index + 1; 0 is empty */
	struct ckfs_pv *val;
};

struct memo {
	struct ckfs_pv **dense; /* indices below dense_max */
	size_t dense_cap, dense_max;
	struct memo_slot *sparse; /* indices from dense_max up */
	size_t sparse_cap, sparse_used;
	size_t count; /* distinct indices set, the next MEMOIZE index */
};

struct vm {
	const unsigned char *buf;
	size_t len, pos;
	size_t at;         /* offset of the opcode being run */
	unsigned char op;
	const char *label;
	struct ckfs_arena *arena;
	struct ckfs_error *err;

	struct ckfs_pv **stack;
	size_t sp, stack_cap;
	size_t *marks;
	size_t nmarks, marks_cap;
	size_t fence; /* stack items below the innermost mark */
	struct memo memo;

	size_t nodes, items;
	size_t synth, synth_max; /* bytes made by evaluated calls */
	uint64_t seed;           /* of the dict key hash */
	/* Shared immutable leaves: None, True, False, (), BININT1 values. */
	struct ckfs_pv *none, *yes, *no, *empty_tuple;
	struct ckfs_pv *small_int[256];
	unsigned flags; /* CKFS_PICKLE_ORIGINS */
};

static void vm_fail(struct vm *vm, enum ckfs_code code, const char *fmt, ...)
	CKFS_PRINTF(3, 4);

static void vm_fail(struct vm *vm, enum ckfs_code code, const char *fmt, ...)
{
	char what[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	ckfs_fail(vm->err, code, "'%s': %s at offset %zu", vm->label, what,
		  vm->at);
}

/* Record "'label': <what> at offset N" and yield code. The code is spelled
 * at the call site so the compiler sees every error path return non-zero
 * (vm_fail, being variadic, is never inlined). */
#define FAIL(vm, code, ...) (vm_fail((vm), (code), __VA_ARGS__), (code))

static const char *op_name(unsigned char op)
{
	return op_names[op] ? op_names[op] : "?";
}

#define nomem(vm) FAIL(vm, CKFS_E_NOMEM, "out of memory")
#define truncated(vm) FAIL(vm, CKFS_E_TRUNCATED, "unexpected end of pickle")
#define underflow(vm)                                                        \
	FAIL(vm, CKFS_E_FORMAT, "stack underflow in %s", op_name((vm)->op))

/* ---- input cursor ---------------------------------------------------- */

static enum ckfs_code take(struct vm *vm, uint64_t n,
			   const unsigned char **p)
{
	if (n > vm->len - vm->pos)
		return truncated(vm);
	*p = vm->buf + vm->pos;
	vm->pos += (size_t)n;
	return CKFS_OK;
}

static uint32_t rd_u16(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t rd_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t rd_u64(const unsigned char *p)
{
	return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

/* Read an operand length of 1, 4 (unsigned or signed) or 8 bytes. */
static enum ckfs_code take_len(struct vm *vm, int width, int is_signed,
			       uint64_t *n)
{
	const unsigned char *p;

	CKFS_TRY(take(vm, (uint64_t)width, &p));
	if (width == 1) {
		*n = p[0];
	} else if (width == 4) {
		uint32_t u = rd_u32(p);
		if (is_signed && (u & 0x80000000u))
			return FAIL(vm, CKFS_E_FORMAT,
				    "negative length %" PRId32 " in %s",
				    (int32_t)u, op_name(vm->op));
		*n = u;
	} else {
		*n = rd_u64(p);
	}
	return CKFS_OK;
}

/* ---- nodes ----------------------------------------------------------- */

/* A zeroed node with `extra` bytes after it (a tuple's items). */
static enum ckfs_code node_alloc(struct vm *vm, enum ckfs_pv_kind kind,
				 size_t extra, struct ckfs_pv **out)
{
	size_t size = kind == CKFS_PV_DICT ? sizeof(struct dict_node) :
					     sizeof(struct node);
	struct node *n;

	if (vm->nodes >= CKFS_MAX_PICKLE_NODES)
		return FAIL(vm, CKFS_E_LIMIT, "more than %u objects",
			    CKFS_MAX_PICKLE_NODES);
	n = ckfs_arena_alloc(vm->arena, size + extra);
	if (!n)
		return nomem(vm);
	vm->nodes++;
	n->pv.kind = kind;
	n->pv.at = (uint32_t)vm->at; /* < CKFS_MAX_METADATA_BYTES */
	n->size = 1;
	*out = &n->pv;
	return CKFS_OK;
}

static void set_shape(struct ckfs_pv *v, struct shape sh)
{
	node_of(v)->height = (uint16_t)sh.height;
	node_of(v)->size = sh.size;
}

static enum ckfs_code node_new(struct vm *vm, enum ckfs_pv_kind kind,
			       struct ckfs_pv **out)
{
	return node_alloc(vm, kind, 0, out);
}

static enum ckfs_code int_new(struct vm *vm, int64_t i, struct ckfs_pv **out)
{
	CKFS_TRY(node_new(vm, CKFS_PV_INT, out));
	(*out)->u.i = i;
	return CKFS_OK;
}

/* A STR, BYTES or BIGINT node holding a copy of p[0..n). */
static enum ckfs_code blob_new(struct vm *vm, enum ckfs_pv_kind kind,
			       const void *p, size_t n, struct ckfs_pv **out)
{
	char *s = ckfs_arena_strndup(vm->arena, p, n);

	if (!s)
		return nomem(vm);
	CKFS_TRY(node_new(vm, kind, out));
	(*out)->u.str.s = s;
	(*out)->u.str.len = n;
	return CKFS_OK;
}

/* Add child to the shape of its (new or still unreferenced) parent and
 * mark it referenced. */
static enum ckfs_code adopt(struct vm *vm, struct ckfs_pv *child,
			    struct shape *sh)
{
	struct node *c;

	if (!child)
		return CKFS_OK;
	c = node_of(child);
	c->referenced = 1;
	if (c->height >= sh->height) {
		if (c->height >= CKFS_MAX_PICKLE_NESTING)
			return FAIL(vm, CKFS_E_LIMIT,
				    "nesting deeper than %u in %s",
				    CKFS_MAX_PICKLE_NESTING, op_name(vm->op));
		sh->height = c->height + 1u;
	}
	if (c->size > CKFS_MAX_PICKLE_TREE - sh->size)
		return FAIL(vm, CKFS_E_LIMIT,
			    "tree of more than %u nodes, counting shared objects at each use, in %s",
			    CKFS_MAX_PICKLE_TREE, op_name(vm->op));
	sh->size += c->size;
	return CKFS_OK;
}

/*
 * parent, which exists already, is about to refer to child (APPEND(S),
 * SETITEM(S), ADDITEMS, BUILD). Only a container nothing refers to yet may
 * grow: that rules out cycles and keeps every height and size exact.
 */
static enum ckfs_code attach(struct vm *vm, struct ckfs_pv *parent,
			     struct ckfs_pv *child)
{
	struct node *p = node_of(parent);
	const char *kind = ckfs_pv_kind_name(parent->kind);
	struct shape sh = { p->height, p->size };

	if (parent == child)
		return FAIL(vm, CKFS_E_UNSUPPORTED,
			    "%s would make %s contain itself",
			    op_name(vm->op), kind);
	if (p->referenced)
		return FAIL(vm, CKFS_E_UNSUPPORTED,
			    "%s into %s that is already referenced (possible reference cycle)",
			    op_name(vm->op), kind);
	CKFS_TRY(adopt(vm, child, &sh));
	set_shape(parent, sh);
	return CKFS_OK;
}

static enum ckfs_code charge_items(struct vm *vm, size_t n)
{
	if (n > CKFS_MAX_PICKLE_ITEMS - vm->items)
		return FAIL(vm, CKFS_E_LIMIT, "more than %u container items",
			    CKFS_MAX_PICKLE_ITEMS);
	vm->items += n;
	return CKFS_OK;
}

/* Arena "realloc": room for *cap >= need pointers in each of arrs[0..narr). */
static enum ckfs_code grow_arrays(struct vm *vm, struct ckfs_pv ***arrs,
				  int narr, size_t n, size_t *cap, size_t need)
{
	size_t ncap = *cap ? *cap * 2 : 4;

	if (need <= *cap)
		return CKFS_OK;
	if (ncap < need)
		ncap = need;
	for (int i = 0; i < narr; i++) {
		struct ckfs_pv **a = ckfs_arena_calloc(vm->arena, ncap,
						       sizeof(*a));
		if (!a)
			return nomem(vm);
		if (n)
			memcpy(a, arrs[i], n * sizeof(*a));
		arrs[i] = a;
	}
	*cap = ncap;
	return CKFS_OK;
}

static enum ckfs_code seq_reserve(struct vm *vm, struct ckfs_pv *v, size_t extra)
{
	struct ckfs_pv **arr[1] = { v->u.seq.items };

	CKFS_TRY(charge_items(vm, extra));
	CKFS_TRY(grow_arrays(vm, arr, 1, v->u.seq.n, &v->u.seq.cap,
			     v->u.seq.n + extra));
	v->u.seq.items = arr[0];
	return CKFS_OK;
}

/* A TUPLE/LIST/SET node of items[0..n) (children of a new node). */
static enum ckfs_code seq_new(struct vm *vm, enum ckfs_pv_kind kind,
			      struct ckfs_pv *const *items, size_t n,
			      struct ckfs_pv **out)
{
	struct shape sh = SHAPE_EMPTY;
	struct ckfs_pv *v;

	for (size_t i = 0; i < n; i++)
		CKFS_TRY(adopt(vm, items[i], &sh));
	CKFS_TRY(charge_items(vm, n));
	/* n <= CKFS_MAX_PICKLE_ITEMS: no overflow. Later growth (ADDITEMS on
	 * a set) moves the items to an array of their own. */
	CKFS_TRY(node_alloc(vm, kind, n * sizeof(*items), &v));
	set_shape(v, sh);
	if (n) {
		v->u.seq.items = (struct ckfs_pv **)(node_of(v) + 1);
		memcpy(v->u.seq.items, items, n * sizeof(*items));
		v->u.seq.n = v->u.seq.cap = n;
	}
	*out = v;
	return CKFS_OK;
}

/* Append items[0..n) to an existing LIST or SET. */
static enum ckfs_code seq_extend(struct vm *vm, struct ckfs_pv *v,
				 struct ckfs_pv *const *items, size_t n)
{
	for (size_t i = 0; i < n; i++)
		CKFS_TRY(attach(vm, v, items[i]));
	CKFS_TRY(seq_reserve(vm, v, n));
	if (n)
		memcpy(v->u.seq.items + v->u.seq.n, items, n * sizeof(*items));
	v->u.seq.n += n;
	return CKFS_OK;
}

/* ---- dicts ----------------------------------------------------------- */

/* splitmix64's finalizer: every input bit reaches the low bits we mask. */
static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* FNV-1a from a per-load seed, so colliding keys cannot be precomputed. */
static uint64_t hash_bytes(const struct vm *vm, const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull ^ vm->seed;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return mix64(h);
}

static int str_eq(const struct ckfs_pv *v, const char *s, size_t n)
{
	return v->kind == CKFS_PV_STR && v->u.str.len == n &&
	       memcmp(v->u.str.s, s, n) == 0;
}

static void index_insert(struct str_index *x, uint64_t hash, size_t pos)
{
	size_t mask = x->cap - 1;
	size_t i = hash & mask;

	while (x->slots[i])
		i = (i + 1) & mask;
	x->slots[i] = (uint32_t)(pos + 1);
	x->used++;
}

/* (Re)build the index of d's string keys with room for `want` of them. */
static enum ckfs_code index_build(struct vm *vm, struct ckfs_pv *d, size_t want)
{
	struct str_index *x = *index_of(d);
	size_t cap = 64;

	while (cap < want * 2)
		cap *= 2;
	if (!x) {
		x = ckfs_arena_alloc(vm->arena, sizeof(*x));
		if (!x)
			return nomem(vm);
	}
	x->slots = ckfs_arena_calloc(vm->arena, cap, sizeof(*x->slots));
	if (!x->slots)
		return nomem(vm);
	x->cap = cap;
	x->used = 0;
	*index_of(d) = x;
	for (size_t i = 0; i < d->u.dict.n; i++) {
		const struct ckfs_pv *k = d->u.dict.keys[i];
		if (k->kind == CKFS_PV_STR)
			index_insert(x, hash_bytes(vm, k->u.str.s, k->u.str.len),
				     i);
	}
	return CKFS_OK;
}

/* Position of string key s in d, or -1; *hash is set when d is indexed. */
static enum ckfs_code dict_find(struct vm *vm, struct ckfs_pv *d,
				const char *s, size_t len, ptrdiff_t *pos,
				uint64_t *hash)
{
	struct str_index *x = *index_of(d);

	*pos = -1;
	if (!x && d->u.dict.n < DICT_LINEAR_MAX) {
		for (size_t i = 0; i < d->u.dict.n; i++)
			if (str_eq(d->u.dict.keys[i], s, len)) {
				*pos = (ptrdiff_t)i;
				break;
			}
		return CKFS_OK;
	}
	if (!x) {
		CKFS_TRY(index_build(vm, d, d->u.dict.n + 1));
		x = *index_of(d);
	}
	*hash = hash_bytes(vm, s, len);
	size_t mask = x->cap - 1;
	for (size_t i = *hash & mask; x->slots[i];
	     i = (i + 1) & mask) {
		size_t at = x->slots[i] - 1;
		if (str_eq(d->u.dict.keys[at], s, len)) {
			*pos = (ptrdiff_t)at;
			break;
		}
	}
	return CKFS_OK;
}

static enum ckfs_code dict_set(struct vm *vm, struct ckfs_pv *d,
			       struct ckfs_pv *key, struct ckfs_pv *val)
{
	struct str_index *x;
	ptrdiff_t pos = -1;
	uint64_t hash = 0;

	CKFS_TRY(attach(vm, d, key));
	CKFS_TRY(attach(vm, d, val));
	if (key->kind == CKFS_PV_STR) {
		CKFS_TRY(dict_find(vm, d, key->u.str.s, key->u.str.len, &pos,
				   &hash));
		if (pos >= 0) {
			d->u.dict.vals[pos] = val;
			return CKFS_OK;
		}
	}
	struct ckfs_pv **arrs[2] = { d->u.dict.keys, d->u.dict.vals };
	CKFS_TRY(charge_items(vm, 2));
	CKFS_TRY(grow_arrays(vm, arrs, 2, d->u.dict.n, &d->u.dict.cap,
			     d->u.dict.n + 1));
	d->u.dict.keys = arrs[0];
	d->u.dict.vals = arrs[1];
	d->u.dict.keys[d->u.dict.n] = key;
	d->u.dict.vals[d->u.dict.n] = val;
	d->u.dict.n++;
	x = *index_of(d);
	if (x && key->kind == CKFS_PV_STR) {
		if ((x->used + 1) * 2 > x->cap)
			CKFS_TRY(index_build(vm, d, x->used + 1));
		else
			index_insert(x, hash, d->u.dict.n - 1);
	}
	return CKFS_OK;
}

/* ---- stack and marks ------------------------------------------------- */

static enum ckfs_code push(struct vm *vm, struct ckfs_pv *v)
{
	if (vm->sp == vm->stack_cap) {
		size_t cap = vm->stack_cap * 2;
		struct ckfs_pv **s;

		if (vm->stack_cap >= CKFS_MAX_PICKLE_STACK)
			return FAIL(vm, CKFS_E_LIMIT,
				    "stack deeper than %u",
				    CKFS_MAX_PICKLE_STACK);
		if (cap > CKFS_MAX_PICKLE_STACK)
			cap = CKFS_MAX_PICKLE_STACK;
		s = realloc(vm->stack, cap * sizeof(*s));
		if (!s)
			return nomem(vm);
		vm->stack = s;
		vm->stack_cap = cap;
	}
	vm->stack[vm->sp++] = v;
	return CKFS_OK;
}

/* Take the n items above the innermost mark; they are *items[0..n). */
static enum ckfs_code pop_n(struct vm *vm, size_t n, struct ckfs_pv ***items)
{
	if (vm->sp - vm->fence < n)
		return underflow(vm);
	vm->sp -= n;
	*items = vm->stack + vm->sp;
	return CKFS_OK;
}

static enum ckfs_code pop(struct vm *vm, struct ckfs_pv **v)
{
	struct ckfs_pv **items;

	CKFS_TRY(pop_n(vm, 1, &items));
	*v = items[0];
	return CKFS_OK;
}

static enum ckfs_code peek(struct vm *vm, struct ckfs_pv **v)
{
	if (vm->sp <= vm->fence)
		return underflow(vm);
	*v = vm->stack[vm->sp - 1];
	return CKFS_OK;
}

static enum ckfs_code push_mark(struct vm *vm)
{
	if (vm->nmarks == vm->marks_cap) {
		size_t cap = vm->marks_cap ? vm->marks_cap * 2 : 32;
		size_t *m;

		if (vm->marks_cap >= CKFS_MAX_PICKLE_MARKS)
			return FAIL(vm, CKFS_E_LIMIT,
				    "more than %u nested marks",
				    CKFS_MAX_PICKLE_MARKS);
		if (cap > CKFS_MAX_PICKLE_MARKS)
			cap = CKFS_MAX_PICKLE_MARKS;
		m = realloc(vm->marks, cap * sizeof(*m));
		if (!m)
			return nomem(vm);
		vm->marks = m;
		vm->marks_cap = cap;
	}
	vm->marks[vm->nmarks++] = vm->sp;
	vm->fence = vm->sp;
	return CKFS_OK;
}

/* Drop the innermost mark: the items pushed since are stack[*k..sp). */
static enum ckfs_code pop_mark(struct vm *vm, size_t *k)
{
	if (!vm->nmarks)
		return FAIL(vm, CKFS_E_FORMAT, "%s without MARK",
			    op_name(vm->op));
	*k = vm->marks[--vm->nmarks];
	vm->fence = vm->nmarks ? vm->marks[vm->nmarks - 1] : 0;
	return CKFS_OK;
}

/* The object below the items of a just-popped mark at k (APPENDS etc.). */
static enum ckfs_code below_mark(struct vm *vm, size_t k, struct ckfs_pv **v)
{
	if (k <= vm->fence)
		return underflow(vm);
	*v = vm->stack[k - 1];
	return CKFS_OK;
}

/* ---- memo ------------------------------------------------------------ */

static struct memo_slot *sparse_slot(const struct memo *m, uint32_t key)
{
	size_t mask = m->sparse_cap - 1;
	size_t i = mix64(key) & mask;

	while (m->sparse[i].key && m->sparse[i].key != key)
		i = (i + 1) & mask;
	return &m->sparse[i];
}

static enum ckfs_code memo_put(struct vm *vm, uint64_t idx)
{
	struct memo *m = &vm->memo;
	struct ckfs_pv *v;

	CKFS_TRY(peek(vm, &v));
	if (idx >= CKFS_MAX_PICKLE_MEMO)
		return FAIL(vm, CKFS_E_LIMIT,
			    "memo index %" PRIu64 " exceeds the limit of %u",
			    idx, CKFS_MAX_PICKLE_MEMO);
	if (idx < m->dense_max) {
		if (idx >= m->dense_cap) {
			size_t cap = m->dense_cap ? m->dense_cap * 2 : 1024;
			struct ckfs_pv **d;

			if (cap <= idx)
				cap = (size_t)idx + 1;
			if (cap > m->dense_max)
				cap = m->dense_max;
			d = realloc(m->dense, cap * sizeof(*d));
			if (!d)
				return nomem(vm);
			memset(d + m->dense_cap, 0,
			       (cap - m->dense_cap) * sizeof(*d));
			m->dense = d;
			m->dense_cap = cap;
		}
		m->count += !m->dense[idx];
		m->dense[idx] = v;
		return CKFS_OK;
	}
	if ((m->sparse_used + 1) * 2 > m->sparse_cap) {
		struct memo_slot *old = m->sparse;
		size_t old_cap = m->sparse_cap;
		size_t cap = old_cap ? old_cap * 2 : 64;

		m->sparse = calloc(cap, sizeof(*m->sparse));
		if (!m->sparse) {
			m->sparse = old;
			return nomem(vm);
		}
		m->sparse_cap = cap;
		for (size_t i = 0; i < old_cap; i++)
			if (old[i].key)
				*sparse_slot(m, old[i].key) = old[i];
		free(old);
	}
	struct memo_slot *s = sparse_slot(m, (uint32_t)idx + 1);
	if (!s->key) {
		s->key = (uint32_t)idx + 1;
		m->sparse_used++;
		m->count++;
	}
	s->val = v;
	return CKFS_OK;
}

static enum ckfs_code memo_get(struct vm *vm, uint64_t idx)
{
	struct memo *m = &vm->memo;
	struct ckfs_pv *v = NULL;

	if (idx < m->dense_cap)
		v = m->dense[idx];
	else if (idx >= m->dense_max && idx < CKFS_MAX_PICKLE_MEMO &&
		 m->sparse_cap)
		v = sparse_slot(m, (uint32_t)idx + 1)->val;
	if (!v)
		return FAIL(vm, CKFS_E_FORMAT,
			    "memo index %" PRIu64 " out of range", idx);
	node_of(v)->again = 1;
	return push(vm, v);
}

/* ---- evaluated calls ------------------------------------------------- */

static int is_builtin(const struct ckfs_pv *fn, const char *name)
{
	return ckfs_pv_is_global(fn, "builtins", name) ||
	       ckfs_pv_is_global(fn, "__builtin__", name);
}

static int is_latin1_name(const struct ckfs_pv *v)
{
	return ckfs_pv_is_str(v, "latin1") || ckfs_pv_is_str(v, "latin-1");
}

static enum ckfs_code charge_synth(struct vm *vm, size_t n)
{
	if (n > vm->synth_max - vm->synth)
		return FAIL(vm, CKFS_E_LIMIT,
			    "evaluated calls make more than %zu bytes",
			    vm->synth_max);
	vm->synth += n;
	return CKFS_OK;
}

/* BYTES from a str whose code points are 0..255 (protocol 2's encoding of
 * bytes and bytearray: _codecs.encode(s, 'latin1'), bytearray(s, 'latin-1')). */
static enum ckfs_code latin1_bytes(struct vm *vm, const struct ckfs_pv *s,
				   struct ckfs_pv **out)
{
	const unsigned char *p = (const unsigned char *)s->u.str.s;
	size_t n = s->u.str.len, o = 0;
	char *b;

	CKFS_TRY(charge_synth(vm, n + 1));
	b = ckfs_arena_alloc(vm->arena, n + 1);
	if (!b)
		return nomem(vm);
	for (size_t i = 0; i < n; i++) {
		if (p[i] < 0x80) {
			b[o++] = (char)p[i];
		} else if ((p[i] == 0xc2 || p[i] == 0xc3) && i + 1 < n &&
			   (p[i + 1] & 0xc0) == 0x80) {
			b[o++] = (char)((p[i] & 0x1f) << 6 | (p[i + 1] & 0x3f));
			i++;
		} else {
			return FAIL(vm, CKFS_E_FORMAT,
				    "latin-1 text has a character above U+00FF or bad UTF-8 (text byte %zu)",
				    i);
		}
	}
	b[o] = '\0';
	CKFS_TRY(node_new(vm, CKFS_PV_BYTES, out));
	(*out)->u.str.s = b;
	(*out)->u.str.len = o;
	return CKFS_OK;
}

/* getattr(GLOBAL mod Cls, 'attr') -> GLOBAL mod Cls.attr */
static enum ckfs_code getattr_global(struct vm *vm, const struct ckfs_pv *cls,
				     const struct ckfs_pv *attr,
				     struct ckfs_pv **out)
{
	size_t a = strlen(cls->u.global.name);
	char *name;

	if (memchr(attr->u.str.s, '\0', attr->u.str.len))
		return FAIL(vm, CKFS_E_FORMAT, "NUL byte in getattr name");
	CKFS_TRY(charge_synth(vm, a + attr->u.str.len + 2));
	name = ckfs_arena_alloc(vm->arena, a + attr->u.str.len + 2);
	if (!name)
		return nomem(vm);
	memcpy(name, cls->u.global.name, a);
	name[a] = '.';
	memcpy(name + a + 1, attr->u.str.s, attr->u.str.len);
	CKFS_TRY(node_new(vm, CKFS_PV_GLOBAL, out));
	(*out)->u.global.module = cls->u.global.module;
	(*out)->u.global.name = name;
	return CKFS_OK;
}

/* REDUCE: fn(*args), evaluated for the plain-data calls of pickle.h. */
static enum ckfs_code reduce(struct vm *vm, struct ckfs_pv *fn,
			     struct ckfs_pv *args, struct ckfs_pv **out)
{
	size_t n = args->u.seq.n;
	struct ckfs_pv **a = args->u.seq.items;

	if (fn->kind == CKFS_PV_GLOBAL) {
		if (n == 0 && ckfs_pv_is_global(fn, "collections", "OrderedDict")) {
			CKFS_TRY(node_new(vm, CKFS_PV_DICT, out));
			set_shape(*out, SHAPE_EMPTY);
			return CKFS_OK;
		}
		if (n == 1 && a[0]->kind == CKFS_PV_TUPLE &&
		    ckfs_pv_is_global(fn, "torch", "Size")) {
			*out = a[0];
			return CKFS_OK;
		}
		if (n == 2 && a[0]->kind == CKFS_PV_STR && is_latin1_name(a[1]) &&
		    (ckfs_pv_is_global(fn, "_codecs", "encode") ||
		     is_builtin(fn, "bytearray")))
			return latin1_bytes(vm, a[0], out);
		if (n == 0 && (is_builtin(fn, "bytes") ||
			       is_builtin(fn, "bytearray")))
			return blob_new(vm, CKFS_PV_BYTES, "", 0, out);
		if (n == 1 && a[0]->kind == CKFS_PV_BYTES &&
		    is_builtin(fn, "bytearray")) {
			/* Immutable in the tree: share the buffer. */
			CKFS_TRY(node_new(vm, CKFS_PV_BYTES, out));
			(*out)->u.str = a[0]->u.str;
			return CKFS_OK;
		}
		if (n <= 1 && (is_builtin(fn, "set") ||
			       is_builtin(fn, "frozenset"))) {
			if (n == 0)
				return seq_new(vm, CKFS_PV_SET, NULL, 0, out);
			if (a[0]->kind == CKFS_PV_LIST ||
			    a[0]->kind == CKFS_PV_TUPLE ||
			    a[0]->kind == CKFS_PV_SET)
				return seq_new(vm, CKFS_PV_SET,
					       a[0]->u.seq.items,
					       a[0]->u.seq.n, out);
		}
		if (n == 2 && a[0]->kind == CKFS_PV_GLOBAL &&
		    a[1]->kind == CKFS_PV_STR && is_builtin(fn, "getattr"))
			return getattr_global(vm, a[0], a[1], out);
	}

	struct shape sh = SHAPE_EMPTY;
	CKFS_TRY(adopt(vm, fn, &sh));
	CKFS_TRY(adopt(vm, args, &sh));
	CKFS_TRY(node_new(vm, CKFS_PV_CALL, out));
	set_shape(*out, sh);
	(*out)->u.call.fn = fn;
	(*out)->u.call.args = args;
	return CKFS_OK;
}

/* ---- opcodes --------------------------------------------------------- */

static enum ckfs_code global_new(struct vm *vm, const char *module,
				 size_t mlen, const char *name, size_t nlen,
				 int copy, struct ckfs_pv **out)
{
	if (!mlen || !nlen)
		return FAIL(vm, CKFS_E_FORMAT, "empty name in %s",
			    op_name(vm->op));
	if (memchr(module, '\0', mlen) || memchr(name, '\0', nlen))
		return FAIL(vm, CKFS_E_FORMAT, "NUL byte in %s name",
			    op_name(vm->op));
	if (copy) {
		module = ckfs_arena_strndup(vm->arena, module, mlen);
		name = ckfs_arena_strndup(vm->arena, name, nlen);
		if (!module || !name)
			return nomem(vm);
	}
	CKFS_TRY(node_new(vm, CKFS_PV_GLOBAL, out));
	(*out)->u.global.module = module;
	(*out)->u.global.name = name;
	return CKFS_OK;
}

static enum ckfs_code read_line(struct vm *vm, const char **s, size_t *n)
{
	const unsigned char *start = vm->buf + vm->pos;
	const unsigned char *nl = memchr(start, '\n', vm->len - vm->pos);

	if (!nl)
		return truncated(vm);
	*s = (const char *)start;
	*n = (size_t)(nl - start);
	vm->pos += *n + 1;
	return CKFS_OK;
}

static enum ckfs_code op_global(struct vm *vm)
{
	const char *mod, *name;
	size_t mlen, nlen;
	struct ckfs_pv *v;

	CKFS_TRY(read_line(vm, &mod, &mlen));
	CKFS_TRY(read_line(vm, &name, &nlen));
	CKFS_TRY(global_new(vm, mod, mlen, name, nlen, 1, &v));
	return push(vm, v);
}

static enum ckfs_code op_stack_global(struct vm *vm)
{
	struct ckfs_pv **mn, *v;

	CKFS_TRY(pop_n(vm, 2, &mn));
	if (mn[0]->kind != CKFS_PV_STR || mn[1]->kind != CKFS_PV_STR)
		return FAIL(vm, CKFS_E_FORMAT,
			    "STACK_GLOBAL on %s and %s, not str",
			    ckfs_pv_kind_name(mn[0]->kind),
			    ckfs_pv_kind_name(mn[1]->kind));
	CKFS_TRY(global_new(vm, mn[0]->u.str.s, mn[0]->u.str.len,
			    mn[1]->u.str.s, mn[1]->u.str.len, 0, &v));
	return push(vm, v);
}

static enum ckfs_code want_kind(struct vm *vm, const struct ckfs_pv *v,
				enum ckfs_pv_kind kind, const char *role)
{
	if (v->kind == kind)
		return CKFS_OK;
	return FAIL(vm, CKFS_E_FORMAT, "%s %s: expected %s, got %s",
		    op_name(vm->op), role, ckfs_pv_kind_name(kind),
		    ckfs_pv_kind_name(v->kind));
}

/* The target of APPEND(S), SETITEM(S), ADDITEMS. */
static enum ckfs_code want_target(struct vm *vm, const struct ckfs_pv *t,
				  enum ckfs_pv_kind kind)
{
	if (t->kind == kind)
		return CKFS_OK;
	return FAIL(vm,
		    t->kind == CKFS_PV_CALL || t->kind == CKFS_PV_OBJECT ?
		    CKFS_E_UNSUPPORTED : CKFS_E_FORMAT,
		    "%s on %s", op_name(vm->op), ckfs_pv_kind_name(t->kind));
}

static enum ckfs_code op_reduce(struct vm *vm)
{
	struct ckfs_pv **fa, *v;

	CKFS_TRY(pop_n(vm, 2, &fa));
	CKFS_TRY(want_kind(vm, fa[1], CKFS_PV_TUPLE, "arguments"));
	CKFS_TRY(reduce(vm, fa[0], fa[1], &v));
	return push(vm, v);
}

static enum ckfs_code op_newobj(struct vm *vm, int ex)
{
	struct ckfs_pv **c, *v;
	struct shape sh = SHAPE_EMPTY;

	CKFS_TRY(pop_n(vm, ex ? 3 : 2, &c));
	CKFS_TRY(want_kind(vm, c[1], CKFS_PV_TUPLE, "arguments"));
	if (ex)
		CKFS_TRY(want_kind(vm, c[2], CKFS_PV_DICT, "keyword arguments"));
	for (int i = 0; i < (ex ? 3 : 2); i++)
		CKFS_TRY(adopt(vm, c[i], &sh));
	CKFS_TRY(node_new(vm, CKFS_PV_OBJECT, &v));
	set_shape(v, sh);
	v->u.obj.cls = c[0];
	v->u.obj.args = c[1];
	v->u.obj.kwargs = ex ? c[2] : NULL;
	return push(vm, v);
}

static enum ckfs_code op_build(struct vm *vm)
{
	struct ckfs_pv *state, *t;

	CKFS_TRY(pop(vm, &state));
	CKFS_TRY(peek(vm, &t));
	switch (t->kind) {
	case CKFS_PV_DICT:
		return CKFS_OK; /* inst.__dict__.update(): nn.Module _metadata */
	case CKFS_PV_OBJECT:
		CKFS_TRY(attach(vm, t, state));
		t->u.obj.state = state;
		return CKFS_OK;
	case CKFS_PV_CALL:
		CKFS_TRY(attach(vm, t, state));
		t->u.call.state = state;
		return CKFS_OK;
	default:
		return FAIL(vm, CKFS_E_FORMAT, "BUILD on %s",
			    ckfs_pv_kind_name(t->kind));
	}
}

static enum ckfs_code op_persid(struct vm *vm)
{
	struct ckfs_pv *pid, *v;
	struct shape sh = SHAPE_EMPTY;

	CKFS_TRY(pop(vm, &pid));
	CKFS_TRY(adopt(vm, pid, &sh));
	CKFS_TRY(node_new(vm, CKFS_PV_PERSID, &v));
	set_shape(v, sh);
	v->u.persid.pid = pid;
	return push(vm, v);
}

static enum ckfs_code op_tuple(struct vm *vm, size_t n, int marked)
{
	struct ckfs_pv **items, *v;
	size_t k;

	if (marked) {
		CKFS_TRY(pop_mark(vm, &k));
		n = vm->sp - k;
		vm->sp = k;
		items = vm->stack + k;
	} else {
		CKFS_TRY(pop_n(vm, n, &items));
	}
	CKFS_TRY(seq_new(vm, CKFS_PV_TUPLE, items, n, &v));
	return push(vm, v);
}

static enum ckfs_code op_empty(struct vm *vm, enum ckfs_pv_kind kind)
{
	struct ckfs_pv *v;

	CKFS_TRY(node_new(vm, kind, &v));
	set_shape(v, SHAPE_EMPTY);
	return push(vm, v);
}

/* APPEND(S) / ADDITEMS: items since the mark (or the top item) into the
 * LIST / SET below them. */
static enum ckfs_code op_extend(struct vm *vm, enum ckfs_pv_kind kind,
				int marked)
{
	struct ckfs_pv *t = NULL;
	size_t k;

	if (marked) {
		CKFS_TRY(pop_mark(vm, &k));
	} else {
		if (vm->sp - vm->fence < 2)
			return underflow(vm);
		k = vm->sp - 1;
	}
	CKFS_TRY(below_mark(vm, k, &t));
	CKFS_TRY(want_target(vm, t, kind));
	CKFS_TRY(seq_extend(vm, t, vm->stack + k, vm->sp - k));
	vm->sp = k;
	return CKFS_OK;
}

static enum ckfs_code op_setitems(struct vm *vm, int marked)
{
	struct ckfs_pv *d = NULL;
	size_t k;

	if (marked) {
		CKFS_TRY(pop_mark(vm, &k));
		if ((vm->sp - k) % 2)
			return FAIL(vm, CKFS_E_FORMAT,
				    "SETITEMS with odd item count %zu",
				    vm->sp - k);
	} else {
		if (vm->sp - vm->fence < 3)
			return underflow(vm);
		k = vm->sp - 2;
	}
	CKFS_TRY(below_mark(vm, k, &d));
	CKFS_TRY(want_target(vm, d, CKFS_PV_DICT));
	for (size_t i = k; i < vm->sp; i += 2)
		CKFS_TRY(dict_set(vm, d, vm->stack[i], vm->stack[i + 1]));
	vm->sp = k;
	return CKFS_OK;
}

static enum ckfs_code op_frozenset(struct vm *vm)
{
	struct ckfs_pv *v;
	size_t k;

	CKFS_TRY(pop_mark(vm, &k));
	CKFS_TRY(seq_new(vm, CKFS_PV_SET, vm->stack + k, vm->sp - k, &v));
	vm->sp = k;
	return push(vm, v);
}

/* LONG1 / LONG4: n bytes of little-endian two's complement. */
static enum ckfs_code op_long(struct vm *vm, int width)
{
	const unsigned char *p;
	struct ckfs_pv *v;
	uint64_t n, u = 0;

	CKFS_TRY(take_len(vm, width, 1, &n));
	CKFS_TRY(take(vm, n, &p));
	if (n > 8) {
		unsigned char sign = p[7] & 0x80 ? 0xff : 0x00;
		for (uint64_t i = 8; i < n; i++)
			if (p[i] != sign) {
				CKFS_TRY(blob_new(vm, CKFS_PV_BIGINT, p,
						  (size_t)n, &v));
				return push(vm, v);
			}
	}
	size_t m = n > 8 ? 8 : (size_t)n;
	for (size_t i = 0; i < m; i++)
		u |= (uint64_t)p[i] << (8 * i);
	if (m && m < 8 && (p[m - 1] & 0x80))
		u |= ~(uint64_t)0 << (8 * m);
	CKFS_TRY(int_new(vm, (int64_t)u, &v));
	return push(vm, v);
}

static enum ckfs_code op_blob(struct vm *vm, enum ckfs_pv_kind kind,
			      int width, int is_signed)
{
	const unsigned char *p;
	struct ckfs_pv *v;
	uint64_t n;

	CKFS_TRY(take_len(vm, width, is_signed, &n));
	CKFS_TRY(take(vm, n, &p));
	CKFS_TRY(blob_new(vm, kind, p, (size_t)n, &v));
	return push(vm, v);
}

static enum ckfs_code op_int(struct vm *vm, int width)
{
	const unsigned char *p;
	struct ckfs_pv *v;
	int64_t i;

	CKFS_TRY(take(vm, (uint64_t)width, &p));
	if (width == 1 && !(vm->flags & CKFS_PICKLE_ORIGINS)) {
		if (!vm->small_int[p[0]]) {
			CKFS_TRY(int_new(vm, p[0], &vm->small_int[p[0]]));
			node_of(vm->small_int[p[0]])->again = 1; /* shared */
		}
		return push(vm, vm->small_int[p[0]]);
	}
	if (width == 1)
		i = p[0];
	else if (width == 2)
		i = rd_u16(p);
	else
		i = (int32_t)rd_u32(p);
	CKFS_TRY(int_new(vm, i, &v));
	return push(vm, v);
}

static enum ckfs_code op_float(struct vm *vm)
{
	const unsigned char *p;
	struct ckfs_pv *v;
	uint64_t u = 0;
	double f;

	CKFS_TRY(take(vm, 8, &p));
	for (int i = 0; i < 8; i++)
		u = u << 8 | p[i];
	memcpy(&f, &u, sizeof(f));
	CKFS_TRY(node_new(vm, CKFS_PV_FLOAT, &v));
	v->u.f = f;
	return push(vm, v);
}

static enum ckfs_code step(struct vm *vm, struct ckfs_pv **out)
{
	const unsigned char *p;
	uint64_t n;
	size_t k;

	switch (vm->op) {
	case OP_PROTO:
		CKFS_TRY(take(vm, 1, &p));
		if (p[0] > HIGHEST_PROTOCOL)
			return FAIL(vm, CKFS_E_UNSUPPORTED,
				    "unsupported pickle protocol %u", p[0]);
		return CKFS_OK;
	case OP_FRAME:
		CKFS_TRY(take_len(vm, 8, 0, &n));
		if (n > vm->len - vm->pos)
			return truncated(vm);
		return CKFS_OK;
	case OP_STOP:
		return pop(vm, out);
	case OP_MARK:
		return push_mark(vm);
	case OP_POP:
		if (vm->sp > vm->fence) {
			vm->sp--;
			return CKFS_OK;
		}
		if (!vm->nmarks)
			return underflow(vm);
		return pop_mark(vm, &k); /* as Python: POP on a bare mark */
	case OP_POP_MARK:
		CKFS_TRY(pop_mark(vm, &k));
		vm->sp = k;
		return CKFS_OK;
	case OP_DUP: {
		struct ckfs_pv *v;
		CKFS_TRY(peek(vm, &v));
		node_of(v)->again = 1;
		return push(vm, v);
	}
	case OP_GLOBAL:
		return op_global(vm);
	case OP_STACK_GLOBAL:
		return op_stack_global(vm);
	case OP_REDUCE:
		return op_reduce(vm);
	case OP_NEWOBJ:
		return op_newobj(vm, 0);
	case OP_NEWOBJ_EX:
		return op_newobj(vm, 1);
	case OP_BUILD:
		return op_build(vm);
	case OP_BINPERSID:
		return op_persid(vm);
	case OP_BINPUT:
		CKFS_TRY(take_len(vm, 1, 0, &n));
		return memo_put(vm, n);
	case OP_LONG_BINPUT:
		CKFS_TRY(take_len(vm, 4, 0, &n));
		return memo_put(vm, n);
	case OP_MEMOIZE:
		return memo_put(vm, vm->memo.count);
	case OP_BINGET:
		CKFS_TRY(take_len(vm, 1, 0, &n));
		return memo_get(vm, n);
	case OP_LONG_BINGET:
		CKFS_TRY(take_len(vm, 4, 0, &n));
		return memo_get(vm, n);
	case OP_EMPTY_TUPLE:
		return push(vm, vm->empty_tuple);
	case OP_TUPLE1:
		return op_tuple(vm, 1, 0);
	case OP_TUPLE2:
		return op_tuple(vm, 2, 0);
	case OP_TUPLE3:
		return op_tuple(vm, 3, 0);
	case OP_TUPLE:
		return op_tuple(vm, 0, 1);
	case OP_EMPTY_LIST:
		return op_empty(vm, CKFS_PV_LIST);
	case OP_EMPTY_DICT:
		return op_empty(vm, CKFS_PV_DICT);
	case OP_EMPTY_SET:
		return op_empty(vm, CKFS_PV_SET);
	case OP_APPEND:
		return op_extend(vm, CKFS_PV_LIST, 0);
	case OP_APPENDS:
		return op_extend(vm, CKFS_PV_LIST, 1);
	case OP_ADDITEMS:
		return op_extend(vm, CKFS_PV_SET, 1);
	case OP_SETITEM:
		return op_setitems(vm, 0);
	case OP_SETITEMS:
		return op_setitems(vm, 1);
	case OP_FROZENSET:
		return op_frozenset(vm);
	case OP_NONE:
		return push(vm, vm->none);
	case OP_NEWTRUE:
		return push(vm, vm->yes);
	case OP_NEWFALSE:
		return push(vm, vm->no);
	case OP_BININT1:
		return op_int(vm, 1);
	case OP_BININT2:
		return op_int(vm, 2);
	case OP_BININT:
		return op_int(vm, 4);
	case OP_LONG1:
		return op_long(vm, 1);
	case OP_LONG4:
		return op_long(vm, 4);
	case OP_BINFLOAT:
		return op_float(vm);
	case OP_SHORT_BINUNICODE:
		return op_blob(vm, CKFS_PV_STR, 1, 0);
	case OP_BINUNICODE:
		return op_blob(vm, CKFS_PV_STR, 4, 0);
	case OP_BINUNICODE8:
		return op_blob(vm, CKFS_PV_STR, 8, 0);
	case OP_SHORT_BINSTRING:
		return op_blob(vm, CKFS_PV_STR, 1, 0);
	case OP_BINSTRING:
		return op_blob(vm, CKFS_PV_STR, 4, 1);
	case OP_SHORT_BINBYTES:
		return op_blob(vm, CKFS_PV_BYTES, 1, 0);
	case OP_BINBYTES:
		return op_blob(vm, CKFS_PV_BYTES, 4, 0);
	case OP_BINBYTES8:
	case OP_BYTEARRAY8:
		return op_blob(vm, CKFS_PV_BYTES, 8, 0);
	case OP_INT:
	case OP_LONG:
	case OP_STRING:
	case OP_UNICODE:
	case OP_FLOAT:
	case OP_PUT:
	case OP_GET:
	case OP_DICT:
	case OP_LIST:
	case OP_INST:
	case OP_OBJ:
	case OP_PERSID:
	case OP_EXT1:
	case OP_EXT2:
	case OP_EXT4:
	case OP_NEXT_BUFFER:
	case OP_READONLY_BUFFER:
		return FAIL(vm, CKFS_E_UNSUPPORTED,
			    "unsupported pickle opcode %s",
			    op_name(vm->op));
	default:
		return FAIL(vm, CKFS_E_FORMAT, "unknown opcode 0x%02x",
			    vm->op);
	}
}

static enum ckfs_code run(struct vm *vm, struct ckfs_pv **out)
{
	struct ckfs_pv *v = NULL;

	/* Never NULL, so "stack + k" is defined even before the first push. */
	vm->stack_cap = 256;
	vm->stack = malloc(vm->stack_cap * sizeof(*vm->stack));
	if (!vm->stack)
		return nomem(vm);
	CKFS_TRY(node_new(vm, CKFS_PV_NONE, &vm->none));
	CKFS_TRY(node_new(vm, CKFS_PV_BOOL, &vm->yes));
	vm->yes->u.i = 1;
	CKFS_TRY(node_new(vm, CKFS_PV_BOOL, &vm->no));
	CKFS_TRY(seq_new(vm, CKFS_PV_TUPLE, NULL, 0, &vm->empty_tuple));
	node_of(vm->none)->again = node_of(vm->yes)->again = 1; /* shared leaves */
	node_of(vm->no)->again = node_of(vm->empty_tuple)->again = 1;
	while (!v) {
		vm->at = vm->pos;
		if (vm->pos >= vm->len)
			return truncated(vm);
		vm->op = vm->buf[vm->pos++];
		CKFS_TRY(step(vm, &v));
	}
	*out = v; /* bytes after STOP are never read */
	return CKFS_OK;
}

enum ckfs_code ckfs_pickle_load(const void *bytes, size_t len,
				const char *label, struct ckfs_arena *arena,
				struct ckfs_pv **out, struct ckfs_error *err)
{
	return ckfs_pickle_load_ex(bytes, len, label, arena, 0, out, err);
}

enum ckfs_code ckfs_pickle_load_ex(const void *bytes, size_t len, const char *label,
				   struct ckfs_arena *arena, unsigned flags, struct ckfs_pv **out,
				   struct ckfs_error *err)
{
	struct vm vm;
	enum ckfs_code rc;

	memset(&vm, 0, sizeof(vm));
	vm.label = label ? label : "pickle";
	vm.err = err;
	if (out)
		*out = NULL;
	if ((!bytes && len) || !arena || !out)
		return ckfs_fail(err, CKFS_E_INVALID,
				 "'%s': pickle load without %s", vm.label,
				 !arena ? "an arena" : !out ? "an output" : "bytes");
	if ((flags & CKFS_PICKLE_ORIGINS) && len > UINT32_MAX)
		return ckfs_fail(err, CKFS_E_LIMIT, "'%s': a pickle of more than 4 GiB",
				 vm.label);
	vm.buf = bytes;
	vm.len = len;
	vm.arena = arena;
	vm.flags = flags;
	/* Addresses vary with ASLR: enough to spoil precomputed collisions. */
	vm.seed = mix64((uint64_t)(uintptr_t)&vm ^
			(uint64_t)(uintptr_t)bytes << 17 ^
			(uint64_t)(uintptr_t)arena->head << 33);
	vm.memo.dense_max = len < CKFS_MAX_PICKLE_MEMO ? len : CKFS_MAX_PICKLE_MEMO;
	vm.synth_max = len > (SIZE_MAX - 65536) / CKFS_MAX_PICKLE_EXPANSION ?
			       SIZE_MAX :
			       len * CKFS_MAX_PICKLE_EXPANSION + 65536;
	rc = run(&vm, out);
	free(vm.stack);
	free(vm.marks);
	free(vm.memo.dense);
	free(vm.memo.sparse);
	return rc;
}

/* ---- helpers --------------------------------------------------------- */

int ckfs_pv_made_once(const struct ckfs_pv *v, uint32_t *at)
{
	if (!v || node_of((struct ckfs_pv *)v)->again)
		return 0;
	*at = v->at;
	return 1;
}

/* A NULL module or name matches any. */
int ckfs_pv_is_global(const struct ckfs_pv *v, const char *module,
		      const char *name)
{
	return v && v->kind == CKFS_PV_GLOBAL &&
	       (!module || strcmp(v->u.global.module, module) == 0) &&
	       (!name || strcmp(v->u.global.name, name) == 0);
}

int ckfs_pv_is_global_named(const struct ckfs_pv *v, const char *module_prefix,
			    const char *name)
{
	size_t n;

	if (!v || v->kind != CKFS_PV_GLOBAL || !module_prefix || !name ||
	    strcmp(v->u.global.name, name) != 0)
		return 0;
	n = strlen(module_prefix);
	if (strncmp(v->u.global.module, module_prefix, n) != 0)
		return 0;
	/* Whole module-path components: "torch" is not a prefix of "torchvision". */
	return n == 0 || module_prefix[n - 1] == '.' ||
	       v->u.global.module[n] == '\0' || v->u.global.module[n] == '.';
}

struct ckfs_pv *ckfs_pv_dict_get(const struct ckfs_pv *dict, const char *key)
{
	size_t n;

	if (!dict || dict->kind != CKFS_PV_DICT || !key)
		return NULL;
	n = strlen(key);
	for (size_t i = 0; i < dict->u.dict.n; i++)
		if (str_eq(dict->u.dict.keys[i], key, n))
			return dict->u.dict.vals[i];
	return NULL;
}

int ckfs_pv_is_str(const struct ckfs_pv *v, const char *s)
{
	return v && s && str_eq(v, s, strlen(s));
}

int ckfs_pv_is_seq(const struct ckfs_pv *v)
{
	return v && (v->kind == CKFS_PV_LIST || v->kind == CKFS_PV_TUPLE);
}

size_t ckfs_pv_seq_len(const struct ckfs_pv *v)
{
	return ckfs_pv_is_seq(v) ? v->u.seq.n : 0;
}

int ckfs_pv_is_none(const struct ckfs_pv *v)
{
	return !v || v->kind == CKFS_PV_NONE;
}

int ckfs_pv_get_int(const struct ckfs_pv *v, int64_t *out)
{
	if (!v || v->kind != CKFS_PV_INT)
		return 0;
	*out = v->u.i;
	return 1;
}

const char *ckfs_pv_kind_name(enum ckfs_pv_kind kind)
{
	switch (kind) {
	case CKFS_PV_NONE: return "none";
	case CKFS_PV_BOOL: return "bool";
	case CKFS_PV_INT: return "int";
	case CKFS_PV_BIGINT: return "big int";
	case CKFS_PV_FLOAT: return "float";
	case CKFS_PV_STR: return "str";
	case CKFS_PV_BYTES: return "bytes";
	case CKFS_PV_TUPLE: return "tuple";
	case CKFS_PV_LIST: return "list";
	case CKFS_PV_SET: return "set";
	case CKFS_PV_DICT: return "dict";
	case CKFS_PV_GLOBAL: return "global";
	case CKFS_PV_CALL: return "call";
	case CKFS_PV_OBJECT: return "object";
	case CKFS_PV_PERSID: return "persistent id";
	}
	return "unknown";
}
