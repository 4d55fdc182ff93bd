/* SPDX-License-Identifier: MIT */
/*
 * Whole reads and writes (include/ckfs/io.h): all n bytes through short
 * transfers and signals, fewer only at end of file, -1 with errno on a
 * failure, and the p- variants at their offsets.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/io.h"
#include "test.h"

static atomic_int alarms;

static void on_alarm(int sig)
{
	(void)sig;
	atomic_fetch_add(&alarms, 1);
}

struct feeder {
	int fd;
	const unsigned char *p;
	size_t n, chunk;
	bool read_side; /* drain fd into p (as unsigned char *) instead */
};

static void pause_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&t, &t) < 0 && errno == EINTR)
		;
}

/* Signals go to the main thread alone: its call is the one interrupted. */
static void block_alarm(void)
{
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &s, NULL);
}

static void *feed(void *arg)
{
	struct feeder *f = arg;

	block_alarm();
	pause_ms(60); /* the main thread blocks first, and a signal comes */
	for (size_t done = 0; done < f->n;) {
		size_t k = f->n - done < f->chunk ? f->n - done : f->chunk;
		ssize_t r = f->read_side ? read(f->fd, (unsigned char *)f->p + done, k)
					 : write(f->fd, f->p + done, k);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		done += (size_t)r;
		pause_ms(2);
	}
	close(f->fd);
	return NULL;
}

/* A repeating SIGALRM without SA_RESTART: blocked calls fail with EINTR. */
static void alarms_on(bool on)
{
	struct sigaction sa;
	struct itimerval it = { { 0, on ? 5000 : 0 }, { 0, on ? 5000 : 0 } };

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on ? on_alarm : SIG_DFL;
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
}

static void test_read_full_pipe(void)
{
	unsigned char src[3000], dst[4000];
	int p[2];
	pthread_t t;

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (unsigned char)(i * 7);
	CHECK(pipe(p) == 0);
	struct feeder f = { p[1], src, sizeof(src), 100, false };
	atomic_store(&alarms, 0);
	alarms_on(true);
	pthread_create(&t, NULL, feed, &f);
	/* 3000 bytes in writes of 100, then end of file: short at EOF only */
	CHECK_EQ_INT(ckfs_read_full(p[0], dst, sizeof(src)), sizeof(src));
	alarms_on(false);
	CHECK(memcmp(dst, src, sizeof(src)) == 0);
	CHECK_EQ_INT(ckfs_read_full(p[0], dst, sizeof(dst)), 0);
	pthread_join(t, NULL);
	CHECK(atomic_load(&alarms) > 0);
	close(p[0]);

	CHECK(pipe(p) == 0);
	CHECK_EQ_INT(write(p[1], "abcde", 5), 5);
	close(p[1]);
	CHECK_EQ_INT(ckfs_read_full(p[0], dst, 10), 5);
	CHECK(memcmp(dst, "abcde", 5) == 0);
	close(p[0]);
}

static void test_write_full_pipe(void)
{
	size_t n = 1 << 20; /* more than a pipe holds: short writes */
	unsigned char *src = malloc(n), *dst = malloc(n);
	int p[2];
	pthread_t t;

	for (size_t i = 0; i < n; i++)
		src[i] = (unsigned char)(i * 13 + 1);
	CHECK(pipe(p) == 0);
	struct feeder f = { p[0], dst, n, 65536, true };
	atomic_store(&alarms, 0);
	alarms_on(true);
	pthread_create(&t, NULL, feed, &f);
	CHECK_EQ_INT(ckfs_write_full(p[1], src, n), n);
	alarms_on(false);
	close(p[1]);
	pthread_join(t, NULL);
	CHECK(memcmp(dst, src, n) == 0);
	CHECK(atomic_load(&alarms) > 0);
	free(src);
	free(dst);
}

static void test_p_variants(void)
{
	char path[] = "/tmp/ckfs-test-io-XXXXXX", buf[16];
	int fd = mkstemp(path);

	CHECK(fd >= 0);
	unlink(path);
	CHECK_EQ_INT(ckfs_pwrite_full(fd, "0123456789", 10, 100), 10);
	CHECK_EQ_INT(ckfs_pread_full(fd, buf, 4, 103), 4);
	CHECK(memcmp(buf, "3456", 4) == 0);
	/* 3 bytes left at 107: fewer at end of file, none past it */
	CHECK_EQ_INT(ckfs_pread_full(fd, buf, 16, 107), 3);
	CHECK(memcmp(buf, "789", 3) == 0);
	CHECK_EQ_INT(ckfs_pread_full(fd, buf, 16, 500), 0);
	CHECK_EQ_INT(ckfs_pread_full(fd, buf, 0, 0), 0);
	/* the file offset is not moved by the p- calls */
	CHECK_EQ_INT(lseek(fd, 0, SEEK_CUR), 0);
	CHECK_EQ_INT(ckfs_write_full(fd, "xy", 2), 2);
	CHECK_EQ_INT(ckfs_pread_full(fd, buf, 2, 0), 2);
	CHECK(memcmp(buf, "xy", 2) == 0);
	errno = 0;
	CHECK_EQ_INT(ckfs_pread_full(fd, buf, 1, UINT64_MAX), -1);
	CHECK_EQ_INT(errno, EINVAL);
	close(fd);
}

static void test_failures(void)
{
	char buf[4];
	int p[2];

	errno = 0;
	CHECK_EQ_INT(ckfs_read_full(-1, buf, 4), -1);
	CHECK_EQ_INT(errno, EBADF);
	errno = 0;
	CHECK_EQ_INT(ckfs_pwrite_full(-1, buf, 4, 0), -1);
	CHECK_EQ_INT(errno, EBADF);
	/* a pipe with no reader: EPIPE (SIGPIPE ignored here) */
	signal(SIGPIPE, SIG_IGN);
	CHECK(pipe(p) == 0);
	close(p[0]);
	errno = 0;
	CHECK_EQ_INT(ckfs_write_full(p[1], "abcd", 4), -1);
	CHECK_EQ_INT(errno, EPIPE);
	close(p[1]);
	signal(SIGPIPE, SIG_DFL);
}

int main(void)
{
	RUN(test_read_full_pipe);
	RUN(test_write_full_pipe);
	RUN(test_p_variants);
	RUN(test_failures);
	return test_summary();
}
