/* SPDX-License-Identifier: MIT */
/*
 * The daemon's system-call allow-list (src/fuse/syscall_filter.h): a
 * seccomp filter applied with the Landlock rules, once the mount is
 * made. What a serving daemon calls (glibc, libfuse, libcurl, zlib and
 * ckfs itself, traced over every test tier: docs/reliability.md) is
 * allowed; the rest fails with EPERM, logged by the kernel (an audit line
 * "type=1326 ... syscall=N" in its log): a missed call makes one
 * operation fail, never the mount die, and says which call it was.
 * Narrowed by argument: sockets of the local family only (syslog,
 * systemd's notify socket), Internet and netlink ones (DNS) only for a
 * source in an object store; signals to this process only. Gone for
 * good: exec, fork, ptrace, mount, module, BPF, keyring, namespace and
 * privilege calls. Another ABI on the same CPU (x86's x32 or i386 calls)
 * kills the process: no list was written for it.
 *
 * Sanitizer builds run a symbolizer and LeakSanitizer's stop-the-world
 * (fork, exec, ptrace, wait): those are allowed in such builds only.
 */
#include "fuse/syscall_filter.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define FILTER_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define FILTER_ARCH AUDIT_ARCH_AARCH64
#endif

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

#ifdef FILTER_ARCH

/* Calls aarch64 has only in their *at or newer forms: absent there. */
#ifndef __NR_open
#define __NR_open -1
#define __NR_stat -1
#define __NR_lstat -1
#define __NR_access -1
#define __NR_readlink -1
#define __NR_getdents -1
#define __NR_rename -1
#define __NR_mkdir -1
#define __NR_rmdir -1
#define __NR_unlink -1
#define __NR_link -1
#define __NR_pipe -1
#define __NR_dup2 -1
#define __NR_poll -1
#define __NR_select -1
#define __NR_epoll_create -1
#define __NR_epoll_wait -1
#define __NR_time -1
#define __NR_arch_prctl -1
#define __NR_fork -1
#define __NR_vfork -1
#endif

/* The hot calls of a FUSE read first: the filter tries them in order. */
static const int allowed[] = {
	__NR_futex, __NR_read, __NR_write, __NR_pread64, __NR_writev, __NR_readv,
	__NR_preadv, __NR_preadv2, __NR_pwrite64, __NR_pwritev, __NR_pwritev2, __NR_splice,
	__NR_tee, __NR_vmsplice, __NR_lseek, __NR_mmap, __NR_munmap, __NR_mremap,
	__NR_mprotect, __NR_madvise, __NR_brk, __NR_membarrier, __NR_mincore,
	/* files, beneath what Landlock allows */
	__NR_open, __NR_openat, __NR_openat2, __NR_close, __NR_close_range, __NR_stat,
	__NR_fstat, __NR_lstat, __NR_newfstatat, __NR_statx, __NR_statfs, __NR_fstatfs,
	__NR_access, __NR_faccessat, __NR_faccessat2, __NR_readlink, __NR_readlinkat,
	__NR_getdents, __NR_getdents64, __NR_getcwd, __NR_mkdir, __NR_mkdirat, __NR_rename,
	__NR_renameat, __NR_renameat2, __NR_unlink, __NR_unlinkat, __NR_rmdir, __NR_link,
	__NR_linkat, __NR_fsync, __NR_fdatasync, __NR_ftruncate, __NR_fallocate,
	__NR_fadvise64, __NR_readahead, __NR_sync_file_range, __NR_flock, __NR_fcntl,
	__NR_ioctl, __NR_fchmod, __NR_fchmodat, __NR_utimensat, __NR_dup, __NR_dup2,
	__NR_dup3, __NR_pipe, __NR_pipe2, __NR_inotify_init1, __NR_inotify_add_watch,
	__NR_inotify_rm_watch, __NR_eventfd2, __NR_getxattr, __NR_lgetxattr,
	__NR_fgetxattr, __NR_listxattr, __NR_llistxattr, __NR_flistxattr, /* ACLs seen */
	__NR_chdir, __NR_setsid, /* the daemon's detach */
	/* waiting */
	__NR_poll, __NR_ppoll, __NR_select, __NR_pselect6, __NR_epoll_create,
	__NR_epoll_create1, __NR_epoll_ctl, __NR_epoll_wait, __NR_epoll_pwait,
	__NR_epoll_pwait2, __NR_nanosleep, __NR_clock_nanosleep, __NR_clock_gettime,
	__NR_clock_getres, __NR_gettimeofday, __NR_time, __NR_sched_yield,
	__NR_sched_getaffinity,
	/* threads and signals */
	__NR_clone, __NR_clone3, __NR_exit, __NR_exit_group, __NR_set_robust_list,
	__NR_get_robust_list, __NR_set_tid_address, __NR_rseq, __NR_rt_sigaction,
	__NR_rt_sigprocmask, __NR_rt_sigreturn, __NR_rt_sigtimedwait, __NR_sigaltstack,
	__NR_wait4, /* the unmount helper's end */
	/* who and where */
	__NR_getpid, __NR_gettid, __NR_getppid, __NR_getuid, __NR_geteuid, __NR_getgid,
	__NR_getegid, __NR_getgroups, __NR_getresuid, __NR_getresgid, __NR_getrlimit,
	__NR_prlimit64, __NR_getrusage, __NR_uname, __NR_sysinfo, __NR_times, __NR_prctl,
	__NR_arch_prctl, __NR_getrandom,
	/* sockets (socket(2) itself is narrowed below) */
	__NR_connect, __NR_sendto, __NR_recvfrom, __NR_sendmsg, __NR_recvmsg,
	__NR_sendmmsg, __NR_recvmmsg, __NR_getsockopt, __NR_setsockopt, __NR_getsockname,
	__NR_getpeername, __NR_shutdown, __NR_bind, __NR_socketpair,
};

/* Sanitizer builds only: the symbolizer and the leak checker. */
static const int allowed_sanitized[] = {
	__NR_execve, __NR_fork, __NR_vfork, __NR_ptrace, __NR_waitid, __NR_kill,
	__NR_tgkill, __NR_tkill, __NR_process_vm_readv, __NR_personality, __NR_setrlimit,
	__NR_sched_getparam, __NR_getpriority,
};

#define MAX_INSNS 512
#define ARG0_LOW offsetof(struct seccomp_data, args[0]) /* little-endian: low word */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the filter reads a call's first argument's low word as little-endian"
#endif

struct program {
	struct sock_filter insn[MAX_INSNS];
	unsigned short n;
};

static void emit(struct program *p, struct sock_filter f)
{
	if (p->n < MAX_INSNS)
		p->insn[p->n] = f;
	p->n++;
}

#define STMT(code, k) emit(p, (struct sock_filter)BPF_STMT(code, k))
#define JUMP(code, k, jt, jf) emit(p, (struct sock_filter)BPF_JUMP(code, k, jt, jf))
#define LOAD(off) STMT(BPF_LD | BPF_W | BPF_ABS, (off))
#define RET(action) STMT(BPF_RET | BPF_K, (action))
#define DENY(e) RET(SECCOMP_RET_ERRNO | (e))

static void allow_list(struct program *p, const int *nrs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (nrs[i] < 0)
			continue;
		JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nrs[i], 0, 1);
		RET(SECCOMP_RET_ALLOW);
	}
}

/* nr is allowed when its first argument is one of vals (the accumulator
 * holds the call's number on entry; the block ends in a return). */
static void allow_if_arg0(struct program *p, int nr, const unsigned *vals, size_t n)
{
	JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, (unsigned char)(2 * n + 2));
	LOAD(ARG0_LOW);
	for (size_t i = 0; i < n; i++) {
		JUMP(BPF_JMP | BPF_JEQ | BPF_K, vals[i], 0, 1);
		RET(SECCOMP_RET_ALLOW);
	}
	DENY(EPERM);
}

static void build(struct program *p, bool network)
{
	static const unsigned local[] = { AF_UNIX };
	static const unsigned remote[] = { AF_UNIX, AF_INET, AF_INET6, AF_NETLINK };
	const unsigned self[] = { (unsigned)getpid() };

	LOAD(offsetof(struct seccomp_data, arch));
	JUMP(BPF_JMP | BPF_JEQ | BPF_K, FILTER_ARCH, 1, 0);
	RET(SECCOMP_RET_KILL_PROCESS);
	LOAD(offsetof(struct seccomp_data, nr));
#ifdef __x86_64__
	JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000U, 0, 1); /* x32 */
	RET(SECCOMP_RET_KILL_PROCESS);
#endif
	allow_list(p, allowed, sizeof(allowed) / sizeof(allowed[0]));
	if (network)
		allow_if_arg0(p, __NR_socket, remote, sizeof(remote) / sizeof(remote[0]));
	else
		allow_if_arg0(p, __NR_socket, local, 1);
	if (SANITIZED) {
		allow_list(p, allowed_sanitized,
			   sizeof(allowed_sanitized) / sizeof(allowed_sanitized[0]));
	} else {
		allow_if_arg0(p, __NR_kill, self, 1);
		allow_if_arg0(p, __NR_tgkill, self, 1);
	}
	DENY(EPERM);
}

enum ckfs_code ckfs_syscall_filter_apply(bool network, bool *applied, struct ckfs_error *err)
{
	static struct program prog; /* built once; 4 KiB kept off the stack */

	*applied = false;
	prog.n = 0;
	build(&prog, network);
	if (prog.n > MAX_INSNS)
		return ckfs_fail(err, CKFS_E_LIMIT, "sandbox: the system-call filter is too long");
	struct sock_fprog fprog = { .len = prog.n, .filter = prog.insn };
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
		    SECCOMP_FILTER_FLAG_TSYNC | SECCOMP_FILTER_FLAG_LOG, &fprog) != 0)
		return ckfs_fail_errno(err, "sandbox: cannot apply the system-call filter");
	*applied = true;
	return CKFS_OK;
}

#else /* no list for this architecture */

enum ckfs_code ckfs_syscall_filter_apply(bool network, bool *applied, struct ckfs_error *err)
{
	(void)network;
	(void)err;
	*applied = false;
	return CKFS_OK;
}

#endif
