/* SPDX-License-Identifier: MIT */
/*
 * The daemon's system-call allow-list (src/fuse/syscall_filter.c), part
 * of its sandbox (src/fuse/sandbox.h, docs/reliability.md).
 */
#ifndef CKFS_FUSE_SYSCALL_FILTER_H
#define CKFS_FUSE_SYSCALL_FILTER_H

#include <stdbool.h>

#include "ckfs/err.h"

/* Confine this process (all its threads) to the system calls a serving
 * daemon makes; others fail with EPERM and are logged by the kernel.
 * network: a source in an object store (Internet sockets allowed).
 * *applied: false where this architecture has no list (nothing done). */
enum ckfs_code ckfs_syscall_filter_apply(bool network, bool *applied,
					 struct ckfs_error *err) CKFS_WARN_UNUSED;

#endif
