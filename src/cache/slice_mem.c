/* SPDX-License-Identifier: MIT */
/*
 * Slice buffers mapped from the kernel: see slice_mem.h. Under
 * AddressSanitizer a kept buffer is poisoned (but for the list's word), so
 * a slice read after its buffer went back is reported as malloc's memory
 * would be.
 */
#include "cache/slice_mem.h"

#include <stdbool.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static size_t page_round(size_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return (len + page - 1) / page * page;
}

void slice_mem_init(struct slice_mem *m, size_t slice_size, uint64_t bound)
{
	m->slice_size = slice_size;
	m->bound = bound;
	atomic_init(&m->mapped, 0);
	pthread_mutex_init(&m->lock, NULL);
	m->kept = NULL;
}

void slice_mem_destroy(struct slice_mem *m)
{
	while (m->kept) {
		void *p = m->kept;
		UNPOISON(p, sizeof(void *));
		m->kept = *(void **)p;
		UNPOISON(p, m->slice_size);
		munmap(p, page_round(m->slice_size));
		atomic_fetch_sub(&m->mapped, page_round(m->slice_size));
	}
	pthread_mutex_destroy(&m->lock);
}

void *slice_mem_get(struct slice_mem *m, size_t len)
{
	size_t size = page_round(len);
	void *p = NULL;

	pthread_mutex_lock(&m->lock);
	if (len == m->slice_size && (p = m->kept)) {
		UNPOISON(p, sizeof(void *));
		m->kept = *(void **)p;
	} else {
		/* Counted before it is mapped, under the lock: a put deciding
		 * whether to keep its buffer must see the buffers about to be
		 * mapped, or puts racing with gets keep more than the bound. */
		atomic_fetch_add(&m->mapped, size);
	}
	pthread_mutex_unlock(&m->lock);
	if (p) {
		UNPOISON(p, len);
		return p;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		atomic_fetch_sub(&m->mapped, size);
		return NULL;
	}
	return p;
}

void slice_mem_put(struct slice_mem *m, void *p, size_t len)
{
	if (!p)
		return;
	if (len == m->slice_size) {
		bool keep;
		pthread_mutex_lock(&m->lock);
		keep = atomic_load(&m->mapped) <= m->bound;
		if (keep) {
			*(void **)p = m->kept;
			POISON((char *)p + sizeof(void *), len - sizeof(void *));
			m->kept = p;
		}
		pthread_mutex_unlock(&m->lock);
		if (keep)
			return;
	}
	munmap(p, page_round(len));
	atomic_fetch_sub(&m->mapped, page_round(len));
}

uint64_t slice_mem_mapped(struct slice_mem *m)
{
	return atomic_load(&m->mapped);
}
