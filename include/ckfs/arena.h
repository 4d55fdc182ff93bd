/* SPDX-License-Identifier: MIT */
/*
 * Bump allocator for metadata whose lifetime is one object (a parsed pickle,
 * a model plan). Everything allocated from an arena is freed at once by
 * ckfs_arena_release(); nothing is freed individually. Allocation may fail
 * (returns NULL); callers turn that into CKFS_E_NOMEM.
 */
#ifndef CKFS_ARENA_H
#define CKFS_ARENA_H

#include <stddef.h>

struct ckfs_arena_block;

struct ckfs_arena {
	struct ckfs_arena_block *head;
	size_t used_bytes; /* total bytes handed out, for limits and stats */
	struct ckfs_arena_block *spare; /* kept by ckfs_arena_recycle */
};

#define CKFS_ARENA_INIT { NULL, 0, NULL }

void ckfs_arena_init(struct ckfs_arena *a);
void ckfs_arena_release(struct ckfs_arena *a);
/* Everything handed out is given up at once, as by release, but the
 * blocks are kept for the arena's next allocations: a loop that parses
 * one file after another (the rank checks) then writes into memory it
 * already touched instead of faulting in fresh pages each time. */
void ckfs_arena_recycle(struct ckfs_arena *a);
/* Move src's blocks (recycled) to dst's spares; src is left empty. */
void ckfs_arena_donate(struct ckfs_arena *dst, struct ckfs_arena *src);

/* n bytes aligned to 16, zeroed; NULL on overflow or out of memory. */
void *ckfs_arena_alloc(struct ckfs_arena *a, size_t n);
/* count * size bytes with overflow check. */
void *ckfs_arena_calloc(struct ckfs_arena *a, size_t count, size_t size);
/* Copy of len bytes plus a terminating NUL. */
char *ckfs_arena_strndup(struct ckfs_arena *a, const char *s, size_t len);
char *ckfs_arena_strdup(struct ckfs_arena *a, const char *s);
char *ckfs_arena_printf(struct ckfs_arena *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif
