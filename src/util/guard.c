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

/*
 * A SIGBUS outside a guarded call: what the previous disposition would
 * have done. A handler (a sanitizer's, which reports where) is called.
 * Otherwise the process dies of SIGBUS now, even if the access would not
 * fault again (the file grew back): returning with the default disposition
 * put back would leave every later guarded call unprotected. A SIGBUS
 * sent by someone (si_code <= 0) is ignored if it was ignored before; a
 * fault cannot be.
 */
static void not_ours(int sig, siginfo_t *info, void *uctx)
{
	if (previous.sa_flags & SA_SIGINFO) {
		previous.sa_sigaction(sig, info, uctx);
		return;
	}
	if (previous.sa_handler == SIG_IGN && info && info->si_code <= 0)
		return;
	if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
		previous.sa_handler(sig);
		return;
	}
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	sigemptyset(&dfl.sa_mask);
	sigaction(sig, &dfl, NULL);
	raise(sig); /* pending while in here; delivered on return */
}

static void on_sigbus(int sig, siginfo_t *info, void *uctx)
{
	if (recovery)
		siglongjmp(*recovery, 1);
	not_ours(sig, info, uctx);
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
	sigset_t bus, old;

	/* A fault with SIGBUS blocked kills the process whatever the
	 * handler, so unblock it here whatever the thread's mask (threads
	 * that block everything exist: libraries' workers). This one call
	 * also saves the mask, which a jump out of the handler must put
	 * back, so sigsetjmp need not (savemask 0: no second call). */
	sigemptyset(&bus);
	sigaddset(&bus, SIGBUS);
	pthread_sigmask(SIG_UNBLOCK, &bus, &old);
	if (sigsetjmp(here, 0)) {
		recovery = NULL;
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return -1;
	}
	recovery = &here;
	fn(arg);
	recovery = NULL;
	if (sigismember(&old, SIGBUS))
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	return 0;
}
