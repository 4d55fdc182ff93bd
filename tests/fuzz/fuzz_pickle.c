/* SPDX-License-Identifier: MIT */
/* Fuzz target: the pickle VM, then a full recursive walk of the tree it
 * returns (which the VM promises is acyclic and bounded). */
#include "ckfs/pickle.h"
#include "fuzz_common.h"

static size_t walk(const struct ckfs_pv *v, int depth)
{
	size_t n = 1;

	if (!v || depth > 512)
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
		n += walk(v->u.call.fn, depth + 1) + walk(v->u.call.args, depth + 1) +
		     walk(v->u.call.state, depth + 1);
		break;
	case CKFS_PV_OBJECT:
		n += walk(v->u.obj.cls, depth + 1) + walk(v->u.obj.args, depth + 1) +
		     walk(v->u.obj.kwargs, depth + 1) + walk(v->u.obj.state, depth + 1);
		break;
	case CKFS_PV_PERSID:
		n += walk(v->u.persid.pid, depth + 1);
		break;
	default:
		break;
	}
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckfs_arena arena;
	struct ckfs_error err;
	struct ckfs_pv *root;

	ckfs_arena_init(&arena);
	ckfs_error_clear(&err);
	if (ckfs_pickle_load(data, size, "fuzz", &arena, &root, &err) == CKFS_OK)
		(void)walk(root, 0);
	ckfs_arena_release(&arena);
	return 0;
}
