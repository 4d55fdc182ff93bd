/* SPDX-License-Identifier: MIT */
/*
 * compressed-tensors' pack-quantized W4A16 on read (--dtype w4a16;
 * include/ckfs/model.h, struct ckfs_w4a16). The arithmetic is the
 * library's (compressed-tensors 0.20: calculate_qparams, _quantize,
 * pack_to_int32) on a bf16 model, each step rounded to bf16 as torch's
 * bf16 operations round it:
 *
 *   s = bf16(max(|min|, |max|) / 7.5) over a group of 128 consecutive
 *       elements of a row (q_max - q_min = 15, halved: symmetric);
 *       s = 2^-7 (bf16's eps) where that is 0
 *   q = round_half_even(clamp(bf16(w / s), -8, 7))
 *   word j of a row = sum over k < 8 of (q[8j + k] + 8) << 4k
 *
 * A group never crosses a row (the input dim is a multiple of 128), so
 * packed element p is made from weight elements [8p, 8p + 8) and their
 * group p / 16, and scale e is group e: any range of either is a
 * contiguous run of the weight, read in windows of whole groups. The
 * scales a read of values computes are kept for the read of the scales
 * that follows it in the file (struct ckfs_w4a16: within a budget per
 * model, freed once all were served), so a reader in file order reads
 * each weight once; a scale not kept is computed again from the weight.
 * tests/py/test_w4a16.py checks every byte against the library.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/dtype.h"
#include "ckfs/model.h"

#define GROUP CKFS_W4A16_GROUP
/* Groups per window: 512 KiB of bf16, within L2 with its output. */
#define WINDOW_GROUPS 2048u
#define BF16_EPS 0x3C00u /* 2^-7, torch.finfo(torch.bfloat16).eps */

static uint16_t *buffer(struct ckfs_read_scratch *s, size_t n)
{
	return ckfs_view_scratch(s, n * sizeof(uint16_t));
}

static inline float from_bf16(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* f rounded to bf16 (nearest even) and back, for a finite or infinite f:
 * the rounding torch applies to each bf16 operation's float result. */
static inline float round_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
	memcpy(&f, &u, 4);
	return f;
}

/* max |w| over one group, NaN when one is: vectorised (the loop is most
 * of the cost with the quantizing below). */
CKFS_VECTOR_CLONES
static float group_amax(const uint16_t *restrict w)
{
	uint32_t m = 0, nan = 0;

	/* on the bits: |w| orders as its magnitude bits do, NaNs above Inf */
	for (int k = 0; k < GROUP; k++) {
		uint32_t a = w[k] & 0x7FFFu;
		nan |= a > 0x7F80u;
		m = a > m ? a : m;
	}
	return nan ? __builtin_nanf("") : from_bf16((uint16_t)m);
}

/* The scale of one group, as bf16 bits. */
static uint16_t group_scale(const uint16_t *w)
{
	float s = group_amax(w) / 7.5f;
	uint32_t bits;

	memcpy(&bits, &s, 4);
	uint16_t b = ckfs_f32_to_bf16(bits);
	return (b & 0x7FFFu) == 0 ? BF16_EPS : b;
}

/* n values with scale s as q + 8 (0..15), one a byte: vectorised. A NaN
 * quotient (a group holding a NaN or an Inf) is written as 0 (q + 8 = 8):
 * torch's cast of NaN to int8 is undefined. */
CKFS_VECTOR_CLONES
static void quantize_run(const uint16_t *restrict w, size_t n, float s, uint8_t *restrict q)
{
	for (size_t i = 0; i < n; i++) {
		float v = round_bf16(from_bf16(w[i]) / s);
		v = v != v ? 0.0f : v;
		v = v < -8.0f ? -8.0f : v;
		v = v > 7.0f ? 7.0f : v;
		/* round half to even: exact for |v| <= 2^22 */
		v = (v + 12582912.0f) - 12582912.0f;
		q[i] = (uint8_t)((int)v + 8);
	}
}

/* words x 8 elements of one group, all with scale s, packed: element k of
 * a word in bits 4k..4k+3. */
static void pack_run(const uint16_t *w, size_t words, float s, unsigned char *out)
{
	uint8_t q[GROUP];

	quantize_run(w, words * 8, s, q);
	for (size_t j = 0; j < words; j++) {
		uint32_t word = 0;
		for (int k = 0; k < 8; k++)
			word |= (uint32_t)q[8 * j + (size_t)k] << (4 * k);
		memcpy(out + 4 * j, &word, 4); /* dst need not be aligned */
	}
}

/* Groups [g, g + n) of the weight as bf16, into the scratch buffer. */
static enum ckfs_code read_groups(const struct ckfs_model *m, struct ckfs_w4a16 *w,
				  uint64_t g, uint64_t n, const uint16_t **out,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	uint16_t *buf = buffer(scratch, (size_t)(n * GROUP));

	if (!buf)
		return ckfs_nomem(err);
	*out = buf;
	return ckfs_tensor_read(m, &w->weight, g * GROUP, n * GROUP, buf, scratch, err);
}

/* ---- scales kept from reads of the values for reads of the scales ---- */

static uint64_t n_groups(const struct ckfs_w4a16 *w)
{
	return w->weight.numel / GROUP;
}

/* Take (sign 1) or give back (-1) bytes of the model's budget: 0 when
 * they do not fit. */
static int budget(struct ckfs_w4a16_kept *k, uint64_t bytes, int sign)
{
	int ok = 1;

	pthread_mutex_lock(&k->lock);
	if (sign < 0)
		k->bytes -= bytes;
	else if ((ok = k->bytes + bytes <= CKFS_W4A16_KEPT_BYTES))
		k->bytes += bytes;
	pthread_mutex_unlock(&k->lock);
	return ok;
}

static void drop(struct ckfs_w4a16 *w)
{
	free(w->scales);
	free(w->known);
	w->scales = NULL;
	w->known = NULL;
	w->served = 0;
	budget(w->kept, n_groups(w) * 3, -1);
}

/* Keep scales [g, g + n) (bf16 bits), allocating room for all of w's
 * when the budget allows. */
static void keep(struct ckfs_w4a16 *w, uint64_t g, uint64_t n, const uint16_t *sc)
{
	uint64_t total = n_groups(w);

	pthread_mutex_lock(&w->lock);
	if (!w->scales && budget(w->kept, total * 3, 1)) {
		w->scales = malloc((size_t)total * sizeof(*w->scales));
		w->known = calloc((size_t)total, 1);
		if (!w->scales || !w->known)
			drop(w);
	}
	if (w->scales) {
		memcpy(w->scales + g, sc, (size_t)n * sizeof(*sc));
		memset(w->known + g, 1, (size_t)n);
	}
	pthread_mutex_unlock(&w->lock);
}

/* Scales [first, first + count) into dst when all are kept: 1, else 0. */
static int take(struct ckfs_w4a16 *w, uint64_t first, uint64_t count, unsigned char *dst)
{
	int all = 0;

	pthread_mutex_lock(&w->lock);
	if (w->scales && (all = memchr(w->known + first, 0, (size_t)count) == NULL)) {
		memcpy(dst, w->scales + first, (size_t)count * sizeof(*w->scales));
		/* every scale served: a read again computes them again */
		if ((w->served += count) >= n_groups(w))
			drop(w);
	}
	pthread_mutex_unlock(&w->lock);
	return all;
}

/* Packed elements [first, first + count): 16 per group. */
static enum ckfs_code read_packed(const struct ckfs_model *m, struct ckfs_w4a16 *w,
				  uint64_t first, uint64_t count, unsigned char *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	const uint64_t per = GROUP / 8, end = first + count;

	for (uint64_t g = first / per; g * per < end; g += WINDOW_GROUPS) {
		uint64_t n = (end + per - 1) / per - g;
		const uint16_t *buf = NULL;
		n = n < WINDOW_GROUPS ? n : WINDOW_GROUPS;
		CKFS_TRY(read_groups(m, w, g, n, &buf, scratch, err));
		uint16_t sc[WINDOW_GROUPS];
		for (uint64_t i = 0; i < n; i++) {
			uint64_t p0 = (g + i) * per, p1 = p0 + per;
			const uint16_t *grp = buf + i * GROUP;
			sc[i] = group_scale(grp);
			p0 = p0 > first ? p0 : first;
			p1 = p1 < end ? p1 : end;
			if (p0 < p1)
				pack_run(grp + (p0 - (g + i) * per) * 8, (size_t)(p1 - p0),
					 from_bf16(sc[i]), dst + 4 * (p0 - first));
		}
		keep(w, g, n, sc);
	}
	return CKFS_OK;
}

/* Scales [first, first + count): scale e is group e. */
static enum ckfs_code read_scales(const struct ckfs_model *m, struct ckfs_w4a16 *w,
				  uint64_t first, uint64_t count, unsigned char *dst,
				  struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	if (take(w, first, count, dst))
		return CKFS_OK;
	for (uint64_t i = 0; i < count; i += WINDOW_GROUPS) {
		uint64_t n = count - i < WINDOW_GROUPS ? count - i : WINDOW_GROUPS;
		const uint16_t *buf = NULL;
		CKFS_TRY(read_groups(m, w, first + i, n, &buf, scratch, err));
		for (uint64_t k = 0; k < n; k++) {
			uint16_t b = group_scale(buf + k * GROUP);
			memcpy(dst + 2 * (i + k), &b, 2);
		}
	}
	return CKFS_OK;
}

static enum ckfs_code w4a16_read(const struct ckfs_model *m, const struct ckfs_tensor *t,
				 uint64_t first, uint64_t count, void *dst,
				 struct ckfs_read_scratch *scratch, struct ckfs_error *err)
{
	struct ckfs_w4a16 *w = t->view_state;

	switch ((enum ckfs_w4a16_part)t->view_part) {
	case CKFS_W4A16_PACKED:
		return read_packed(m, w, first, count, dst, scratch, err);
	case CKFS_W4A16_SCALE:
		return read_scales(m, w, first, count, dst, scratch, err);
	case CKFS_W4A16_SHAPE:
		break;
	}
	int64_t shape[2] = { w->weight.shape[0], w->weight.shape[1] };
	memcpy(dst, shape + first, count * sizeof(int64_t));
	return CKFS_OK;
}

/* All three parts are computed from the weight as planned. */
static size_t w4a16_inputs(const struct ckfs_tensor *t, const struct ckfs_tensor *in[2])
{
	const struct ckfs_w4a16 *w = t->view_state;

	in[0] = &w->weight;
	return 1;
}

/* The scheme's fields, keys sorted, as compressed-tensors 0.20.1's
 * ModelCompressor.update_config writes them for llm-compressor's W4A16
 * preset (its QuantizationConfig.model_dump: null fields kept, the
 * weights' unset optional fields dropped). */
static enum ckfs_code w4a16_config(const struct ckfs_model *m, struct ckfs_view_config *c,
				   struct ckfs_error *err)
{
	static const char head[] =
		"{\"config_groups\": {\"group_0\": {\"format\": \"pack-quantized\", "
		"\"input_activations\": null, \"output_activations\": null, "
		"\"targets\": [\"Linear\"], \"weights\": {\"dynamic\": false, "
		"\"group_size\": 128, \"num_bits\": 4, \"strategy\": \"group\", "
		"\"symmetric\": true, \"type\": \"int\"}}}, \"format\": \"pack-quantized\", "
		"\"global_compression_ratio\": null, \"ignore\": [";
	static const char tail[] =
		"], \"kv_cache_scheme\": null, \"moe_sparsity_config\": null, "
		"\"quant_method\": \"compressed-tensors\", \"quantization_status\": "
		"\"compressed\", \"sparsity_config\": {}, \"transform_config\": {}, "
		"\"version\": \"0.20.1\"}";
	const struct ckfs_w4a16_set *set = m->view_state;

	return ckfs_view_quantization(c, head, set->ignore, set->n_ignore, tail, err);
}

static void w4a16_release(struct ckfs_model *m)
{
	struct ckfs_w4a16_set *set = m->view_state;

	for (size_t i = 0; i < set->n; i++) {
		free(set->weights[i].scales);
		free(set->weights[i].known);
		pthread_mutex_destroy(&set->weights[i].lock);
	}
	if (set->kept)
		pthread_mutex_destroy(&set->kept->lock);
}

const struct ckfs_view ckfs_view_w4a16 = {
	.name = "w4a16",
	.read = w4a16_read,
	.inputs = w4a16_inputs,
	.config = w4a16_config,
	.release = w4a16_release,
	.quantizes = true,
};
