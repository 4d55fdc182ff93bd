/* SPDX-License-Identifier: MIT */
/*
 * The daemon's sandbox (src/fuse/sandbox.h, docs/reliability.md). Once a
 * mount serves, the daemon needs its sources, its cache folders, /proc and
 * /dev/fuse (already open): it parses untrusted checkpoints, often as
 * root, for weeks. What the kernel offers is used:
 *
 *  - PR_SET_NO_NEW_PRIVS: nothing it could execute gains privileges;
 *  - Landlock (every file-system right the kernel's ABI knows is handled):
 *    read beneath SRC, --config, --base and /proc; read and write beneath
 *    the plan cache and --s3-cache; read beneath the library folders
 *    (glibc loads libgcc_s when libfuse cancels its workers), and beneath
 *    /etc and /usr when a source is in an object store (DNS, CA
 *    certificates, NSS modules); a sanitizer's log folder and
 *    suppressions file. Nothing may be
 *    executed or created anywhere else.
 *
 * A Landlock domain may not unmount (the kernel refuses topology changes
 * to it), so a helper forked before the sandbox, holding nothing but a
 * pipe, unmounts when the daemon says so or dies (as libfuse's
 * auto_unmount does): a crashed daemon leaves no dead mount behind. The
 * helper uses system calls only (it is the child of a threaded process).
 */
#include "fuse/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/landlock.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckfs/log.h"
#include "fuse/syscall_filter.h"

extern char **environ;

/* Rights of later ABIs than Debian 12's headers know (their values are
 * the kernel's stable ABI). */
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14) /* ABI 3 */
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */
#endif

/* ---- Landlock ---- */

static int ll_abi(void)
{
	return (int)syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
}

/* The file-system rights ABI abi knows (all of them are handled, so that
 * none is left open by omission). */
static __u64 fs_rights(int abi)
{
	__u64 r = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1; /* ABI 1: EXECUTE .. MAKE_SYM */
	if (abi >= 2)
		r |= LANDLOCK_ACCESS_FS_REFER;
	if (abi >= 3)
		r |= LANDLOCK_ACCESS_FS_TRUNCATE;
	if (abi >= 5)
		r |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
	return r;
}

#define READ_RIGHTS (LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR)
/* a cache folder: files made, written, renamed within a folder, removed */
#define WRITE_RIGHTS (READ_RIGHTS | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_TRUNCATE | \
		      LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_REMOVE_FILE | \
		      LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR)
#define FILE_RIGHTS (LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE | \
		     LANDLOCK_ACCESS_FS_TRUNCATE)

/* path (a folder, or a file: file rights only) beneath which rights hold;
 * a path that does not exist is skipped. */
static int allow(int ruleset, const char *path, __u64 rights, __u64 handled)
{
	struct landlock_path_beneath_attr pb = { 0 };
	struct stat st;

	if (!path || !*path)
		return 0;
	pb.parent_fd = open(path, O_PATH | O_CLOEXEC);
	if (pb.parent_fd < 0)
		return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
	if (fstat(pb.parent_fd, &st) == 0 && !S_ISDIR(st.st_mode))
		rights &= FILE_RIGHTS;
	pb.allowed_access = rights & handled;
	int rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
	int e = errno;
	close(pb.parent_fd);
	errno = e;
	return rc == 0 ? 0 : -1;
}

/* The absolute path of a sanitizer's option key= in env var name, into
 * out ("" when none); with dir, its folder. A sanitizer opens both late:
 * log_path's files when it reports, suppressions= at the leak check. */
static void sanitizer_path(const char *name, const char *key, bool dir, char *out, size_t size)
{
	const char *v = getenv(name), *p = v ? strstr(v, key) : NULL;

	out[0] = '\0';
	if (!p || (p != v && p[-1] != ':' && p[-1] != ' ' && p[-1] != ','))
		return;
	p += strlen(key);
	size_t n = strcspn(p, ": ,");
	if (n == 0 || n >= size || *p != '/')
		return;
	memcpy(out, p, n);
	out[n] = '\0';
	char *slash = dir ? strrchr(out, '/') : NULL;
	if (slash)
		*(slash == out ? slash + 1 : slash) = '\0';
}

/* A sanitizer build symbolizes its reports by running addr2line or
 * llvm-symbolizer on the binary and its libraries (the test shim among
 * them), and its leak suppressions match those names: in such builds
 * only, /usr/bin may be read and run, and the executable's folder and
 * LD_PRELOAD's libraries read. */
static int allow_symbolizer(int rs, __u64 handled)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	char exe[PATH_MAX], lib[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int bad = allow(rs, "/usr/bin", READ_RIGHTS | LANDLOCK_ACCESS_FS_EXECUTE, handled);

	if (n > 0) {
		exe[n] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash && slash != exe)
			*slash = '\0';
		bad |= allow(rs, exe, READ_RIGHTS, handled);
	}
	for (const char *p = getenv("LD_PRELOAD"); p && *p;) {
		size_t k = strcspn(p, ": ");
		if (k && k < sizeof(lib)) {
			memcpy(lib, p, k);
			lib[k] = '\0';
			bad |= allow(rs, lib, READ_RIGHTS, handled);
		}
		p += k + (p[k] != '\0');
	}
	return bad;
#else
	(void)rs;
	(void)handled;
	return 0;
#endif
}

static enum ckfs_code landlock(const struct ckfs_sandbox_rules *p, struct ckfs_error *err,
			       int *applied)
{
	static const char *const system_dirs[] = { "/etc", "/usr" };
	static const char *const lib_dirs[] = { "/lib", "/lib64", "/usr/lib", "/usr/lib64" };
	static const char *const sanitizers[] = { "ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS",
						  "LSAN_OPTIONS" };
	int abi = ll_abi();
	char dir[PATH_MAX];

	*applied = 0;
	if (abi < 1) {
		ckfs_log(CKFS_LOG_NOTICE, "sandbox: no Landlock in this kernel (%s): the daemon "
			 "is confined by no_new_privs only", strerror(errno));
		return CKFS_OK;
	}
	__u64 handled = fs_rights(abi);
	struct landlock_ruleset_attr attr = { .handled_access_fs = handled };
	int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof(attr), 0);
	if (rs < 0)
		return ckfs_fail_errno(err, "sandbox: cannot create a Landlock ruleset");
	int bad = 0;
	for (size_t i = 0; i < p->n_read; i++)
		bad |= allow(rs, p->read[i], READ_RIGHTS, handled);
	for (size_t i = 0; i < p->n_write; i++)
		bad |= allow(rs, p->write[i], WRITE_RIGHTS, handled);
	bad |= allow(rs, "/proc", READ_RIGHTS, handled);
	/* libraries glibc loads on demand (libgcc_s for pthread_cancel's
	 * unwinding, NSS): public files, read only */
	for (size_t i = 0; i < sizeof(lib_dirs) / sizeof(lib_dirs[0]); i++)
		bad |= allow(rs, lib_dirs[i], READ_RIGHTS, handled);
	bad |= allow(rs, "/etc/localtime", READ_RIGHTS, handled); /* syslog's clock */
	bad |= allow(rs, "/usr/share/zoneinfo", READ_RIGHTS, handled);
	for (size_t i = 0; p->network && i < sizeof(system_dirs) / sizeof(system_dirs[0]); i++)
		bad |= allow(rs, system_dirs[i], READ_RIGHTS, handled);
	for (size_t i = 0; i < sizeof(sanitizers) / sizeof(sanitizers[0]); i++) {
		sanitizer_path(sanitizers[i], "log_path=", true, dir, sizeof(dir));
		bad |= allow(rs, dir, WRITE_RIGHTS, handled);
		sanitizer_path(sanitizers[i], "suppressions=", false, dir, sizeof(dir));
		bad |= allow(rs, dir, READ_RIGHTS, handled);
	}
	bad |= allow_symbolizer(rs, handled);
#ifdef CKFS_COVERAGE_DIR /* a coverage build's counts, written at exit */
	bad |= allow(rs, CKFS_COVERAGE_DIR, WRITE_RIGHTS, handled);
#endif
	if (bad || syscall(SYS_landlock_restrict_self, rs, 0) != 0) {
		enum ckfs_code rc = ckfs_fail_errno(err, "sandbox: cannot apply the Landlock rules");
		close(rs);
		return rc;
	}
	close(rs);
	*applied = abi;
	return CKFS_OK;
}

/* ---- the mounting user ---- */

/* Started as root with -o uid=: become that user, with -o gid= (else its
 * own group) and its supplementary groups, for good (setuid(0) must fail
 * after). It must then read the sources and write the caches: a mount it
 * could not serve is refused here, not found out at a read. The process
 * stays not dumpable, so the user cannot ptrace it or open its
 * descriptors (root opened the sources and /dev/fuse). */
static enum ckfs_code drop_to_user(const struct ckfs_sandbox_rules *p, struct ckfs_error *err)
{
	struct passwd pw, *found = NULL;
	char buf[16384];
	unsigned uid = (unsigned)p->uid;

	if (getpwuid_r(p->uid, &pw, buf, sizeof(buf), &found) != 0)
		found = NULL;
	if (!p->has_gid && !found)
		return ckfs_fail(err, CKFS_E_INVALID, "-o uid=%u: no such user in the user "
				 "database, so no group to run as: give -o gid= too", uid);
	gid_t gid = p->has_gid ? p->gid : found->pw_gid;
	if ((found ? initgroups(found->pw_name, gid) : setgroups(1, &gid)) != 0 ||
	    setresgid(gid, gid, gid) != 0 || setresuid(p->uid, p->uid, p->uid) != 0)
		return ckfs_fail_errno(err, "-o uid=%u: cannot become this user", uid);
	if (setuid(0) == 0 || geteuid() != p->uid || getegid() != gid)
		return ckfs_fail(err, CKFS_E_IO, "-o uid=%u: root privileges were not dropped", uid);
	for (size_t i = 0; i < p->n_read + p->n_write; i++) {
		bool w = i >= p->n_read;
		const char *path = w ? p->write[i - p->n_read] : p->read[i];
		struct stat st;
		if (!path)
			continue;
		if (stat(path, &st) != 0) {
			if (errno == ENOENT)
				continue; /* not there: not allowed either */
		} else if (access(path, (w ? R_OK | W_OK : R_OK) |
					(S_ISDIR(st.st_mode) ? X_OK : 0)) == 0) {
			continue;
		}
		return ckfs_fail_errno(err, "-o uid=%u: the daemon runs as this user once "
					       "mounted, and it cannot %s '%s'", uid,
					       w ? "write" : "read", path);
	}
	return CKFS_OK;
}

/* ---- the unmount helper ---- */

/* A mount's id that is never reused (kernel 6.8+), else the plain one,
 * which a mount made on the same point after an unmount may get again. */
#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x00004000U
#endif

static int mount_id(const char *mnt, __u64 *id)
{
	struct statx sx;

	if (statx(AT_FDCWD, mnt, AT_STATX_DONT_SYNC, STATX_MNT_ID_UNIQUE, &sx) == 0 &&
	    (sx.stx_mask & STATX_MNT_ID_UNIQUE)) {
		*id = sx.stx_mnt_id;
		return 0;
	}
	if (statx(AT_FDCWD, mnt, AT_STATX_DONT_SYNC, STATX_MNT_ID, &sx) == 0 &&
	    (sx.stx_mask & STATX_MNT_ID)) {
		*id = sx.stx_mnt_id;
		return 0;
	}
	return -1;
}

/* The helper's exit: the system call itself, not _exit, which sanitizers
 * intercept to report on the threads this fork of a threaded daemon
 * holds copies of (TSan saw them as leaked). */
static _Noreturn void helper_exit(int code)
{
	for (;;)
		syscall(SYS_exit_group, code);
}

/* The helper's life: wait for the daemon's word ('U': it was stopped,
 * its mount is still there; 'N': the kernel unmounted it) or its death
 * (EOF), then unmount. Told 'U', the mount is surely ours: the daemon
 * still holds /dev/fuse, so nothing is asked of the mount (a stat would
 * wait on the daemon) and a lazy unmount needs no answer. After a death
 * the mount point is checked first: ENOTCONN or our id is ours, another id
 * a mount made there since. System calls only. */
static void helper(int fd, const char *mnt, __u64 mnt_id)
{
	char word = 0;
	__u64 now;

	while (read(fd, &word, 1) < 0 && errno == EINTR)
		;
	if (word == 'N')
		helper_exit(0);
	if (word != 'U' && mount_id(mnt, &now) == 0 && now != mnt_id)
		helper_exit(0);
	if (geteuid() == 0) {
		helper_exit(umount2(mnt, MNT_DETACH) == 0 ? 0 : 1);
	} else {
		char *argv[] = { "fusermount3", "-u", "-z", (char *)mnt, NULL };
		execve("/usr/bin/fusermount3", argv, environ);
		execve("/bin/fusermount3", argv, environ);
	}
	helper_exit(1);
}

enum ckfs_code ckfs_sandbox_enter(const struct ckfs_sandbox_rules *p, struct ckfs_sandbox *sb,
				  struct ckfs_error *err)
{
	__u64 id;
	int pipefd[2];
	int applied;

	memset(sb, 0, sizeof(*sb));
	sb->helper_fd = -1;
	if (mount_id(p->mountpoint, &id) != 0)
		return ckfs_fail_errno(err, "sandbox: '%s': cannot read the mount's id",
				       p->mountpoint);
	if (pipe2(pipefd, O_CLOEXEC) != 0)
		return ckfs_fail_errno(err, "sandbox: cannot make a pipe");
	pid_t pid = fork();
	if (pid < 0) {
		close(pipefd[0]);
		close(pipefd[1]);
		return ckfs_fail_errno(err, "sandbox: cannot fork the unmount helper");
	}
	if (pid == 0) {
		/* nothing but the pipe: above all not /dev/fuse, whose last
		 * close ends the mount's connection, nor the caller's stdio
		 * (a shell's $(ckfs mount ...) waits for its end) */
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		for (int k = 0; k < 3 && null >= 0; k++) /* before fd 3 is taken: */
			dup2(null, k);                   /* null may be 3 */
		dup2(pipefd[0], 3);
		syscall(SYS_close_range, 4, ~0U, 0);
		helper(3, p->mountpoint, id);
	}
	close(pipefd[0]);
	sb->helper = pid;
	sb->helper_fd = pipefd[1];
	if (p->drop)
		CKFS_TRY(drop_to_user(p, err));
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return ckfs_fail_errno(err, "sandbox: cannot set no_new_privs");
	CKFS_TRY(landlock(p, err, &applied));
	sb->landlock_abi = applied;
	return ckfs_syscall_filter_apply(p->network, &sb->syscall_filter, err);
}

void ckfs_sandbox_leave(struct ckfs_sandbox *sb, bool unmount)
{
	char word = unmount ? 'U' : 'N';
	int status;

	if (sb->helper_fd < 0)
		return;
	if (write(sb->helper_fd, &word, 1) < 0) {
		/* the helper is gone: nothing more to ask of it */
	}
	close(sb->helper_fd);
	sb->helper_fd = -1;
	while (waitpid(sb->helper, &status, 0) < 0 && errno == EINTR)
		;
}
