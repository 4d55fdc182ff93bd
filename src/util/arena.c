/* SPDX-License-Identifier: MIT */
/* Bump allocator: see include/ckfs/arena.h. Blocks grow geometrically so a
 * large plan costs few mallocs; big requests get a block of their own. */
#include "ckfs/arena.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct ckfs_arena_block {
	struct ckfs_arena_block *next;
	size_t size, used;
	size_t dirty; /* data past this is zero (a fresh mapping) */
	bool mapped;
	_Alignas(16) unsigned char data[];
};

#define ARENA_MIN_BLOCK (64u * 1024)
#define ARENA_MAX_BLOCK (16u * 1024 * 1024)
/* Blocks this large are mappings of their own, in huge pages where the
 * kernel has them: a 64-rank plan fills 200 MB of blocks, and faulting
 * that in 4 KiB pages cost a fifth of the time to open it; the kernel
 * zeroes them, so nothing is zeroed twice. */
#define ARENA_MAP_MIN (2u * 1024 * 1024)

static struct ckfs_arena_block *block_new(size_t size)
{
	struct ckfs_arena_block *b;
	size_t total = sizeof(*b) + size;

	if (total < ARENA_MAP_MIN) {
		if ((b = malloc(total)) == NULL)
			return NULL;
		b->mapped = false;
		b->dirty = size;
		return b;
	}
	void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, total, MADV_HUGEPAGE);
	b = p;
	b->mapped = true;
	b->dirty = 0;
	return b;
}

static void block_free(struct ckfs_arena_block *b)
{
	if (b->mapped)
		munmap(b, sizeof(*b) + b->size);
	else
		free(b);
}

void ckfs_arena_init(struct ckfs_arena *a)
{
	a->head = NULL;
	a->used_bytes = 0;
	a->spare = NULL;
}

static void free_blocks(struct ckfs_arena_block *b)
{
	while (b) {
		struct ckfs_arena_block *next = b->next;
		block_free(b);
		b = next;
	}
}

void ckfs_arena_release(struct ckfs_arena *a)
{
	free_blocks(a->head);
	free_blocks(a->spare);
	ckfs_arena_init(a);
}

void ckfs_arena_recycle(struct ckfs_arena *a)
{
	while (a->head) {
		struct ckfs_arena_block *b = a->head;
		a->head = b->next;
		if (b->used > b->dirty)
			b->dirty = b->used;
		b->next = a->spare;
		a->spare = b;
	}
	a->used_bytes = 0;
}

void ckfs_arena_donate(struct ckfs_arena *dst, struct ckfs_arena *src)
{
	ckfs_arena_recycle(src);
	while (src->spare) {
		struct ckfs_arena_block *b = src->spare;
		src->spare = b->next;
		b->next = dst->spare;
		dst->spare = b;
	}
}

/* A kept block of at least size bytes, taken off the spares; or NULL. */
static struct ckfs_arena_block *take_spare(struct ckfs_arena *a, size_t size)
{
	for (struct ckfs_arena_block **p = &a->spare; *p; p = &(*p)->next) {
		struct ckfs_arena_block *b = *p;
		if (b->size >= size) {
			*p = b->next;
			return b;
		}
	}
	return NULL;
}

void *ckfs_arena_alloc(struct ckfs_arena *a, size_t n)
{
	struct ckfs_arena_block *b = a->head;
	size_t need;

	if (n > SIZE_MAX - 15)
		return NULL;
	need = (n + 15) & ~(size_t)15;
	if (!b || b->size - b->used < need) {
		size_t size = b ? b->size * 2 : ARENA_MIN_BLOCK;
		if (size > ARENA_MAX_BLOCK)
			size = ARENA_MAX_BLOCK;
		if (size < need)
			size = need;
		if (size > SIZE_MAX - sizeof(*b))
			return NULL;
		struct ckfs_arena_block *nb = take_spare(a, size);
		if (nb)
			size = nb->size;
		else if ((nb = block_new(size)) == NULL)
			return NULL;
		nb->size = size;
		nb->used = 0;
		/* A dedicated block for a big request keeps the current one. */
		if (b && size == need && b->size - b->used > 4096) {
			nb->next = b->next;
			b->next = nb;
		} else {
			nb->next = b;
			a->head = nb;
		}
		b = nb;
	}
	void *p = b->data + b->used;
	if (b->used < b->dirty)
		memset(p, 0, b->dirty - b->used < n ? b->dirty - b->used : n);
	b->used += need;
	a->used_bytes += need;
	return p;
}

void *ckfs_arena_calloc(struct ckfs_arena *a, size_t count, size_t size)
{
	if (size && count > SIZE_MAX / size)
		return NULL;
	return ckfs_arena_alloc(a, count * size);
}

char *ckfs_arena_strndup(struct ckfs_arena *a, const char *s, size_t len)
{
	if (len == SIZE_MAX)
		return NULL;
	char *p = ckfs_arena_alloc(a, len + 1);
	if (p) {
		memcpy(p, s, len);
		p[len] = '\0';
	}
	return p;
}

char *ckfs_arena_strdup(struct ckfs_arena *a, const char *s)
{
	return ckfs_arena_strndup(a, s, strlen(s));
}

char *ckfs_arena_printf(struct ckfs_arena *a, const char *fmt, ...)
{
	va_list ap, ap2;
	int n;

	va_start(ap, fmt);
	va_copy(ap2, ap);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *p = n < 0 ? NULL : ckfs_arena_alloc(a, (size_t)n + 1);
	if (p)
		vsnprintf(p, (size_t)n + 1, fmt, ap2);
	va_end(ap2);
	return p;
}
