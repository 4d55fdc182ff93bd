/* SPDX-License-Identifier: MIT */
/*
 * include/ckfs/guard.h: a SIGBUS from a mapping whose file was truncated
 * ends the guarded call with -1 instead of the process, repeatedly, on
 * several threads, and on a thread that blocks every signal (the mask is
 * put back after); calls that do not fault return 0 with their work done.
 * A SIGBUS outside a guarded call does what the disposition before the
 * guard would have done, at once: a handler is called, the default kills.
 * Cases that may kill the process run in a child.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
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

/* Runs fn in a child process; returns its wait status. */
static int in_child(int (*fn)(void))
{
	int status = 0;
	pid_t pid = fork();

	if (pid == 0)
		_exit(fn());
	CHECK(pid > 0);
	if (pid > 0)
		CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
	return status;
}

static void *blocked_thread_main(void *arg)
{
	unsigned char *p = arg;
	sigset_t all, after;
	intptr_t bad = 0;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	for (int i = 0; i < 3; i++) {
		struct sum_job j = { .p = p, .len = MAP_BYTES };
		bad |= ckfs_guarded(sum_bytes, &j) != -1;
		pthread_sigmask(SIG_SETMASK, NULL, &after);
		bad |= (!sigismember(&after, SIGBUS) || !sigismember(&after, SIGTERM)) << 1;
	}
	struct sum_job ok = { .p = p, .len = 4096 };
	bad |= (ckfs_guarded(sum_bytes, &ok) != 0 || ok.sum != 8) << 2;
	pthread_sigmask(SIG_SETMASK, NULL, &after);
	bad |= (!sigismember(&after, SIGBUS)) << 3;
	return (void *)bad;
}

static int blocked_thread_child(void)
{
	int fd;
	unsigned char *p = make_mapped(&fd);
	pthread_t th;
	void *bad = (void *)1;

	if (!p || ftruncate(fd, 4096) != 0 || ckfs_guard_init() != 0)
		return 20;
	if (pthread_create(&th, NULL, blocked_thread_main, p) != 0)
		return 21;
	pthread_join(th, &bad);
	return (int)(intptr_t)bad; /* 0, or the bits of what went wrong */
}

/* A thread that blocks every signal (as libraries' worker threads do)
 * recovers too, and keeps its mask. */
static void test_blocked_thread(void)
{
	int status = in_child(blocked_thread_child);

	CHECK(WIFEXITED(status));
	CHECK_EQ_INT(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), 0);
}

static volatile sig_atomic_t chained;

static void count_sigbus(int sig)
{
	(void)sig;
	chained++;
}

static int set_disposition(void (*handler)(int))
{
	struct sigaction sa = { .sa_handler = handler };

	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL);
}

/* These two children install the guard over a disposition of their
 * own: they must run before any case installs it in this process. */
static int stray_default_child(void)
{
	if (set_disposition(SIG_DFL) != 0 || ckfs_guard_init() != 0)
		return 20;
	raise(SIGBUS); /* outside any guarded call: must not return */
	return 3;
}

static int stray_handler_child(void)
{
	if (set_disposition(count_sigbus) != 0 || ckfs_guard_init() != 0)
		return 20;
	raise(SIGBUS);
	raise(SIGBUS); /* the guard is still installed: chained again */
	if (chained != 2)
		return 4;
	/* and still recovers a fault inside a guarded call */
	int fd;
	unsigned char *p = make_mapped(&fd);
	struct sum_job j = { .len = MAP_BYTES };
	if (!p || ftruncate(fd, 0) != 0)
		return 21;
	j.p = p;
	return ckfs_guarded(sum_bytes, &j) == -1 && chained == 2 ? 0 : 5;
}

/* A SIGBUS outside a guarded call, with the default disposition before
 * the guard: the process dies of it at once, rather than going on with
 * the default put back (which would make a later guarded fault fatal). */
static void test_stray_default(void)
{
	int status = in_child(stray_default_child);

	CHECK(WIFSIGNALED(status));
	CHECK_EQ_INT(WIFSIGNALED(status) ? WTERMSIG(status) : 1000 + WEXITSTATUS(status),
		     SIGBUS);
}

/* With a handler before the guard: it gets the stray SIGBUS, every time,
 * and the guard stays in place. */
static void test_stray_handler(void)
{
	int status = in_child(stray_handler_child);

	CHECK(WIFEXITED(status));
	CHECK_EQ_INT(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), 0);
}

int main(void)
{
	RUN(test_stray_default); /* first: see stray_default_child */
	RUN(test_stray_handler);
	RUN(test_blocked_thread);
	RUN(test_no_fault);
	RUN(test_truncated);
	RUN(test_threads);
	return test_summary();
}
