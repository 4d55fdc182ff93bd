/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the pickle interpreter (src/fmt/pickle.c).
 *
 * Valid vectors in tests/fixtures/pickle/ come from CPython's pickler and
 * from torch (tests/gen/make_pickle_vectors.py); the trees they must decode
 * to are spelled out here. Broken inputs in tests/corpus/pickle/ are checked
 * for their exact code and message, and a few inputs too large to check in
 * (depth and stack bombs, a 100k-key dict) are built in memory.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "ckfs/limits.h"
#include "ckfs/pickle.h"
#include "test.h"

#define FIXTURE(name) CKFS_FIXTURES "/pickle/" name
#define CORPUS(name) CKFS_CORPUS "/pickle/" name

static struct ckfs_arena arena;
static struct ckfs_error err;

static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL;
	long n;

	*len = 0;
	if (!f) {
		fprintf(stderr, "cannot open '%s'\n", path);
		return NULL;
	}
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
	    fseek(f, 0, SEEK_SET) == 0) {
		/* Exactly sized, so ASan catches any read past the end. */
		buf = malloc(n ? (size_t)n : 1);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		*len = (size_t)n;
	}
	fclose(f);
	return buf;
}

static enum ckfs_code load(const void *bytes, size_t len, const char *label,
			   struct ckfs_pv **out)
{
	ckfs_error_clear(&err);
	return ckfs_pickle_load(bytes, len, label, &arena, out, &err);
}

/* Load a fixture that must parse; the arena is reset by the caller. */
static struct ckfs_pv *fixture(const char *path)
{
	struct ckfs_pv *v = NULL;
	size_t len;
	unsigned char *buf = slurp(path, &len);
	const char *base = strrchr(path, '/') + 1;

	CHECK(buf != NULL);
	if (!buf)
		return NULL;
	enum ckfs_code rc = load(buf, len, base, &v);
	if (rc != CKFS_OK)
		fprintf(stderr, "%s: %s\n", path, err.msg);
	CHECK_EQ_INT(rc, CKFS_OK);
	CHECK(rc != CKFS_OK || v != NULL);
	free(buf);
	return v;
}

/* ---- tree predicates (all NULL-safe) ---------------------------------- */

static const struct ckfs_pv *item(const struct ckfs_pv *v, size_t i)
{
	if (!v || (v->kind != CKFS_PV_TUPLE && v->kind != CKFS_PV_LIST &&
		   v->kind != CKFS_PV_SET) || i >= v->u.seq.n)
		return NULL;
	return v->u.seq.items[i];
}

static const struct ckfs_pv *get(const struct ckfs_pv *d, const char *key)
{
	return ckfs_pv_dict_get(d, key);
}

static int is_kind(const struct ckfs_pv *v, enum ckfs_pv_kind kind)
{
	return v && v->kind == kind;
}

static int is_int(const struct ckfs_pv *v, int64_t i)
{
	return is_kind(v, CKFS_PV_INT) && v->u.i == i;
}

static int is_bool(const struct ckfs_pv *v, int b)
{
	return is_kind(v, CKFS_PV_BOOL) && v->u.i == b;
}

static int is_seq(const struct ckfs_pv *v, enum ckfs_pv_kind kind, size_t n)
{
	return is_kind(v, kind) && v->u.seq.n == n;
}

/* A TUPLE/LIST/SET of exactly the ints vals[0..n). */
static int is_ints(const struct ckfs_pv *v, enum ckfs_pv_kind kind,
		   const int64_t *vals, size_t n)
{
	if (!is_seq(v, kind, n))
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!is_int(item(v, i), vals[i]))
			return 0;
	return 1;
}

#define INTS(v, kind, ...)                                                   \
	is_ints(v, kind, (const int64_t[]){ __VA_ARGS__ },                   \
		sizeof((const int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t))

static int is_blob(const struct ckfs_pv *v, enum ckfs_pv_kind kind,
		   const void *s, size_t n)
{
	return is_kind(v, kind) && v->u.str.len == n &&
	       memcmp(v->u.str.s, s, n) == 0 && v->u.str.s[n] == '\0';
}

#define BLOB(v, kind, lit) is_blob(v, kind, lit, sizeof(lit) - 1)

static int is_dict(const struct ckfs_pv *v, size_t n)
{
	return is_kind(v, CKFS_PV_DICT) && v->u.dict.n == n;
}

/* OBJECT of class module.name with no args, no kwargs. */
static int is_plain_object(const struct ckfs_pv *v, const char *module,
			   const char *name)
{
	return is_kind(v, CKFS_PV_OBJECT) &&
	       ckfs_pv_is_global(v->u.obj.cls, module, name) &&
	       is_seq(v->u.obj.args, CKFS_PV_TUPLE, 0) && !v->u.obj.kwargs;
}

static int is_call_of(const struct ckfs_pv *v, const char *module,
		      const char *name, size_t nargs)
{
	return is_kind(v, CKFS_PV_CALL) &&
	       ckfs_pv_is_global(v->u.call.fn, module, name) &&
	       is_seq(v->u.call.args, CKFS_PV_TUPLE, nargs);
}

/*
 * Recursive walk as a consumer would do it: the parser guarantees no path
 * deeper than CKFS_MAX_PICKLE_NESTING containers, so this terminates.
 * Counts nodes per path and checks the bound.
 */
static size_t walk(const struct ckfs_pv *v, unsigned depth)
{
	size_t n = 1;

	if (!v)
		return 0;
	CHECK(depth <= CKFS_MAX_PICKLE_NESTING);
	if (depth > CKFS_MAX_PICKLE_NESTING)
		return n;
	switch (v->kind) {
	case CKFS_PV_TUPLE:
	case CKFS_PV_LIST:
	case CKFS_PV_SET:
		for (size_t i = 0; i < v->u.seq.n; i++)
			n += walk(v->u.seq.items[i], depth + 1);
		break;
	case CKFS_PV_DICT:
		for (size_t i = 0; i < v->u.dict.n; i++)
			n += walk(v->u.dict.keys[i], depth + 1) +
			     walk(v->u.dict.vals[i], depth + 1);
		break;
	case CKFS_PV_CALL:
		n += walk(v->u.call.fn, depth + 1) +
		     walk(v->u.call.args, depth + 1) +
		     walk(v->u.call.state, depth + 1);
		break;
	case CKFS_PV_OBJECT:
		n += walk(v->u.obj.cls, depth + 1) +
		     walk(v->u.obj.args, depth + 1) +
		     walk(v->u.obj.kwargs, depth + 1) +
		     walk(v->u.obj.state, depth + 1);
		break;
	case CKFS_PV_PERSID:
		n += walk(v->u.persid.pid, depth + 1);
		break;
	default:
		break;
	}
	return n;
}

/* Number of CALL nodes reachable from v. */
static size_t count_calls(const struct ckfs_pv *v)
{
	size_t n = 0;

	if (!v)
		return 0;
	switch (v->kind) {
	case CKFS_PV_TUPLE:
	case CKFS_PV_LIST:
	case CKFS_PV_SET:
		for (size_t i = 0; i < v->u.seq.n; i++)
			n += count_calls(v->u.seq.items[i]);
		return n;
	case CKFS_PV_DICT:
		for (size_t i = 0; i < v->u.dict.n; i++)
			n += count_calls(v->u.dict.keys[i]) +
			     count_calls(v->u.dict.vals[i]);
		return n;
	case CKFS_PV_CALL:
		return 1;
	case CKFS_PV_OBJECT:
		return 1000; /* plain data never has objects */
	default:
		return 0;
	}
}

/* ---- valid vectors ---------------------------------------------------- */

/* plain_p{2,3,4,5}.pkl: the same dict at every protocol decodes to the
 * same tree (protocol 2 reaches bytes, sets and bytearrays through REDUCE of
 * _codecs.encode / set / frozenset / bytearray / bytes, all evaluated). */
static void check_plain(const char *path)
{
	static const char *const keys[] = {
		"none", "true", "false", "ints", "big", "floats", "str",
		"bytes", "bytearray", "tuples", "set", "frozenset",
		"empty_set", "nested", "shared_a", "shared_b", "keys",
	};
	const struct ckfs_pv *root, *v, *w;

	ckfs_arena_init(&arena);
	root = fixture(path);
	CHECK(is_dict(root, sizeof(keys) / sizeof(keys[0])));
	if (!is_dict(root, sizeof(keys) / sizeof(keys[0])))
		goto out;
	for (size_t i = 0; i < root->u.dict.n; i++)
		CHECK(ckfs_pv_is_str(root->u.dict.keys[i], keys[i]));
	CHECK_EQ_INT(count_calls(root), 0);
	CHECK(walk(root, 0) > 100);

	CHECK(is_kind(get(root, "none"), CKFS_PV_NONE));
	CHECK(is_bool(get(root, "true"), 1));
	CHECK(is_bool(get(root, "false"), 0));
	CHECK(INTS(get(root, "ints"), CKFS_PV_LIST, 0, 1, 255, 256, 65535,
		   65536, -1, -256, INT32_MAX, INT32_MIN, 2147483648ll,
		   -2147483649ll, INT64_MAX, INT64_MIN));

	v = get(root, "big");
	CHECK(is_seq(v, CKFS_PV_LIST, 5));
	CHECK(BLOB(item(v, 0), CKFS_PV_BIGINT,
		   "\x00\x00\x00\x00\x00\x00\x00\x80\x00"));
	CHECK(BLOB(item(v, 1), CKFS_PV_BIGINT,
		   "\xff\xff\xff\xff\xff\xff\xff\x7f\xff"));
	CHECK(BLOB(item(v, 2), CKFS_PV_BIGINT,
		   "\x00\x00\x00\x00\x00\x00\x00\x00\x01"));
	CHECK(BLOB(item(v, 3), CKFS_PV_BIGINT,
		   "\x00\x00\x00\xc0\x15\x12\x8b\xb9\x2f\x63\xd3\x60\xf3"));
	w = item(v, 4); /* 2**2100 via LONG4 */
	CHECK(is_kind(w, CKFS_PV_BIGINT) && w->u.str.len == 263);
	if (is_kind(w, CKFS_PV_BIGINT) && w->u.str.len == 263) {
		int zeros = 1;
		for (size_t i = 0; i < 262; i++)
			zeros &= w->u.str.s[i] == 0;
		CHECK(zeros);
		CHECK_EQ_INT((unsigned char)w->u.str.s[262], 0x10);
	}

	v = get(root, "floats");
	CHECK(is_seq(v, CKFS_PV_LIST, 9));
	for (size_t i = 0; i < 9; i++)
		CHECK(is_kind(item(v, i), CKFS_PV_FLOAT));
	if (is_seq(v, CKFS_PV_LIST, 9)) {
		double f[9];
		for (size_t i = 0; i < 9; i++)
			f[i] = item(v, i)->u.f;
		CHECK(f[0] == 0.0 && !signbit(f[0]));
		CHECK(f[1] == 0.0 && signbit(f[1]));
		CHECK(f[2] == 1.5);
		CHECK(f[3] == -2.25e-300);
		CHECK(f[4] == 1e308);
		CHECK(isinf(f[5]) && f[5] > 0);
		CHECK(isinf(f[6]) && f[6] < 0);
		CHECK(isnan(f[7]));
		CHECK(f[8] == 3.141592653589793);
	}

	v = get(root, "str");
	CHECK(is_seq(v, CKFS_PV_LIST, 4));
	CHECK(BLOB(item(v, 0), CKFS_PV_STR, ""));
	CHECK(BLOB(item(v, 1), CKFS_PV_STR, "hello"));
	CHECK(BLOB(item(v, 2), CKFS_PV_STR,
		   "h\xc3\xa9llo \xe2\x9c\x93 \xe6\x97\xa5\xe6\x9c\xac "
		   "\xf0\x9f\x99\x82"));
	CHECK(BLOB(item(v, 3), CKFS_PV_STR, "a\0b"));

	v = get(root, "bytes");
	CHECK(is_seq(v, CKFS_PV_LIST, 3));
	CHECK(BLOB(item(v, 0), CKFS_PV_BYTES, ""));
	CHECK(BLOB(item(v, 1), CKFS_PV_BYTES, "abc"));
	CHECK(BLOB(item(v, 2), CKFS_PV_BYTES, "\x00\x7f\x80\xff"));
	v = get(root, "bytearray");
	CHECK(is_seq(v, CKFS_PV_LIST, 2));
	CHECK(BLOB(item(v, 0), CKFS_PV_BYTES, "\x00xy\xff"));
	CHECK(BLOB(item(v, 1), CKFS_PV_BYTES, ""));

	v = get(root, "tuples");
	CHECK(is_seq(v, CKFS_PV_LIST, 5));
	CHECK(is_seq(item(v, 0), CKFS_PV_TUPLE, 0));
	CHECK(INTS(item(v, 1), CKFS_PV_TUPLE, 1));
	CHECK(INTS(item(v, 2), CKFS_PV_TUPLE, 1, 2));
	CHECK(INTS(item(v, 3), CKFS_PV_TUPLE, 1, 2, 3));
	CHECK(INTS(item(v, 4), CKFS_PV_TUPLE, 1, 2, 3, 4));

	CHECK(INTS(get(root, "set"), CKFS_PV_SET, 1, 2, 3));
	CHECK(INTS(get(root, "frozenset"), CKFS_PV_SET, 4, 5));
	CHECK(is_seq(get(root, "empty_set"), CKFS_PV_SET, 0));

	/* {"a": {"b": [1, [2, (3, {"c": None})]]}} */
	v = get(get(get(root, "nested"), "a"), "b");
	CHECK(is_dict(get(root, "nested"), 1));
	CHECK(is_seq(v, CKFS_PV_LIST, 2) && is_int(item(v, 0), 1));
	v = item(v, 1);
	CHECK(is_seq(v, CKFS_PV_LIST, 2) && is_int(item(v, 0), 2));
	v = item(v, 1);
	CHECK(is_seq(v, CKFS_PV_TUPLE, 2) && is_int(item(v, 0), 3));
	v = item(v, 1);
	CHECK(is_dict(v, 1) && is_kind(get(v, "c"), CKFS_PV_NONE));

	/* The same list referenced twice is one node. */
	CHECK(INTS(get(root, "shared_a"), CKFS_PV_LIST, 1, 2));
	CHECK(get(root, "shared_a") == get(root, "shared_b"));

	/* Non-string keys. */
	v = get(root, "keys");
	CHECK(is_dict(v, 4));
	if (is_dict(v, 4)) {
		CHECK(is_int(v->u.dict.keys[0], 1));
		CHECK(BLOB(v->u.dict.vals[0], CKFS_PV_STR, "one"));
		CHECK(is_int(v->u.dict.keys[1], -2));
		CHECK(BLOB(v->u.dict.vals[1], CKFS_PV_STR, "minus two"));
		CHECK(INTS(v->u.dict.keys[2], CKFS_PV_TUPLE, 1, 2));
		CHECK(BLOB(v->u.dict.vals[2], CKFS_PV_STR, "pair"));
		CHECK(is_kind(v->u.dict.keys[3], CKFS_PV_NONE));
		CHECK(BLOB(v->u.dict.vals[3], CKFS_PV_STR, "none"));
		CHECK(get(v, "one") == NULL);
	}
out:
	ckfs_arena_release(&arena);
}

static void test_plain_p2(void) { check_plain(FIXTURE("plain_p2.pkl")); }
static void test_plain_p3(void) { check_plain(FIXTURE("plain_p3.pkl")); }
static void test_plain_p4(void) { check_plain(FIXTURE("plain_p4.pkl")); }
static void test_plain_p5(void) { check_plain(FIXTURE("plain_p5.pkl")); }

/* objects_p{2,4}.pkl: instances of classes defined in the generator. */
static void check_objects(const char *path, int proto)
{
	const struct ckfs_pv *root, *v, *s;

	ckfs_arena_init(&arena);
	root = fixture(path);
	CHECK(is_seq(root, CKFS_PV_LIST, 8));
	if (!is_seq(root, CKFS_PV_LIST, 8))
		goto out;
	walk(root, 0);

	/* Point(1, 'x'): NEWOBJ + BUILD with a dict state. */
	v = item(root, 0);
	CHECK(is_plain_object(v, "__main__", "Point"));
	s = v ? v->u.obj.state : NULL;
	CHECK(is_dict(s, 2) && is_int(get(s, "x"), 1) &&
	      BLOB(get(s, "y"), CKFS_PV_STR, "x"));

	/* Slotted: state is (None, {slots}). */
	v = item(root, 1);
	CHECK(is_plain_object(v, "__main__", "Slotted"));
	s = v ? v->u.obj.state : NULL;
	CHECK(is_seq(s, CKFS_PV_TUPLE, 2));
	CHECK(is_kind(item(s, 0), CKFS_PV_NONE));
	CHECK(is_dict(item(s, 1), 2) && is_int(get(item(s, 1), "a"), 1) &&
	      is_int(get(item(s, 1), "b"), 2));

	/* Outer.Inner: getattr(Outer, 'Inner') under protocol 2, a dotted
	 * STACK_GLOBAL under 4; both end as one GLOBAL. */
	v = item(root, 2);
	CHECK(is_plain_object(v, "__main__", "Outer.Inner"));
	s = v ? v->u.obj.state : NULL;
	CHECK(is_dict(s, 1) && is_int(get(s, "v"), 7));

	/* Color.RED on Python 3.11: Color(1), a CALL. */
	v = item(root, 3);
	CHECK(is_call_of(v, "__main__", "Color", 1) &&
	      is_int(item(v->u.call.args, 0), 1) && !v->u.call.state);

	/* Shape.CIRCLE: getattr(Shape, 'CIRCLE') as Python >= 3.12 does. */
	CHECK(ckfs_pv_is_global(item(root, 4), "__main__", "Shape.CIRCLE"));

	v = item(root, 5);
	if (proto >= 4) {
		/* NEWOBJ_EX */
		CHECK(is_kind(v, CKFS_PV_OBJECT));
		CHECK(v && ckfs_pv_is_global(v->u.obj.cls, "__main__", "KwNew"));
		CHECK(v && INTS(v->u.obj.args, CKFS_PV_TUPLE, 1));
		CHECK(v && is_dict(v->u.obj.kwargs, 1) &&
		      is_int(get(v->u.obj.kwargs, "k"), 2));
		CHECK(v && !v->u.obj.state);
	} else {
		/* partial(KwNew.__new__, KwNew, 1, k=2)() */
		const struct ckfs_pv *p = v ? v->u.call.fn : NULL;
		CHECK(is_kind(v, CKFS_PV_CALL) &&
		      is_seq(v->u.call.args, CKFS_PV_TUPLE, 0));
		CHECK(is_call_of(p, "functools", "partial", 1));
		if (is_call_of(p, "functools", "partial", 1)) {
			const struct ckfs_pv *fn = item(p->u.call.args, 0);
			CHECK(ckfs_pv_is_global(fn, "__main__", "KwNew.__new__"));
			s = p->u.call.state;
			CHECK(is_seq(s, CKFS_PV_TUPLE, 4));
			CHECK(item(s, 0) == fn); /* memo: the same node */
			CHECK(is_seq(item(s, 1), CKFS_PV_TUPLE, 2) &&
			      ckfs_pv_is_global(item(item(s, 1), 0), "__main__",
						"KwNew") &&
			      is_int(item(item(s, 1), 1), 1));
			CHECK(is_dict(item(s, 2), 1) &&
			      is_int(get(item(s, 2), "k"), 2));
			CHECK(is_kind(item(s, 3), CKFS_PV_NONE));
		}
	}

	/* __reduce__ with state: CALL + BUILD. */
	v = item(root, 6);
	CHECK(is_call_of(v, "__main__", "make_thing", 2) &&
	      INTS(v->u.call.args, CKFS_PV_TUPLE, 1, 2));
	s = v ? v->u.call.state : NULL;
	CHECK(is_dict(s, 1) && is_int(get(s, "s"), 3));

	/* OrderedDict -> plain DICT */
	v = item(root, 7);
	CHECK(is_dict(v, 2) && is_int(get(v, "x"), 1) &&
	      INTS(get(v, "y"), CKFS_PV_LIST, 2));
out:
	ckfs_arena_release(&arena);
}

static void test_objects_p2(void) { check_objects(FIXTURE("objects_p2.pkl"), 2); }
static void test_objects_p4(void) { check_objects(FIXTURE("objects_p4.pkl"), 4); }

/* A storage persistent id ('storage', torch <cls>, key, location, numel). */
static int is_storage(const struct ckfs_pv *v, const char *cls,
		      const char *key, int64_t numel)
{
	const struct ckfs_pv *pid = is_kind(v, CKFS_PV_PERSID) ?
		v->u.persid.pid : NULL;

	return is_seq(pid, CKFS_PV_TUPLE, 5) &&
	       ckfs_pv_is_str(item(pid, 0), "storage") &&
	       ckfs_pv_is_global(item(pid, 1), "torch", cls) &&
	       ckfs_pv_is_str(item(pid, 2), key) &&
	       ckfs_pv_is_str(item(pid, 3), "cpu") &&
	       is_int(item(pid, 4), numel);
}

/* _rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()) */
static int is_tensor_v2(const struct ckfs_pv *v, const char *cls,
			const char *key, int64_t numel)
{
	const struct ckfs_pv *a = v ? v->u.call.args : NULL;

	return is_call_of(v, "torch._utils", "_rebuild_tensor_v2", 6) &&
	       is_storage(item(a, 0), cls, key, numel) &&
	       is_int(item(a, 1), 0) && is_bool(item(a, 4), 0) &&
	       is_dict(item(a, 5), 0) && !v->u.call.state;
}

/* torch.save(nn.Sequential(nn.Linear(3, 2)).state_dict()) data.pkl */
static void test_torch_state_dict(void)
{
	const struct ckfs_pv *root, *w, *b;

	ckfs_arena_init(&arena);
	root = fixture(FIXTURE("torch_state_dict.pkl"));
	/* OrderedDict; the trailing BUILD {'_metadata': ...} is dropped. */
	CHECK(is_dict(root, 2));
	CHECK(root && ckfs_pv_is_str(root->u.dict.keys[0], "0.weight"));
	CHECK(root && ckfs_pv_is_str(root->u.dict.keys[1], "0.bias"));
	w = get(root, "0.weight");
	b = get(root, "0.bias");
	CHECK(is_tensor_v2(w, "FloatStorage", "0", 6));
	CHECK(is_tensor_v2(b, "FloatStorage", "1", 2));
	if (is_tensor_v2(w, "FloatStorage", "0", 6) &&
	    is_tensor_v2(b, "FloatStorage", "1", 2)) {
		const struct ckfs_pv *wa = w->u.call.args, *ba = b->u.call.args;
		const struct ckfs_pv *wp = item(wa, 0)->u.persid.pid;
		const struct ckfs_pv *bp = item(ba, 0)->u.persid.pid;

		CHECK(INTS(item(wa, 2), CKFS_PV_TUPLE, 2, 3));
		CHECK(INTS(item(wa, 3), CKFS_PV_TUPLE, 3, 1));
		CHECK(INTS(item(ba, 2), CKFS_PV_TUPLE, 2));
		CHECK(INTS(item(ba, 3), CKFS_PV_TUPLE, 1));
		/* BINGET-shared nodes stay shared. */
		CHECK(w->u.call.fn == b->u.call.fn);
		CHECK(item(wp, 0) == item(bp, 0));
		CHECK(item(wp, 1) == item(bp, 1));
		CHECK(item(wp, 3) == item(bp, 3));
		CHECK(item(wa, 5) != item(ba, 5)); /* OrderedDict() each time */
	}
	walk(root, 0);
	ckfs_arena_release(&arena);
}

/* torch.save({'w': DTensor}) on a 1-rank gloo mesh (formats.md 3.2). */
static void test_torch_dtensor(void)
{
	const struct ckfs_pv *root, *w, *a, *wrap, *st, *spec, *mesh, *meta;

	ckfs_arena_init(&arena);
	root = fixture(FIXTURE("torch_dtensor.pkl"));
	CHECK(is_dict(root, 1));
	w = get(root, "w");
	CHECK(is_call_of(w, "torch._tensor", "_rebuild_from_type_v2", 4));
	if (!is_call_of(w, "torch._tensor", "_rebuild_from_type_v2", 4))
		goto out;
	a = w->u.call.args;
	CHECK(ckfs_pv_is_global(item(a, 0), "torch._utils",
				"_rebuild_wrapper_subclass"));
	CHECK(ckfs_pv_is_global(item(a, 1), "torch.distributed.tensor",
				"DTensor"));
	CHECK(ckfs_pv_is_global_named(item(a, 1), "torch.distributed",
				      "DTensor"));
	CHECK(ckfs_pv_is_global_named(item(a, 1), "torch.distributed.",
				      "DTensor"));
	CHECK(!ckfs_pv_is_global_named(item(a, 1), "torch.dist", "DTensor"));
	CHECK(!ckfs_pv_is_global_named(item(a, 1), "torch", "Tensor"));

	wrap = item(a, 2);
	CHECK(is_seq(wrap, CKFS_PV_TUPLE, 8));
	CHECK(item(wrap, 0) == item(a, 1));
	CHECK(ckfs_pv_is_global(item(wrap, 1), "torch", "float32"));
	CHECK(INTS(item(wrap, 2), CKFS_PV_TUPLE, 4));
	CHECK(INTS(item(wrap, 3), CKFS_PV_TUPLE, 1));
	CHECK(is_int(item(wrap, 4), 0));
	CHECK(is_call_of(item(wrap, 5), "torch.serialization", "_get_layout", 1));
	CHECK(item(wrap, 5) &&
	      ckfs_pv_is_str(item(item(wrap, 5)->u.call.args, 0),
			     "torch.strided"));
	CHECK(is_call_of(item(wrap, 6), "torch", "device", 1));
	CHECK(item(wrap, 6) &&
	      ckfs_pv_is_str(item(item(wrap, 6)->u.call.args, 0), "cpu"));
	CHECK(is_bool(item(wrap, 7), 0));

	st = item(a, 3);
	CHECK(is_seq(st, CKFS_PV_TUPLE, 2));
	CHECK(is_kind(item(st, 0), CKFS_PV_NONE));
	st = item(st, 1);
	CHECK(is_dict(st, 2));
	CHECK(is_tensor_v2(get(st, "_local_tensor"), "FloatStorage", "0", 4));

	spec = get(st, "_spec");
	CHECK(is_plain_object(spec, "torch.distributed.tensor._dtensor_spec",
			      "DTensorSpec"));
	spec = spec ? spec->u.obj.state : NULL;
	CHECK(is_dict(spec, 4));
	CHECK(is_kind(get(spec, "_hash"), CKFS_PV_NONE));

	mesh = get(spec, "mesh");
	CHECK(is_plain_object(mesh, "torch.distributed.device_mesh",
			      "DeviceMesh"));
	mesh = mesh ? mesh->u.obj.state : NULL;
	CHECK(is_dict(mesh, 8));
	CHECK(ckfs_pv_is_str(get(mesh, "device_type"), "cpu"));
	CHECK(is_tensor_v2(get(mesh, "mesh"), "IntStorage", "1", 1));
	CHECK(is_kind(get(mesh, "mesh_dim_names"), CKFS_PV_NONE));
	CHECK(INTS(get(mesh, "_flatten_mesh_list"), CKFS_PV_TUPLE, 0));
	CHECK(is_seq(get(mesh, "_dim_group_names"), CKFS_PV_LIST, 1) &&
	      ckfs_pv_is_str(item(get(mesh, "_dim_group_names"), 0), "0"));
	CHECK(INTS(get(mesh, "_coordinate_on_dim"), CKFS_PV_LIST, 0));
	CHECK(is_kind(get(mesh, "_hash"), CKFS_PV_INT));

	/* placements: (Shard(dim=0),) */
	a = get(spec, "placements");
	CHECK(is_seq(a, CKFS_PV_TUPLE, 1));
	CHECK(is_plain_object(item(a, 0),
			      "torch.distributed.tensor.placement_types",
			      "Shard"));
	CHECK(item(a, 0) && is_dict(item(a, 0)->u.obj.state, 1) &&
	      is_int(get(item(a, 0)->u.obj.state, "dim"), 0));

	/* TensorMeta(torch.Size((4,)), (1,), torch.float32), no BUILD. */
	meta = get(spec, "tensor_meta");
	CHECK(is_kind(meta, CKFS_PV_OBJECT) &&
	      ckfs_pv_is_global(meta->u.obj.cls,
				"torch.distributed.tensor._dtensor_spec",
				"TensorMeta") &&
	      !meta->u.obj.state);
	a = meta ? meta->u.obj.args : NULL;
	CHECK(is_seq(a, CKFS_PV_TUPLE, 3));
	CHECK(INTS(item(a, 0), CKFS_PV_TUPLE, 4)); /* torch.Size evaluated */
	CHECK(INTS(item(a, 1), CKFS_PV_TUPLE, 1));
	CHECK(item(a, 2) == item(wrap, 1));
	walk(root, 0);
out:
	ckfs_arena_release(&arena);
}

#define DCP_MOD "torch.distributed.checkpoint.metadata"

/* torch.distributed.checkpoint .metadata (protocol 4, formats.md 5.2). */
static void test_dcp_metadata(void)
{
	const struct ckfs_pv *root, *st, *sdm, *w, *p, *c, *sd, *k;

	ckfs_arena_init(&arena);
	root = fixture(FIXTURE("dcp_metadata.pkl"));
	CHECK(is_plain_object(root, DCP_MOD, "Metadata"));
	st = root ? root->u.obj.state : NULL;
	CHECK(is_dict(st, 4));

	sdm = get(st, "state_dict_metadata");
	CHECK(is_dict(sdm, 2));
	w = get(sdm, "w");
	CHECK(is_plain_object(w, DCP_MOD, "TensorStorageMetadata"));
	w = w ? w->u.obj.state : NULL;
	CHECK(is_dict(w, 3));
	CHECK(INTS(get(w, "size"), CKFS_PV_TUPLE, 2, 3));
	p = get(w, "properties");
	CHECK(is_plain_object(p, DCP_MOD, "TensorProperties"));
	p = p ? p->u.obj.state : NULL;
	CHECK(is_seq(p, CKFS_PV_TUPLE, 5));
	CHECK(ckfs_pv_is_global(item(p, 0), "torch", "float32"));
	CHECK(is_call_of(item(p, 1), "torch.serialization", "_get_layout", 1));
	CHECK(is_bool(item(p, 2), 0));
	CHECK(is_call_of(item(p, 3), DCP_MOD, "_MEM_FORMAT_ENCODING", 1));
	CHECK(is_bool(item(p, 4), 0));
	c = get(w, "chunks");
	CHECK(is_seq(c, CKFS_PV_LIST, 1));
	c = item(c, 0);
	CHECK(is_plain_object(c, DCP_MOD, "ChunkStorageMetadata"));
	c = c ? c->u.obj.state : NULL;
	CHECK(INTS(get(c, "offsets"), CKFS_PV_TUPLE, 0, 0));
	CHECK(INTS(get(c, "sizes"), CKFS_PV_TUPLE, 2, 3));
	CHECK(is_plain_object(get(sdm, "step"), DCP_MOD,
			      "BytesStorageMetadata"));
	CHECK(get(sdm, "step") && !get(sdm, "step")->u.obj.state);

	p = get(st, "planner_data");
	CHECK(is_dict(p, 2));
	CHECK(is_seq(get(p, "w"), CKFS_PV_TUPLE, 1) &&
	      ckfs_pv_is_str(item(get(p, "w"), 0), "w"));

	/* storage_data: MetadataIndex objects as keys. */
	sd = get(st, "storage_data");
	CHECK(is_dict(sd, 2));
	if (is_dict(sd, 2)) {
		static const struct {
			const char *fqn;
			int64_t offset, length;
		} want[] = { { "step", 0, 1261 }, { "w", 1261, 1577 } };
		for (size_t i = 0; i < 2; i++) {
			k = sd->u.dict.keys[i];
			CHECK(is_plain_object(k, DCP_MOD, "MetadataIndex"));
			CHECK(k->u.obj.cls == sd->u.dict.keys[0]->u.obj.cls);
			k = k->u.obj.state;
			CHECK(ckfs_pv_is_str(get(k, "fqn"), want[i].fqn));
			const struct ckfs_pv *v = sd->u.dict.vals[i];
			CHECK(is_plain_object(v, "torch.distributed.checkpoint.filesystem",
					      "_StorageInfo"));
			v = v ? v->u.obj.state : NULL;
			CHECK(is_dict(v, 3));
			CHECK(ckfs_pv_is_str(get(v, "relative_path"),
					     "__0_0.distcp"));
			CHECK(is_int(get(v, "offset"), want[i].offset));
			CHECK(is_int(get(v, "length"), want[i].length));
		}
		k = sd->u.dict.keys[0]->u.obj.state;
		CHECK(is_dict(k, 2) && is_kind(get(k, "index"), CKFS_PV_NONE) &&
		      !get(k, "offset"));
		k = sd->u.dict.keys[1]->u.obj.state;
		CHECK(is_dict(k, 3) && is_int(get(k, "index"), 0) &&
		      INTS(get(k, "offset"), CKFS_PV_TUPLE, 0, 0));
		CHECK(ckfs_pv_dict_get(sd, "w") == NULL); /* keys are objects */
	}

	p = get(st, "storage_meta");
	CHECK(is_plain_object(p, DCP_MOD, "StorageMeta"));
	p = p ? p->u.obj.state : NULL;
	CHECK(is_call_of(get(p, "checkpoint_id"), "pathlib", "PosixPath", 1));
	CHECK(is_kind(get(p, "save_id"), CKFS_PV_STR));
	CHECK(is_seq(get(p, "modules"), CKFS_PV_LIST, 0));
	walk(root, 0);
	ckfs_arena_release(&arena);
}

/* Hand-crafted valid streams in the corpus. */
static void test_corpus_valid(void)
{
	const struct ckfs_pv *v;

	ckfs_arena_init(&arena);
	/* SHORT_BINSTRING / BINSTRING (py2 str) become STR. */
	v = fixture(CORPUS("ok_binstring.pkl"));
	CHECK(is_seq(v, CKFS_PV_TUPLE, 3));
	CHECK(BLOB(item(v, 0), CKFS_PV_STR, "abc"));
	CHECK(BLOB(item(v, 1), CKFS_PV_STR, "de"));
	CHECK(BLOB(item(v, 2), CKFS_PV_STR, ""));
	/* LONG_BINPUT 16777215 and 8388608: sparse memo, no big array. */
	v = fixture(CORPUS("ok_sparse_memo.pkl"));
	CHECK(INTS(v, CKFS_PV_TUPLE, 7, 8));
	/* Bytes after STOP are ignored. */
	CHECK(is_int(fixture(CORPUS("ok_trailing.pkl")), 5));
	/* POP on a bare mark removes the mark, as in Python. */
	CHECK(is_int(fixture(CORPUS("ok_pop_bare_mark.pkl")), 1));
	/* A repeated string key replaces the value in place. */
	v = fixture(CORPUS("ok_dup_key_replace.pkl"));
	CHECK(is_dict(v, 2) && is_int(get(v, "a"), 3) &&
	      is_int(get(v, "b"), 2));
	CHECK(v && ckfs_pv_is_str(v->u.dict.keys[0], "a"));
	/* FRAME; LONG1 of 0 bytes; a 9-byte LONG1 that fits int64. */
	v = fixture(CORPUS("ok_frame_long1.pkl"));
	CHECK(INTS(v, CKFS_PV_TUPLE, 0, INT64_MIN));
	ckfs_arena_release(&arena);
}

/* ---- broken inputs ---------------------------------------------------- */

static const struct {
	const char *file;
	enum ckfs_code code;
	const char *msg; /* after "'<file>': " */
} bad[] = {
	{ "empty", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 0" },
	{ "no_stop", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 3" },
	{ "trunc_proto", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 0" },
	{ "trunc_binint", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_binint2", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_binfloat", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_long1", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_long4", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_binunicode", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_short_binbytes", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_binput", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 3" },
	{ "trunc_long_binget", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 5" },
	{ "trunc_global", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "trunc_frame", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "huge_binunicode", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "huge_binunicode8", CKFS_E_TRUNCATED, "unexpected end of pickle at offset 2" },
	{ "unknown_opcode", CKFS_E_FORMAT, "unknown opcode 0xff at offset 2" },
	{ "text_int", CKFS_E_UNSUPPORTED, "unsupported pickle opcode INT at offset 0" },
	{ "text_list", CKFS_E_UNSUPPORTED, "unsupported pickle opcode LIST at offset 3" },
	{ "ext1", CKFS_E_UNSUPPORTED, "unsupported pickle opcode EXT1 at offset 2" },
	{ "next_buffer", CKFS_E_UNSUPPORTED, "unsupported pickle opcode NEXT_BUFFER at offset 2" },
	{ "proto6", CKFS_E_UNSUPPORTED, "unsupported pickle protocol 6 at offset 0" },
	{ "memo_out_of_range", CKFS_E_FORMAT, "memo index 9 out of range at offset 6" },
	{ "memo_get_empty", CKFS_E_FORMAT, "memo index 0 out of range at offset 2" },
	{ "huge_long_binput", CKFS_E_LIMIT, "memo index 4294967295 exceeds the limit of 16777216 at offset 3" },
	{ "underflow_reduce", CKFS_E_FORMAT, "stack underflow in REDUCE at offset 3" },
	{ "underflow_reduce_mark", CKFS_E_FORMAT, "stack underflow in REDUCE at offset 21" },
	{ "underflow_tuple3", CKFS_E_FORMAT, "stack underflow in TUPLE3 at offset 6" },
	{ "underflow_setitem", CKFS_E_FORMAT, "stack underflow in SETITEM at offset 5" },
	{ "underflow_appends", CKFS_E_FORMAT, "stack underflow in APPENDS at offset 5" },
	{ "pop_mark_no_mark", CKFS_E_FORMAT, "POP_MARK without MARK at offset 3" },
	{ "stop_empty", CKFS_E_FORMAT, "stack underflow in STOP at offset 2" },
	{ "stop_after_mark", CKFS_E_FORMAT, "stack underflow in STOP at offset 4" },
	{ "build_on_int", CKFS_E_FORMAT, "BUILD on int at offset 5" },
	{ "setitems_odd", CKFS_E_FORMAT, "SETITEMS with odd item count 3 at offset 10" },
	{ "setitems_on_call", CKFS_E_UNSUPPORTED, "SETITEMS on call at offset 26" },
	{ "append_on_tuple", CKFS_E_FORMAT, "APPEND on tuple at offset 5" },
	{ "self_append", CKFS_E_UNSUPPORTED, "APPEND would make list contain itself at offset 7" },
	{ "nesting_bomb", CKFS_E_LIMIT, "nesting deeper than 256 in APPEND at offset 557" },
	{ "mark_bomb", CKFS_E_LIMIT, "more than 4096 nested marks at offset 4098" },
	{ "reduce_args_list", CKFS_E_FORMAT, "REDUCE arguments: expected tuple, got list at offset 10" },
	{ "stack_global_int", CKFS_E_FORMAT, "STACK_GLOBAL on int and int, not str at offset 6" },
	{ "latin1_above_ff", CKFS_E_FORMAT, "latin-1 text has a character above U+00FF or bad UTF-8 (text byte 0) at offset 37" },
	{ "negative_binstring", CKFS_E_FORMAT, "negative length -1 in BINSTRING at offset 2" },
	{ "negative_long4", CKFS_E_FORMAT, "negative length -1 in LONG4 at offset 2" },
	{ "global_nul", CKFS_E_FORMAT, "NUL byte in GLOBAL name at offset 2" },
};

static void expect_error(const char *path, const char *label,
			 enum ckfs_code code, const char *msg)
{
	struct ckfs_pv *v = (struct ckfs_pv *)&v; /* must be reset to NULL */
	char want[1024];
	size_t len;
	unsigned char *buf = slurp(path, &len);

	CHECK(buf != NULL || len == 0);
	ckfs_arena_init(&arena);
	CHECK_EQ_INT(load(buf, len, label, &v), code);
	CHECK_EQ_INT(err.code, code);
	snprintf(want, sizeof(want), "'%s': %s", label, msg);
	CHECK_EQ_STR(err.msg, want);
	CHECK(v == NULL);
	ckfs_arena_release(&arena);
	free(buf);
}

static void test_corpus_errors(void)
{
	char path[512], label[128];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(path, sizeof(path), "%s/pickle/%s.pkl", CKFS_CORPUS,
			 bad[i].file);
		snprintf(label, sizeof(label), "%s.pkl", bad[i].file);
		expect_error(path, label, bad[i].code, bad[i].msg);
	}
}

/* Real self-referencing pickles are refused, never looped on. */
static void test_cycles(void)
{
	expect_error(FIXTURE("self_ref_list_p2.pkl"), "self_ref_list_p2.pkl",
		     CKFS_E_UNSUPPORTED,
		     "APPENDS would make list contain itself at offset 10");
	expect_error(FIXTURE("self_ref_object_p4.pkl"), "self_ref_object_p4.pkl",
		     CKFS_E_UNSUPPORTED,
		     "BUILD into object that is already referenced (possible reference cycle) at offset 51");
}

/* ---- in-memory inputs ------------------------------------------------- */

static void check_mem(const void *bytes, size_t len, enum ckfs_code code,
		      const char *msg)
{
	struct ckfs_pv *v;
	char want[1024];

	ckfs_arena_init(&arena);
	CHECK_EQ_INT(load(bytes, len, "mem", &v), code);
	snprintf(want, sizeof(want), "'mem': %s", msg);
	CHECK_EQ_STR(err.msg, want);
	ckfs_arena_release(&arena);
}

#define MEM(lit, code, msg) check_mem(lit, sizeof(lit) - 1, code, msg)

static void test_inline_errors(void)
{
	/* l = []; t = (l,); l.append(t): a cycle through a tuple. */
	MEM("\x80\x02]q\x00h\x00\x85" "a.", CKFS_E_UNSUPPORTED,
	    "APPEND into list that is already referenced (possible reference cycle) at offset 8");
	/* d['d'] = d */
	MEM("\x80\x02}q\x00X\x01\x00\x00\x00" "dh\x00s.", CKFS_E_UNSUPPORTED,
	    "SETITEM would make dict contain itself at offset 13");
	MEM("\x80\x02}K\x01K\x02)\x90.", CKFS_E_FORMAT,
	    "ADDITEMS without MARK at offset 8");
	MEM("\x80\x04\x8fK\x01" "a.", CKFS_E_FORMAT, "APPEND on set at offset 5");
	MEM("\x80\x04](K\x01\x90.", CKFS_E_FORMAT, "ADDITEMS on list at offset 6");
	MEM("\x80\x04](K\x01u.", CKFS_E_FORMAT, "SETITEMS with odd item count 1 at offset 6");
	MEM("\x80\x04](K\x01K\x02u.", CKFS_E_FORMAT, "SETITEMS on list at offset 8");
	MEM("\x80\x04]K\x01" "b.", CKFS_E_FORMAT, "BUILD on list at offset 5");
	MEM("\x80\x02" "cmod\nC\n))\x81K\x01" "a.", CKFS_E_UNSUPPORTED,
	    "APPEND on object at offset 14");
	MEM("\x80\x02" "cmod\nC\n)]\x81.", CKFS_E_FORMAT,
	    "NEWOBJ arguments: expected tuple, got list at offset 11");
	MEM("\x80\x04)}\x92.", CKFS_E_FORMAT,
	    "stack underflow in NEWOBJ_EX at offset 4");
	MEM("\x80\x04" "cmod\nC\n)]\x92.", CKFS_E_FORMAT,
	    "NEWOBJ_EX keyword arguments: expected dict, got list at offset 11");
	MEM("\x80\x04" "cmod\nC\n]}\x92.", CKFS_E_FORMAT,
	    "NEWOBJ_EX arguments: expected tuple, got list at offset 11");
	MEM("\x80\x02" "c\nC\n.", CKFS_E_FORMAT, "empty name in GLOBAL at offset 2");
	MEM("\x80\x02Q.", CKFS_E_FORMAT, "stack underflow in BINPERSID at offset 2");
	MEM("\x80\x02" "2.", CKFS_E_FORMAT, "stack underflow in DUP at offset 2");
	MEM("\x80\x02" "0.", CKFS_E_FORMAT, "stack underflow in POP at offset 2");
	MEM("\x80\x02\x94.", CKFS_E_FORMAT, "stack underflow in MEMOIZE at offset 2");
	MEM("\x80\x02(q\x00.", CKFS_E_FORMAT, "stack underflow in BINPUT at offset 3");
	MEM("\x80\x02" "F1.0\n.", CKFS_E_UNSUPPORTED,
	    "unsupported pickle opcode FLOAT at offset 2");
	MEM("\x80\x02p0\n.", CKFS_E_UNSUPPORTED,
	    "unsupported pickle opcode PUT at offset 2");
	MEM("\x80\x02(i__main__\nC\n.", CKFS_E_UNSUPPORTED,
	    "unsupported pickle opcode INST at offset 3");
	MEM("\x80\x02P0\n.", CKFS_E_UNSUPPORTED,
	    "unsupported pickle opcode PERSID at offset 2");
	MEM("\x80\x05\x98.", CKFS_E_UNSUPPORTED,
	    "unsupported pickle opcode READONLY_BUFFER at offset 2");
	MEM("\x80\x02\x00.", CKFS_E_FORMAT, "unknown opcode 0x00 at offset 2");
	/* _codecs.encode with bad UTF-8 (a lone continuation byte). */
	MEM("\x80\x02" "c_codecs\nencode\nX\x01\x00\x00\x00\x80X\x06\x00\x00\x00latin1\x86R.",
	    CKFS_E_FORMAT,
	    "latin-1 text has a character above U+00FF or bad UTF-8 (text byte 0) at offset 36");
}

/* Every strict prefix of a valid pickle is truncated, never anything else. */
static void test_prefixes(void)
{
	static const char *const files[] = {
		"plain_p2.pkl", "plain_p3.pkl", "plain_p4.pkl", "plain_p5.pkl",
		"objects_p2.pkl", "objects_p4.pkl", "torch_state_dict.pkl",
		"torch_dtensor.pkl", "dcp_metadata.pkl",
	};
	char path[512];

	for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
		size_t len;
		unsigned char *buf;

		snprintf(path, sizeof(path), "%s/pickle/%s", CKFS_FIXTURES,
			 files[f]);
		buf = slurp(path, &len);
		CHECK(buf != NULL);
		if (!buf)
			continue;
		for (size_t n = 0; n < len; n++) {
			unsigned char *p = malloc(n ? n : 1);
			struct ckfs_pv *v;
			enum ckfs_code rc;

			memcpy(p, buf, n);
			ckfs_arena_init(&arena);
			rc = load(p, n, files[f], &v);
			if (rc != CKFS_E_TRUNCATED)
				fprintf(stderr, "%s[0..%zu): %s\n", files[f], n,
					err.msg);
			CHECK_EQ_INT(rc, CKFS_E_TRUNCATED);
			CHECK(strstr(err.msg, "': unexpected end of pickle at offset ") != NULL);
			ckfs_arena_release(&arena);
			free(p);
		}
		free(buf);
	}
}

static unsigned char *fill(size_t *len, size_t cap)
{
	unsigned char *b = malloc(cap);

	CHECK(b != NULL);
	*len = 0;
	return b;
}

/* 100k EMPTY_LIST then APPENDs, and 100k TUPLE1s: limited, not recursed. */
static void test_depth_bombs(void)
{
	size_t n = 100000, len;
	unsigned char *b = fill(&len, 2 * n + 8);
	struct ckfs_pv *v;
	char want[128];

	if (!b)
		return;
	b[len++] = 0x80;
	b[len++] = 2;
	memset(b + len, ']', n);
	len += n;
	memset(b + len, 'a', n - 1);
	len += n - 1;
	b[len++] = '.';
	snprintf(want, sizeof(want),
		 "nesting deeper than %u in APPEND at offset %zu",
		 CKFS_MAX_PICKLE_NESTING, 2 + n + CKFS_MAX_PICKLE_NESTING - 1);
	check_mem(b, len, CKFS_E_LIMIT, want);

	len = 2;
	b[len++] = ')';
	memset(b + len, 0x85, n);
	len += n;
	b[len++] = '.';
	snprintf(want, sizeof(want),
		 "nesting deeper than %u in TUPLE1 at offset %zu",
		 CKFS_MAX_PICKLE_NESTING, (size_t)3 + CKFS_MAX_PICKLE_NESTING - 1);
	check_mem(b, len, CKFS_E_LIMIT, want);

	/* Exactly CKFS_MAX_PICKLE_NESTING nested lists are fine. */
	len = 2;
	memset(b + len, ']', CKFS_MAX_PICKLE_NESTING);
	len += CKFS_MAX_PICKLE_NESTING;
	memset(b + len, 'a', CKFS_MAX_PICKLE_NESTING - 1);
	len += CKFS_MAX_PICKLE_NESTING - 1;
	b[len++] = '.';
	ckfs_arena_init(&arena);
	CHECK_EQ_INT(load(b, len, "mem", &v), CKFS_OK);
	CHECK(walk(v, 1) == CKFS_MAX_PICKLE_NESTING);
	ckfs_arena_release(&arena);
	free(b);
}

static void test_stack_limit(void)
{
	size_t n = (size_t)CKFS_MAX_PICKLE_STACK + 1, len;
	unsigned char *b = fill(&len, n + 8);
	char want[128];

	if (!b)
		return;
	b[len++] = 0x80;
	b[len++] = 2;
	memset(b + len, 'N', n);
	len += n;
	b[len++] = '.';
	snprintf(want, sizeof(want), "stack deeper than %u at offset %zu",
		 CKFS_MAX_PICKLE_STACK, (size_t)2 + CKFS_MAX_PICKLE_STACK);
	check_mem(b, len, CKFS_E_LIMIT, want);
	free(b);
}

static size_t put_str(unsigned char *b, const char *s)
{
	size_t n = strlen(s);

	b[0] = 0x8c; /* SHORT_BINUNICODE */
	b[1] = (unsigned char)n;
	memcpy(b + 2, s, n);
	return n + 2;
}

/* A state-dict-sized dict: 100k string keys, then every key again. The
 * duplicates replace values, through the dict's hash index. */
static void test_big_dict(void)
{
	size_t n = 100000, len;
	unsigned char *b = fill(&len, n * 2 * 32 + 64);
	struct ckfs_pv *v;
	char key[32];
	clock_t t0;

	if (!b)
		return;
	b[len++] = 0x80;
	b[len++] = 4;
	b[len++] = '}';
	for (int pass = 0; pass < 2; pass++) {
		b[len++] = '(';
		for (size_t i = 0; i < n; i++) {
			snprintf(key, sizeof(key), "layer.%zu.weight", i);
			len += put_str(b + len, key);
			uint32_t x = (uint32_t)(i + (size_t)pass * 1000000);
			b[len++] = 'J'; /* BININT, little-endian */
			for (int k = 0; k < 4; k++)
				b[len++] = (unsigned char)(x >> (8 * k));
		}
		b[len++] = 'u';
	}
	b[len++] = '.';
	ckfs_arena_init(&arena);
	t0 = clock();
	CHECK_EQ_INT(load(b, len, "mem", &v), CKFS_OK);
	fprintf(stderr, "     big dict: %zu bytes in %.1f ms\n", len,
		(double)(clock() - t0) * 1000.0 / CLOCKS_PER_SEC);
	CHECK(is_dict(v, n));
	if (is_dict(v, n)) {
		CHECK(ckfs_pv_is_str(v->u.dict.keys[0], "layer.0.weight"));
		CHECK(is_int(v->u.dict.vals[0], 1000000));
		CHECK(ckfs_pv_is_str(v->u.dict.keys[n - 1], "layer.99999.weight"));
		CHECK(is_int(v->u.dict.vals[n - 1], 1000000 + 99999));
		CHECK(is_int(get(v, "layer.4242.weight"), 1004242));
	}
	ckfs_arena_release(&arena);
	free(b);
}

/* Once referenced, a container is frozen: even a leaf may not be added
 * (Python's pickler never does this outside reference cycles). */
static void test_frozen_after_reference(void)
{
	MEM("\x80\x02]q\x00\x85h\x00K\x07" "a0.", CKFS_E_UNSUPPORTED,
	    "APPEND into list that is already referenced (possible reference cycle) at offset 10");
	MEM("\x80\x02" "cmod\nC\n)\x81q\x00\x85h\x00}b.", CKFS_E_UNSUPPORTED,
	    "BUILD into object that is already referenced (possible reference cycle) at offset 17");
	/* Filling before the reference is fine, and BUILD twice replaces. */
	static const char pk[] = "\x80\x02" "cmod\nC\n)\x81K\x01" "bK\x02" "b\x85.";
	struct ckfs_pv *v;

	ckfs_arena_init(&arena);
	CHECK_EQ_INT(load(pk, sizeof(pk) - 1, "mem", &v), CKFS_OK);
	CHECK(is_seq(v, CKFS_PV_TUPLE, 1));
	CHECK(is_plain_object(item(v, 0), "mod", "C") &&
	      is_int(item(v, 0)->u.obj.state, 2));
	ckfs_arena_release(&arena);
}

/* x = []; 40 times x = (x, x): 82 bytes whose full walk would visit 2^41
 * nodes. Refused when the expanded size passes CKFS_MAX_PICKLE_TREE. */
static void test_dag_bomb(void)
{
	unsigned char b[128];
	size_t len = 0;
	char want[160];

	b[len++] = 0x80;
	b[len++] = 2;
	b[len++] = ']';
	for (int i = 0; i < 40; i++) {
		b[len++] = '2';    /* DUP */
		b[len++] = 0x86;   /* TUPLE2 */
	}
	b[len++] = '.';
	/* After k doublings the size is 2^(k+1) - 1: the 30th TUPLE2 fails. */
	snprintf(want, sizeof(want),
		 "tree of more than %u nodes, counting shared objects at each use, in TUPLE2 at offset %d",
		 CKFS_MAX_PICKLE_TREE, 3 + 2 * 29 + 1);
	check_mem(b, len, CKFS_E_LIMIT, want);

	/* 28 doublings (2^29 - 1 nodes expanded) still load. */
	struct ckfs_pv *v;
	b[3 + 2 * 28] = '.';
	ckfs_arena_init(&arena);
	CHECK_EQ_INT(load(b, 3 + 2 * 28 + 1, "mem", &v), CKFS_OK);
	CHECK(is_seq(v, CKFS_PV_TUPLE, 2) && item(v, 0) == item(v, 1));
	ckfs_arena_release(&arena);
}

static void test_helpers(void)
{
	struct ckfs_pv *v;
	static const char pk[] =
		"\x80\x04(ctorch.distributed._tensor.api\nDTensor\n"
		"ctorchvision\nSize\nX\x03\x00\x00\x00" "abcX\x00\x00\x00\x00t.";

	ckfs_arena_init(&arena);
	CHECK_EQ_INT(load(pk, sizeof(pk) - 1, "mem", &v), CKFS_OK);
	CHECK(is_seq(v, CKFS_PV_TUPLE, 4));
	if (is_seq(v, CKFS_PV_TUPLE, 4)) {
		const struct ckfs_pv *g = item(v, 0), *t = item(v, 1);

		CHECK(ckfs_pv_is_global(g, "torch.distributed._tensor.api",
					"DTensor"));
		CHECK(!ckfs_pv_is_global(g, "torch.distributed", "DTensor"));
		CHECK(ckfs_pv_is_global(g, NULL, "DTensor"));
		CHECK(ckfs_pv_is_global_named(g, "torch.distributed._tensor",
					      "DTensor"));
		CHECK(ckfs_pv_is_global_named(g, "torch", "DTensor"));
		CHECK(ckfs_pv_is_global_named(g, "", "DTensor"));
		CHECK(!ckfs_pv_is_global_named(g, "torch.distributed._tensor",
					       "DTensorSpec"));
		CHECK(!ckfs_pv_is_global_named(t, "torch", "Size"));
		CHECK(ckfs_pv_is_global_named(t, "torchvision", "Size"));
		CHECK(ckfs_pv_is_str(item(v, 2), "abc"));
		CHECK(!ckfs_pv_is_str(item(v, 2), "ab"));
		CHECK(ckfs_pv_is_str(item(v, 3), ""));
		CHECK(!ckfs_pv_is_str(g, "DTensor"));
		CHECK(!ckfs_pv_dict_get(v, "abc"));
	}
	CHECK(!ckfs_pv_is_global(NULL, "torch", "Size"));
	CHECK(!ckfs_pv_is_global_named(NULL, "torch", "Size"));
	CHECK(!ckfs_pv_dict_get(NULL, "x"));
	CHECK(!ckfs_pv_is_str(NULL, "x"));
	CHECK_EQ_STR(ckfs_pv_kind_name(CKFS_PV_NONE), "none");
	CHECK_EQ_STR(ckfs_pv_kind_name(CKFS_PV_BIGINT), "big int");
	CHECK_EQ_STR(ckfs_pv_kind_name(CKFS_PV_GLOBAL), "global");
	CHECK_EQ_STR(ckfs_pv_kind_name(CKFS_PV_PERSID), "persistent id");
	CHECK_EQ_STR(ckfs_pv_kind_name((enum ckfs_pv_kind)99), "unknown");
	ckfs_arena_release(&arena);

	/* Bad arguments. */
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_pickle_load("N.", 2, "x", NULL, &v, &err),
		     CKFS_E_INVALID);
	CHECK_EQ_STR(err.msg, "'x': pickle load without an arena");
	ckfs_arena_init(&arena);
	CHECK_EQ_INT(ckfs_pickle_load(NULL, 0, NULL, &arena, &v, NULL),
		     CKFS_E_TRUNCATED);
	CHECK_EQ_INT(load(NULL, 0, NULL, &v), CKFS_E_TRUNCATED);
	CHECK_EQ_STR(err.msg, "'pickle': unexpected end of pickle at offset 0");
	ckfs_arena_release(&arena);
}

int main(void)
{
	RUN(test_plain_p2);
	RUN(test_plain_p3);
	RUN(test_plain_p4);
	RUN(test_plain_p5);
	RUN(test_objects_p2);
	RUN(test_objects_p4);
	RUN(test_torch_state_dict);
	RUN(test_torch_dtensor);
	RUN(test_dcp_metadata);
	RUN(test_corpus_valid);
	RUN(test_corpus_errors);
	RUN(test_cycles);
	RUN(test_inline_errors);
	RUN(test_prefixes);
	RUN(test_depth_bombs);
	RUN(test_stack_limit);
	RUN(test_big_dict);
	RUN(test_frozen_after_reference);
	RUN(test_dag_bomb);
	RUN(test_helpers);
	return test_summary();
}
