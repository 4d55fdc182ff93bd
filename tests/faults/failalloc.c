/* SPDX-License-Identifier: MIT */
/*
 * Fault injection shim, LD_PRELOADed into ckfs by tests/faults/test_failalloc.sh
 * and tests/faults/test_eio.sh. Armed by environment variables; with none
 * set it only passes calls through.
 *
 *   CKFS_FAIL_ALLOC=N      the Nth allocation (malloc, calloc, realloc,
 *                          posix_memalign, aligned_alloc, anonymous mmap:
 *                          the slice cache's buffers; counted from process
 *                          start) returns NULL (MAP_FAILED) with ENOMEM
 *   CKFS_FAIL_ALLOC_MODE   "once" (default): only that one; "after": every
 *                          allocation from the Nth on
 *   CKFS_FAIL_IO=PATTERN   reads (read, pread, pread64, preadv) of a file
 *                          whose path contains PATTERN fail with EIO ...
 *   CKFS_FAIL_IO_AFTER=K   ... after the first K such reads succeeded
 *                          (default 0); mmap of such a file fails
 *                          (ENODEV), so reads take the pread path
 *   CKFS_FAIL_IO_ARM=PATH  read faults only while PATH exists (a test arms
 *                          and disarms a running daemon)
 *   CKFS_FAIL_REPORT=PATH  when a fault is injected, "alloc N\n" or
 *                          "io PATH\n" is appended to PATH, so a sweep knows
 *                          whether its fault was reached; at exit, with
 *                          CKFS_FAIL_ALLOC set, "count N" (allocations made).
 *                          PATH is opened once, at the first call, so a
 *                          sandboxed daemon still reports
 *   CKFS_PROBE_OPEN=PATH   on the first read while CKFS_PROBE_ARM's path
 *                          exists, the process tries to open PATH and
 *                          reports "probe PATH ok" or "probe PATH <errno
 *                          name>", then tries to make an Internet socket
 *                          and reports "probe-socket ok" or the errno's
 *                          name (tests/faults/test_sandbox.sh: a daemon
 *                          reaching outside its sources and its calls)
 *
 * The real functions come from dlsym(RTLD_NEXT), so the shim stacks on a
 * sanitizer's allocator as well as on glibc's (ASan: set
 * verify_asan_link_order=0). dlsym allocates, so calls made while the
 * symbols are resolved are served from a static buffer that is never
 * freed. Paths of descriptors come from /proc/self/fd, read with no
 * allocation.
 */
/* Both the plain and the 64-bit names are defined here, so no redirects. */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t (*real_pread64)(int, void *, size_t, off_t);
static ssize_t (*real_preadv)(int, const struct iovec *, int, off_t);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off_t);

static _Alignas(16) char boot[1 << 16];
static size_t boot_used;
static int resolving;

static atomic_long alloc_count;
static long fail_at = -1;
static int fail_after_mode;
static const char *io_pattern;
static long io_after;
static const char *io_arm;
static atomic_long io_count;
static const char *report_path;
static __thread int thread_started; /* see pthread_create below */

static int report_fd = -1;
static const char *probe_path, *probe_arm;
static atomic_int probe_done;

static void report(const char *what, const char *detail)
{
	int fd = report_fd;
	if (fd < 0)
		return;
	char line[4200];
	size_t n = 0, a = strlen(what), b = strlen(detail);
	if (a + b + 2 > sizeof(line))
		b = sizeof(line) - a - 2;
	memcpy(line, what, a);
	n = a;
	line[n++] = ' ';
	memcpy(line + n, detail, b);
	n += b;
	line[n++] = '\n';
	if (write(fd, line, n) < 0) {
		/* nothing to do: the report is best effort */
	}
}

static void resolve(void)
{
	if (real_malloc || resolving)
		return;
	resolving = 1;
	real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
	real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
	real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
	real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
	real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT,
								      "posix_memalign");
	real_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
	real_read = (ssize_t(*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
	real_pread = (ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
	real_pread64 = (ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread64");
	real_preadv = (ssize_t(*)(int, const struct iovec *, int, off_t))dlsym(RTLD_NEXT,
									      "preadv");
	real_mmap = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
	real_mmap64 = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT,
									    "mmap64");
	resolving = 0;
}

/* The environment is read here, not in resolve(): a sanitizer's runtime
 * allocates before libc has set environ up (getenv would see nothing).
 * Allocations before this point (the loader's, a runtime's) are not
 * counted. */
__attribute__((constructor)) static void init(void)
{
	resolve();
	thread_started = 1; /* the main thread */
	const char *n = getenv("CKFS_FAIL_ALLOC"), *mode = getenv("CKFS_FAIL_ALLOC_MODE");
	if (n && *n)
		fail_at = strtol(n, NULL, 10);
	fail_after_mode = mode && strcmp(mode, "after") == 0;
	io_pattern = getenv("CKFS_FAIL_IO");
	if (io_pattern && !*io_pattern)
		io_pattern = NULL;
	const char *k = getenv("CKFS_FAIL_IO_AFTER");
	io_after = k ? strtol(k, NULL, 10) : 0;
	report_path = getenv("CKFS_FAIL_REPORT");
	if (report_path && report_fd < 0) /* a forked daemon inherits it */
		report_fd = open(report_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	io_arm = getenv("CKFS_FAIL_IO_ARM");
	probe_path = getenv("CKFS_PROBE_OPEN");
	probe_arm = getenv("CKFS_PROBE_ARM");
}

/* At exit, "count N": the allocations made, so a sweep knows its range. */
__attribute__((destructor)) static void fini(void)
{
	char num[24];
	if (fail_at < 0)
		return;
	snprintf(num, sizeof(num), "%ld", (long)atomic_load(&alloc_count));
	report("count", num);
}

static void *boot_alloc(size_t n)
{
	size_t at = (boot_used + 15) & ~(size_t)15;
	if (at + n > sizeof(boot))
		return NULL;
	boot_used = at + n;
	return boot + at;
}

static int in_boot(const void *p)
{
	return (const char *)p >= boot && (const char *)p < boot + sizeof(boot);
}

/* A sanitizer's runtime sets each new thread up (pthread_getattr_np,
 * which allocates) before the thread's start routine runs, and aborts
 * when that fails. So only threads that reached their start routine (and
 * the main thread, from the constructor on) have allocations counted and
 * failed: pthread_create is wrapped to mark them. */

struct start {
	void *(*fn)(void *);
	void *arg;
};

static void *started(void *p)
{
	struct start s = *(struct start *)p;

	real_free(p);
	thread_started = 1;
	return s.fn(s.arg);
}

/* Whether this allocation is the one (or one of those) to fail. */
#define fail_now() (fail_at >= 0 && thread_started && fail_counted())
static int fail_counted(void)
{
	long i = atomic_fetch_add(&alloc_count, 1) + 1;
	if (i == fail_at || (fail_after_mode && i > fail_at)) {
		if (i == fail_at) {
			char num[24];
			snprintf(num, sizeof(num), "%ld", i);
			report("alloc", num);
		}
		errno = ENOMEM;
		return 1;
	}
	return 0;
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	static int (*real_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
	struct start *s;

	if (!real_create)
		real_create = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
				       void *))dlsym(RTLD_NEXT, "pthread_create");
	if (!real_malloc)
		resolve();
	if (fail_now()) /* pthread_create allocates: a failure point too */
		return EAGAIN;
	s = real_malloc(sizeof(*s));
	if (!s)
		return EAGAIN;
	s->fn = fn;
	s->arg = arg;
	int rc = real_create(t, attr, started, s);
	if (rc != 0)
		real_free(s);
	return rc;
}

void *malloc(size_t n)
{
	if (!real_malloc) {
		if (resolving)
			return boot_alloc(n);
		resolve();
	}
	return fail_now() ? NULL : real_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	if (!real_calloc) {
		if (resolving)
			return n && size > SIZE_MAX / n ? NULL : boot_alloc(n * size);
		resolve();
	}
	return fail_now() ? NULL : real_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	if (in_boot(p)) { /* a boot block moves to the real heap */
		void *q = malloc(n);
		if (q)
			memcpy(q, p, n < (size_t)(boot + sizeof(boot) - (char *)p)
					     ? n : (size_t)(boot + sizeof(boot) - (char *)p));
		return q;
	}
	if (!real_realloc)
		resolve();
	return fail_now() ? NULL : real_realloc(p, n);
}

void free(void *p)
{
	if (!p || in_boot(p))
		return;
	if (!real_free)
		resolve();
	real_free(p);
}

int posix_memalign(void **out, size_t align, size_t n)
{
	if (!real_posix_memalign)
		resolve();
	return fail_now() ? ENOMEM : real_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
	if (!real_aligned_alloc)
		resolve();
	return fail_now() ? NULL : real_aligned_alloc(align, n);
}

/* ---- reads ---- */

static int fd_matches(int fd, char *path, size_t size)
{
	char link[64];
	ssize_t n;

	if (!io_pattern || fd < 0)
		return 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, size - 1);
	if (n <= 0)
		return 0;
	path[n] = '\0';
	return strstr(path, io_pattern) != NULL;
}

static int armed(void)
{
	return !io_arm || access(io_arm, F_OK) == 0;
}

static const char *errno_name(int e)
{
	return e == EACCES ? "EACCES" : e == EPERM ? "EPERM" : "other-error";
}

/* CKFS_PROBE_OPEN: once, while armed, try to open the path and an
 * Internet socket and say how it went. */
static void probe(void)
{
	if (!probe_path || !probe_arm || atomic_load(&probe_done) || access(probe_arm, F_OK) != 0 ||
	    atomic_exchange(&probe_done, 1))
		return;
	int fd = open(probe_path, O_RDONLY | O_CLOEXEC);
	int e = errno;
	char detail[4200];
	snprintf(detail, sizeof(detail), "%s %s", probe_path,
		 fd >= 0 ? "ok" : errno_name(e));
	if (fd >= 0)
		close(fd);
	report("probe", detail);
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	e = errno;
	report("probe-socket", s >= 0 ? "ok" : errno_name(e));
	if (s >= 0)
		close(s);
}

static int io_fail_now(int fd)
{
	char path[4096];

	probe();
	if (!fd_matches(fd, path, sizeof(path)) || !armed())
		return 0;
	if (atomic_fetch_add(&io_count, 1) < io_after)
		return 0;
	report("io", path);
	errno = EIO;
	return 1;
}

ssize_t read(int fd, void *buf, size_t n)
{
	if (!real_read)
		resolve();
	return io_fail_now(fd) ? -1 : real_read(fd, buf, n);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	if (!real_pread)
		resolve();
	return io_fail_now(fd) ? -1 : real_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
	if (!real_pread64)
		resolve();
	return io_fail_now(fd) ? -1 : real_pread64(fd, buf, n, off);
}

ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
	if (!real_preadv)
		resolve();
	return io_fail_now(fd) ? -1 : real_preadv(fd, iov, cnt, off);
}

/* ---- mappings ---- */

/* Mappings of a CKFS_FAIL_IO file are refused (ENODEV), so a reader
 * that maps falls back to pread, where read errors are injected; an
 * anonymous mapping is an allocation (src/cache/slice_mem.c). */
static void *map_or_fail(void *(*real)(void *, size_t, int, int, int, off_t),
			 void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	char path[4096];

	if (fd == -1 && (flags & MAP_ANONYMOUS) && fail_now()) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	if (fd_matches(fd, path, sizeof(path))) {
		errno = ENODEV;
		return MAP_FAILED;
	}
	return real(addr, len, prot, flags, fd, off);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (!real_mmap)
		resolve();
	return map_or_fail(real_mmap, addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (!real_mmap64)
		resolve();
	return map_or_fail(real_mmap64, addr, len, prot, flags, fd, off);
}
