/* SPDX-License-Identifier: MIT */
/*
 * Property fuzz target for the planner. The input is not parsed as a file:
 * it is a stream of choices from which a random VALID sharded checkpoint is
 * derived (a mesh of 1-3 dims of 1-4 ranks; 1-5 tensors of 0-3 dims with
 * extents 0-9 and a random dtype; per mesh dim Replicate, Shard(d) or
 * _StridedShard(d, k), so shards are even, uneven or empty; or a
 * ShardedTensor cut along one dim; local views with a storage offset and
 * sometimes transposed strides; a random --max-shard-size). Each rank's
 * file (in /dev/shm) holds, for every element of its local tensor, a byte
 * pattern of the element's global index, placed by an independent oracle
 * (index lists cut the way torch.chunk does), not by the planner.
 *
 * Then the real code runs: ckfs_entry_chunks per rank (placement.c),
 * ckfs_plan_validate_tensor (plan.c), ckfs_st_layout_build (folder/weights.c)
 * and ckfs_st_file_read over ckfs_tensor_read (read.c), and the target
 * aborts unless every element of every tensor is covered by exactly one
 * chunk whose source bytes are that element's, the output files tile
 * exactly (header, then each tensor's bytes, no gap, no overlap, each
 * tensor in one file) and every byte read back is the expected one.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/weights.h"
#include "fuzz_common.h"
#include "layouts/layouts.h"

#define MAX_MESH 3
#define MAX_TENSORS 5
#define MAX_EXTENT 9
#define MAX_RANKS 64

struct stream {
	const uint8_t *p;
	size_t n;
};

/* A choice in [0, max]; 0 once the input is used up. */
static int take(struct stream *s, int max)
{
	if (!s->n || max <= 0)
		return 0;
	s->n--;
	return *s->p++ % (max + 1);
}

static void fail(const char *what, const struct ckfs_error *err)
{
	fprintf(stderr, "fuzz_plan: %s%s%s\n", what, err ? ": " : "",
		err ? err->msg : "");
	abort();
}

static uint8_t pattern(int tensor, uint64_t g, size_t b)
{
	uint64_t x = ((uint64_t)tensor * 1000003u + g) * 8 + b + 1;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 29;
	return (uint8_t)x;
}

/* The oracle: the global indices a rank holds along one dim, as lists. */
struct idx_list {
	int n;
	int v[MAX_EXTENT];
};

/* torch.chunk(list, n)[c]: pieces of ceil(L / n), trailing ones empty. */
static void chunk_piece(const struct idx_list *in, int lo, int len, int n, int c,
			struct idx_list *out)
{
	int q = (len + n - 1) / n;
	int a = q * c < len ? q * c : len, b = a + q < len ? a + q : len;

	for (int i = a; i < b; i++)
		out->v[out->n++] = in->v[lo + i];
}

struct plan_tensor {
	enum ckfs_dtype dtype;
	int ndim;
	int64_t shape[CKFS_MAX_DIMS];
	uint64_t numel;
	bool sharded;                   /* a ShardedTensor, else a DTensor */
	int shard_dim;
	struct ckfs_placement pl[MAX_MESH];
	int storage_offset;
	bool transposed;
};

struct rank_view {
	struct idx_list idx[CKFS_MAX_DIMS];
	bool copy;                      /* a Replicate copy: contributes nothing */
	struct ckfs_tensor_view view;
};

static void oracle(const struct plan_tensor *pt, int mesh_ndim, const int64_t *mesh,
		   const int64_t *coord, int rank, int world, struct rank_view *rv)
{
	memset(rv, 0, sizeof(*rv));
	for (int k = 0; k < pt->ndim; k++) {
		rv->idx[k].n = (int)pt->shape[k];
		for (int i = 0; i < rv->idx[k].n; i++)
			rv->idx[k].v[i] = i;
	}
	if (pt->sharded) {
		struct idx_list in = rv->idx[pt->shard_dim];
		rv->idx[pt->shard_dim].n = 0;
		chunk_piece(&in, 0, in.n, world, rank, &rv->idx[pt->shard_dim]);
		return;
	}
	for (int i = 0; i < mesh_ndim; i++) {
		const struct ckfs_placement *p = &pt->pl[i];
		if (p->kind == CKFS_PLACE_REPLICATE) {
			rv->copy |= coord[i] != 0;
			continue;
		}
		struct idx_list in = rv->idx[p->dim], *out = &rv->idx[p->dim];
		int sf = p->kind == CKFS_PLACE_SHARD ? 1 : (int)p->split_factor;
		out->n = 0;
		for (int j = 0; j < sf; j++) {
			int q = (in.n + sf - 1) / sf;
			int a = q * j < in.n ? q * j : in.n, b = a + q < in.n ? a + q : in.n;
			chunk_piece(&in, a, b - a, (int)mesh[i], (int)coord[i], out);
		}
	}
}

/* Row-major global index of a local element. */
static uint64_t global_of(const struct plan_tensor *pt, const struct rank_view *rv,
			  const int64_t *li)
{
	uint64_t g = 0;
	for (int k = 0; k < pt->ndim; k++)
		g = g * (uint64_t)pt->shape[k] + (uint64_t)rv->idx[k].v[li[k]];
	return g;
}

/* Advance a multi-index over shape; 0 when done. */
static int next_index(int64_t *i, const int64_t *shape, int ndim)
{
	for (int k = ndim - 1; k >= 0; k--) {
		if (++i[k] < shape[k])
			return 1;
		i[k] = 0;
	}
	return 0;
}

static uint64_t numel_of(const int64_t *shape, int ndim)
{
	uint64_t n = 1;
	for (int k = 0; k < ndim; k++)
		n *= (uint64_t)shape[k];
	return n;
}

struct rank_file {
	uint8_t *bytes;
	size_t len, cap;
};

/* Lay out rv's local tensor at the end of f (after a little padding) and
 * fill it with the patterns of the global elements it holds. */
static void write_local(struct rank_file *f, const struct plan_tensor *pt, int tensor,
			struct rank_view *rv, int pad)
{
	struct ckfs_tensor_view *v = &rv->view;
	size_t es = ckfs_dtype_size(pt->dtype);
	int64_t li[CKFS_MAX_DIMS] = { 0 };

	v->dtype = pt->dtype;
	v->ndim = pt->ndim;
	for (int k = 0; k < pt->ndim; k++)
		v->shape[k] = rv->idx[k].n;
	/* Row-major strides, or those of a transpose of the last two dims. */
	int64_t s = 1;
	int order[CKFS_MAX_DIMS];
	for (int k = 0; k < pt->ndim; k++)
		order[k] = k;
	if (pt->transposed && pt->ndim >= 2) {
		order[pt->ndim - 2] = pt->ndim - 1;
		order[pt->ndim - 1] = pt->ndim - 2;
	}
	for (int k = pt->ndim - 1; k >= 0; k--) {
		v->stride[order[k]] = s;
		s *= v->shape[order[k]] ? v->shape[order[k]] : 1;
	}
	uint64_t n = numel_of(v->shape, v->ndim);
	v->storage_offset = pt->storage_offset;
	v->storage_bytes = ((uint64_t)pt->storage_offset + (n ? (uint64_t)s : 0)) * es;
	v->storage_pos = f->len + (size_t)pad;
	size_t need = (size_t)(v->storage_pos + v->storage_bytes);
	if (need > f->cap) {
		f->cap = need * 2 + 64;
		f->bytes = realloc(f->bytes, f->cap);
		if (!f->bytes)
			abort();
	}
	if (need > f->len) /* padding and unused storage: a filler byte */
		memset(f->bytes + f->len, 0xEE, need - f->len);
	f->len = need;
	if (n == 0)
		return;
	do {
		uint64_t at = (uint64_t)v->storage_offset;
		for (int k = 0; k < v->ndim; k++)
			at += (uint64_t)li[k] * (uint64_t)v->stride[k];
		uint64_t g = global_of(pt, rv, li);
		for (size_t b = 0; b < es; b++)
			f->bytes[v->storage_pos + at * es + b] = pattern(tensor, g, b);
	} while (next_index(li, v->shape, v->ndim));
}

/* Every element covered by exactly one chunk, from the right bytes. */
static void check_tiling(const struct ckfs_tensor *t, int tensor,
			 const struct rank_file *files)
{
	uint8_t *seen = calloc(t->numel + 1, 1);
	size_t es = ckfs_dtype_size(t->stored_dtype);
	int nd = t->ndim ? t->ndim : 1;

	if (!seen)
		abort();
	for (uint32_t i = 0; i < t->n_chunks; i++) {
		const struct ckfs_chunk *c = &t->chunks[i];
		int64_t li[CKFS_MAX_DIMS] = { 0 };
		do {
			uint64_t g = 0, at = c->pos;
			for (int k = 0; k < t->ndim; k++)
				g = g * (uint64_t)t->shape[k] + (uint64_t)(c->offset[k] + li[k]);
			for (int k = 0; k < nd; k++)
				at += (uint64_t)li[k] * (uint64_t)c->stride[k] * es;
			if (g >= t->numel || seen[g]++)
				fail("an element is covered twice or lies outside", NULL);
			const struct rank_file *f = &files[c->source];
			if (at + es > f->len)
				fail("a chunk reads past its rank file", NULL);
			for (size_t b = 0; b < es; b++)
				if (f->bytes[at + b] != pattern(tensor, g, b))
					fail("a chunk maps an element to the wrong bytes", NULL);
		} while (next_index(li, c->shape, nd));
	}
	for (uint64_t g = 0; g < t->numel; g++)
		if (seen[g] != 1)
			fail("an element is not covered", NULL);
	free(seen);
}

static const enum ckfs_dtype dtypes[] = {
	CKFS_DTYPE_F32, CKFS_DTYPE_BF16, CKFS_DTYPE_F16, CKFS_DTYPE_F64, CKFS_DTYPE_I64,
	CKFS_DTYPE_I32, CKFS_DTYPE_I16,  CKFS_DTYPE_I8,  CKFS_DTYPE_U8,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct stream in = { data, size };
	struct plan_tensor pts[MAX_TENSORS];
	struct rank_file files[MAX_RANKS];
	struct ckfs_tensor tensors[MAX_TENSORS];
	char names[MAX_TENSORS][16];
	struct ckfs_error err;
	int64_t mesh[MAX_MESH];
	int mesh_ndim = 1 + take(&in, MAX_MESH - 1), world = 1;

	for (int i = 0; i < mesh_ndim; i++) {
		mesh[i] = 1 + take(&in, 3);
		world *= (int)mesh[i];
	}
	int n_tensors = 1 + take(&in, MAX_TENSORS - 1);
	for (int t = 0; t < n_tensors; t++) {
		struct plan_tensor *pt = &pts[t];
		memset(pt, 0, sizeof(*pt));
		pt->dtype = dtypes[take(&in, (int)(sizeof(dtypes) / sizeof(dtypes[0])) - 1)];
		pt->ndim = take(&in, 3);
		for (int k = 0; k < pt->ndim; k++)
			pt->shape[k] = take(&in, MAX_EXTENT);
		pt->numel = numel_of(pt->shape, pt->ndim);
		pt->sharded = pt->ndim > 0 && take(&in, 3) == 0;
		pt->shard_dim = take(&in, pt->ndim - 1);
		for (int i = 0; i < mesh_ndim; i++) {
			int kind = pt->ndim ? take(&in, 2) : 0;
			pt->pl[i].kind = kind == 0 ? CKFS_PLACE_REPLICATE
				       : kind == 1 ? CKFS_PLACE_SHARD : CKFS_PLACE_STRIDED_SHARD;
			pt->pl[i].dim = take(&in, pt->ndim - 1);
			pt->pl[i].split_factor = 1 + take(&in, 3);
		}
		pt->storage_offset = take(&in, 5);
		pt->transposed = take(&in, 1);
	}
	uint64_t max_shard = take(&in, 1) ? (uint64_t)take(&in, 255) * 16 + 1 : 0;

	/* Rank files and the model, built as a layout builder would. */
	struct ckfs_model *m = calloc(1, sizeof(*m));
	struct ckfs_source *sources = calloc((size_t)world, sizeof(*sources));
	char paths[MAX_RANKS][64];
	struct ckfs_chunk_list lists[MAX_TENSORS];
	if (!m || !sources)
		abort();
	memset(files, 0, sizeof(files));
	memset(lists, 0, sizeof(lists));
	ckfs_arena_init(&m->arena);
	m->src_dir = "/";
	m->world_size = world;
	for (int r = 0; r < world; r++) {
		int64_t coord[MAX_MESH];
		for (int i = mesh_ndim - 1, x = r; i >= 0; i--) {
			coord[i] = x % mesh[i];
			x /= (int)mesh[i];
		}
		for (int t = 0; t < n_tensors; t++) {
			struct ckfs_dtensor_info di = { .ndim = pts[t].ndim,
							.mesh_ndim = mesh_ndim };
			struct ckfs_sharded_info si = { .ndim = pts[t].ndim, .have_local = true };
			struct ckfs_sd_entry e = { .key = names[t] };
			struct rank_view rv;
			snprintf(names[t], sizeof(names[t]), "t%d", t);
			oracle(&pts[t], mesh_ndim, mesh, coord, r, world, &rv);
			write_local(&files[r], &pts[t], t, &rv, take(&in, 7));
			memcpy(di.global_shape, pts[t].shape, sizeof(di.global_shape));
			memcpy(si.global_shape, pts[t].shape, sizeof(si.global_shape));
			memcpy(di.mesh_shape, mesh, sizeof(int64_t) * (size_t)mesh_ndim);
			memcpy(di.coord, coord, sizeof(int64_t) * (size_t)mesh_ndim);
			di.have_coord = true;
			memcpy(di.placements, pts[t].pl, sizeof(pts[t].pl));
			for (int k = 0; k < pts[t].ndim; k++) {
				si.sizes[k] = rv.idx[k].n;
				si.offsets[k] = rv.idx[k].n ? rv.idx[k].v[0] : 0;
			}
			e.local = rv.view;
			e.kind = pts[t].sharded ? CKFS_ENTRY_SHARDED : CKFS_ENTRY_DTENSOR;
			e.dtensor = &di;
			e.sharded = &si;
			ckfs_error_clear(&err);
			if (ckfs_entry_chunks(&e, coord, (uint32_t)r, r, &lists[t], &err) != CKFS_OK)
				fail("ckfs_entry_chunks refused a valid placement", &err);
		}
		/* A named file: source checks refuse a memfd (no link). */
		snprintf(paths[r], sizeof(paths[r]), "/dev/shm/ckfs-fuzz-plan-%d-%d",
			 (int)getpid(), r);
		int fd = open(paths[r], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd < 0 || write(fd, files[r].bytes, files[r].len) != (ssize_t)files[r].len)
			abort();
		ckfs_error_clear(&err);
		if (ckfs_source_init(&sources[r], ckfs_file_of_fd(fd), paths[r], paths[r], &err) != CKFS_OK)
			fail("source", &err);
		m->n_sources++;
	}
	m->sources = sources;
	for (int t = 0; t < n_tensors; t++) {
		struct ckfs_tensor *ct = &tensors[t];
		memset(ct, 0, sizeof(*ct));
		ct->name = names[t];
		ct->stored_dtype = ct->out_dtype = pts[t].dtype;
		ct->ndim = pts[t].ndim;
		memcpy(ct->shape, pts[t].shape, sizeof(ct->shape));
		ct->numel = pts[t].numel;
		ct->chunks = ckfs_model_chunks(m, lists[t].v, lists[t].n, ct->ndim);
		if (!ct->chunks)
			abort();
		ct->n_chunks = (uint32_t)lists[t].n;
		ct->placement = "fuzz";
		ckfs_error_clear(&err);
		if (ckfs_plan_validate_tensor(m, ct, &err) != CKFS_OK)
			fail("plan validation refused a valid plan", &err);
		check_tiling(ct, t, files);
	}
	m->tensors = tensors;
	m->n_tensors = (size_t)n_tensors;

	/* The output files tile: header, then each tensor's bytes, once. */
	struct ckfs_st_layout l;
	ckfs_error_clear(&err);
	if (ckfs_st_layout_build(m, max_shard, &l, &err) != CKFS_OK)
		fail("layout", &err);
	int placed[MAX_TENSORS] = { 0 };
	struct ckfs_read_scratch scratch = { 0 };
	for (size_t fi = 0; fi < l.n_files; fi++) {
		const struct ckfs_st_file *f = &l.files[fi];
		uint64_t hl = 0;
		for (int b = 0; b < 8; b++)
			hl |= (uint64_t)f->header[b] << (8 * b);
		if (hl + 8 != f->header_len || f->offsets[0] != f->header_len ||
		    f->offsets[f->n_tensors] != f->size)
			fail("a weight file does not tile (header or end)", NULL);
		uint8_t *want = malloc(f->size + 1), *got = malloc(f->size + 1);
		if (!want || !got)
			abort();
		memcpy(want, f->header, f->header_len);
		for (size_t j = 0; j < f->n_tensors; j++) {
			const struct ckfs_tensor *ct = f->tensors[j];
			int t = (int)(ct - tensors);
			size_t es = ckfs_dtype_size(ct->out_dtype);
			if (t < 0 || t >= n_tensors || placed[t]++ ||
			    f->offsets[j + 1] - f->offsets[j] != ckfs_tensor_out_bytes(ct) ||
			    ckfs_tensor_out_bytes(ct) != ct->numel * es)
				fail("a weight file does not tile (tensor ranges)", NULL);
			for (uint64_t g = 0; g < ct->numel; g++)
				for (size_t b = 0; b < es; b++)
					want[f->offsets[j] + g * es + b] = pattern(t, g, b);
		}
		/* Read back in pieces of random sizes. */
		for (uint64_t off = 0; off < f->size;) {
			uint64_t len = 1 + (uint64_t)take(&in, 255) * (uint64_t)(1 + take(&in, 15));
			if (len > f->size - off)
				len = f->size - off;
			ckfs_error_clear(&err);
			if (ckfs_st_file_read(m, f, off, (size_t)len, got + off, &scratch,
					      &err) != CKFS_OK)
				fail("a read failed", &err);
			off += len;
		}
		if (memcmp(want, got, f->size) != 0)
			fail("a weight file read back wrong bytes", NULL);
		free(want);
		free(got);
	}
	for (int t = 0; t < n_tensors; t++)
		if (placed[t] != 1)
			fail("a tensor is in no weight file", NULL);
	if (getenv("CKFS_FUZZ_VERBOSE")) { /* what a replayed input reached */
		size_t nc = 0;
		for (int t = 0; t < n_tensors; t++)
			nc += lists[t].n;
		fprintf(stderr, "mesh %d dims, %d ranks, %d tensors, %zu chunks, "
			"%zu files\n", mesh_ndim, world, n_tensors, nc, l.n_files);
	}
	ckfs_read_scratch_release(&scratch);
	ckfs_st_layout_release(&l);
	for (int r = 0; r < world; r++) {
		close(sources[r].f.fd);
		unlink(paths[r]);
		free(files[r].bytes);
	}
	for (int t = 0; t < n_tensors; t++)
		free(lists[t].v);
	m->n_sources = 0; /* closed above; the arena holds nothing else */
	ckfs_model_free(m);
	free(sources);
	return 0;
}
