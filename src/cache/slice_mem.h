/* SPDX-License-Identifier: MIT */
/*
 * Slice buffers the cache owns (private to src/cache): each one mapped
 * from the kernel on its own and given back to it, so that what the
 * daemon holds is what the cache holds, whatever threads allocated and
 * freed them.
 *
 * Why not malloc (issue 41: 5.1 GB resident under a 128 MiB cache, one
 * random reader): glibc's posix_memalign asks its arena for the length
 * plus the alignment, so the 4 MiB block a freed slice leaves can never
 * serve the next slice unless it merged with a free neighbour, and the
 * heap grows instead (1.4 GB with a single arena); the middle of a heap
 * is never given back, and every thread's arena does the same (the
 * mount's 32 MiB mmap threshold, and glibc's own dynamic one once such a
 * block was freed, keep slices out of mmap).
 *
 * A freed slice-size buffer is kept for the next fill (warm: no page
 * faults, no zeroing) while the buffers mapped stay within the bound;
 * past it, and for every other length (a file's last slice), it is
 * unmapped at once. So the memory mapped is at most the bound, plus the
 * buffers in use beyond it (slices pinned by readers, fills in flight
 * when everything is pinned), which go back as they are freed.
 */
#ifndef CKFS_CACHE_SLICE_MEM_H
#define CKFS_CACHE_SLICE_MEM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct slice_mem {
	/* Immutable after slice_mem_init. */
	size_t slice_size;              /* the only length kept */
	uint64_t bound;                 /* bytes mapped above which nothing is kept */
	/* Mapped now: in use plus kept (pages, each buffer rounded up). */
	_Atomic uint64_t mapped;
	pthread_mutex_t lock;           /* a leaf: guards the kept list */
	void *kept;                     /* a list through each buffer's first word */
};

void slice_mem_init(struct slice_mem *m, size_t slice_size, uint64_t bound);
/* Unmaps the kept buffers; every other buffer must have been put back. */
void slice_mem_destroy(struct slice_mem *m);
/* A buffer of len bytes (page aligned, its contents undefined), or NULL. */
void *slice_mem_get(struct slice_mem *m, size_t len);
/* p, from slice_mem_get(m, len), is no longer used; NULL is ignored. */
void slice_mem_put(struct slice_mem *m, void *p, size_t len);
/* Bytes mapped now. */
uint64_t slice_mem_mapped(struct slice_mem *m);

#endif
