/* SPDX-License-Identifier: MIT */
/*
 * Reading mapped files without dying of SIGBUS. Touching a page of a
 * shared file mapping past the file's current end raises SIGBUS, which is
 * what a source truncated while mounted does to a mapped read.
 * ckfs_guarded() runs fn(arg) with a recovery point for the calling
 * thread: a SIGBUS inside it ends fn early and makes ckfs_guarded return
 * nonzero. fn must only read and write memory (no locks, no allocation),
 * since it may be cut short anywhere. SIGBUS is unblocked for the call,
 * whatever the thread's signal mask (a fault with SIGBUS blocked would
 * kill the process however it is handled), and the mask is put back after.
 * A SIGBUS outside a guarded call goes to the handler that was there
 * before; by default the process dies of it, at once and every time.
 */
#ifndef CKFS_GUARD_H
#define CKFS_GUARD_H

/* Install the process-wide SIGBUS handler (once; later calls only
 * report): 0 when it is in place, -1 when sigaction failed. */
int ckfs_guard_init(void);
/* After a successful ckfs_guard_init: 0 when fn returned, -1 when a SIGBUS
 * cut it short. */
int ckfs_guarded(void (*fn)(void *arg), void *arg);

#endif
