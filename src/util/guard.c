/* SPDX-License-Identifier: MIT */
/* SIGBUS recovery for mapped reads: see include/ckfs/guard.h. */
#include "ckfs/guard.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>

static struct sigaction previous;
static int installed; /* set once by install() */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static __thread sigjmp_buf *recovery;

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
	(void)info;
	(void)uctx;
	if (recovery)
		siglongjmp(*recovery, 1);
	/* Not ours: put the previous disposition back and return, so the
	 * faulting access runs again and gets it. */
	sigaction(sig, &previous, NULL);
}

static void install(void)
{
	struct sigaction sa = { 0 };

	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	installed = sigaction(SIGBUS, &sa, &previous) == 0;
}

int ckfs_guard_init(void)
{
	pthread_once(&install_once, install);
	return installed == 1 ? 0 : -1;
}

int ckfs_guarded(void (*fn)(void *arg), void *arg)
{
	sigjmp_buf here;
	/* savemask 1: the jump out of the handler restores the signal mask,
	 * unblocking SIGBUS for the next fault. */
	if (sigsetjmp(here, 1)) {
		recovery = NULL;
		return -1;
	}
	recovery = &here;
	fn(arg);
	recovery = NULL;
	return 0;
}
