/* SPDX-License-Identifier: MIT */
/*
 * include/ckfs/guard.h: a SIGBUS from a mapping whose file was truncated
 * ends the guarded call with -1 instead of the process, repeatedly and on
 * several threads; calls that do not fault return 0 with their work done.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckfs/guard.h"
#include "test.h"

#define MAP_BYTES (1u << 20)

struct sum_job {
	const volatile unsigned char *p;
	size_t len;
	unsigned long sum;
};

static void sum_bytes(void *arg)
{
	struct sum_job *j = arg;

	for (size_t i = 0; i < j->len; i += 512)
		j->sum += j->p[i];
}

/* A MAP_BYTES file of 0x01 bytes, mapped; *fd_out stays open. */
static unsigned char *make_mapped(int *fd_out)
{
	char path[] = "/tmp/ckfs-test-guard-XXXXXX";
	int fd = mkstemp(path);
	unsigned char *buf = malloc(MAP_BYTES), *p;

	if (fd < 0 || !buf)
		return NULL;
	unlink(path);
	memset(buf, 1, MAP_BYTES);
	if (write(fd, buf, MAP_BYTES) != (ssize_t)MAP_BYTES) {
		free(buf);
		return NULL;
	}
	free(buf);
	p = mmap(NULL, MAP_BYTES, PROT_READ, MAP_SHARED, fd, 0);
	*fd_out = fd;
	return p == MAP_FAILED ? NULL : p;
}

static void test_no_fault(void)
{
	int fd;
	unsigned char *p = make_mapped(&fd);
	struct sum_job j = { .len = MAP_BYTES };

	CHECK(p != NULL);
	if (!p)
		return;
	j.p = p;
	CHECK_EQ_INT(ckfs_guard_init(), 0);
	CHECK_EQ_INT(ckfs_guarded(sum_bytes, &j), 0);
	CHECK_EQ_INT(j.sum, MAP_BYTES / 512);
	munmap(p, MAP_BYTES);
	close(fd);
}

static void test_truncated(void)
{
	int fd;
	unsigned char *p = make_mapped(&fd);

	CHECK(p != NULL);
	if (!p)
		return;
	CHECK_EQ_INT(ftruncate(fd, 4096), 0);
	CHECK_EQ_INT(ckfs_guard_init(), 0);
	for (int round = 0; round < 3; round++) { /* the handler survives */
		struct sum_job j = { .p = p, .len = MAP_BYTES };
		CHECK_EQ_INT(ckfs_guarded(sum_bytes, &j), -1);
		CHECK_EQ_INT(j.sum, 8); /* the first page was read */
	}
	/* Still usable for a range that is there. */
	struct sum_job ok = { .p = p, .len = 4096 };
	CHECK_EQ_INT(ckfs_guarded(sum_bytes, &ok), 0);
	munmap(p, MAP_BYTES);
	close(fd);
}

static void *thread_main(void *arg)
{
	unsigned char *p = arg;
	int *fails = calloc(1, sizeof(int));

	for (int i = 0; fails && i < 50; i++) {
		struct sum_job j = { .p = p, .len = MAP_BYTES };
		*fails += ckfs_guarded(sum_bytes, &j) == -1;
	}
	return fails;
}

static void test_threads(void)
{
	int fd;
	unsigned char *p = make_mapped(&fd);
	pthread_t th[4];

	CHECK(p != NULL);
	if (!p)
		return;
	CHECK_EQ_INT(ftruncate(fd, 0), 0);
	for (int i = 0; i < 4; i++)
		CHECK_EQ_INT(pthread_create(&th[i], NULL, thread_main, p), 0);
	for (int i = 0; i < 4; i++) {
		void *r = NULL;
		pthread_join(th[i], &r);
		CHECK(r != NULL && *(int *)r == 50);
		free(r);
	}
	munmap(p, MAP_BYTES);
	close(fd);
}

int main(void)
{
	RUN(test_no_fault);
	RUN(test_truncated);
	RUN(test_threads);
	return test_summary();
}
