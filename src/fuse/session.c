/* SPDX-License-Identifier: MIT */
/*
 * The life of a mount (src/fuse/fs.h): check the mount point, open what
 * SRC is (src/fuse/tree.h: one checkpoint built exactly as `ckfs export`
 * builds it, or a run listed), start the slice cache, create the FUSE
 * session, mount, report readiness, serve, unmount.
 *
 * Readiness. Without -f the process forks first, before any thread
 * exists, and the parent waits on a pipe. The child does all the work with
 * the caller's stderr still attached, so a checkpoint that cannot be
 * served, a bad option or a busy mount point is reported there as one
 * "ckfs: ..." line and the child exits non-zero, which the parent sees as
 * EOF on the pipe and returns as its own status. Once the kernel mount
 * exists the child detaches (setsid, stdio to /dev/null, log to syslog)
 * and writes one byte: only then does the parent exit 0. So `ckfs mount`,
 * mount(8) through mount.fuse3, and tests can use the mount the moment
 * the command returns, without sleeping. Under systemd (-f, Type=notify)
 * the same moment is announced with READY=1 on $NOTIFY_SOCKET, spoken
 * directly so libsystemd is not needed.
 *
 * Signals. SIGTERM, SIGINT and SIGHUP stop the loop through libfuse's
 * handlers; the mount is then unmounted and the process exits 0. libfuse
 * waits for them in the main thread and its workers block them; the
 * cache's read-ahead workers are started with them blocked too, so a
 * signal can never land on a thread that would not wake the loop.
 *
 * Teardown is libfuse's goto ladder (example/hello_ll.c): every step
 * undoes, in reverse order, what was acquired before it.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include "ckfs/layouts.h"
#include "ckfs/remote.h"
#include "ckfs/s3.h"
#include "ckfs/units.h"
#include "fuse/sandbox.h"
#include "fuse/tree.h"

/* ---- logging ---- */

/* Foreground: "ckfs: <line>" on stderr, one write per line. */
static void stderr_sink(enum ckfs_log_level level, const char *line)
{
	char buf[2100];
	int n;

	(void)level;
	n = snprintf(buf, sizeof(buf), "ckfs: %s\n", line);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(buf))
		n = sizeof(buf) - 1;
	ssize_t rc = write(STDERR_FILENO, buf, (size_t)n);
	(void)rc;
}

/* Daemon: syslog, whose priorities ckfs levels mirror. */
static void syslog_sink(enum ckfs_log_level level, const char *line)
{
	syslog((int)level, "%s", line);
}

/* While mounting, libfuse's error lines are kept here instead of printed,
 * so a failure is reported as one line naming the mount point. */
static char captured[1024];
static int capturing;

/* libfuse's messages join ckfs's log, so both share one sink and level. */
static void fuse_log_bridge(enum fuse_log_level level, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));
static void fuse_log_bridge(enum fuse_log_level level, const char *fmt, va_list ap)
{
	char line[1024];
	size_t n;
	int lv = (int)level < CKFS_LOG_ERR ? CKFS_LOG_ERR : (int)level;

	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == ' '))
		line[--n] = '\0';
	if (n == 0)
		return;
	if (capturing && lv <= CKFS_LOG_WARNING) {
		const char *msg = strncmp(line, "fuse: ", 6) == 0 ? line + 6 : line;
		snprintf(captured, sizeof(captured), "%s", msg);
		return;
	}
	ckfs_log((enum ckfs_log_level)lv, "%s", line);
}

static void capture_begin(void)
{
	captured[0] = '\0';
	capturing = 1;
}

static void capture_end(void)
{
	capturing = 0;
}

/* ---- systemd readiness, without libsystemd ---- */

/* Send state (e.g. "READY=1") to $NOTIFY_SOCKET when set: a datagram to a
 * unix socket, abstract when the name starts with '@'. */
static void sd_notify_send(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa;
	size_t n;
	int fd;

	if (!path || (path[0] != '/' && path[0] != '@'))
		return;
	n = strlen(path);
	if (n < 2 || n >= sizeof(sa.sun_path))
		return;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, n);
	if (path[0] == '@')
		sa.sun_path[0] = '\0';
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
		ckfs_log(CKFS_LOG_WARNING, "cannot notify '%s': %s", path, strerror(errno));
	close(fd);
}

/* ---- steps ---- */

static enum ckfs_code dead_mount(const char *mnt, struct ckfs_error *err)
{
	return ckfs_fail(err, CKFS_E_INVALID,
			 "'%s': a dead mount is in the way (transport endpoint is not "
			 "connected); run 'ckfs umount %s'", mnt, mnt);
}

static enum ckfs_code check_mountpoint(const char *mnt, const char *src,
				       struct ckfs_error *err)
{
	struct stat st;
	char type[128], real_src[PATH_MAX];

	if (strncmp(mnt, "/dev/fd/", 8) == 0)
		return CKFS_OK; /* mount.fuse3 -o drop_privileges: already open */
	if (stat(mnt, &st) != 0) {
		if (errno == ENOTCONN)
			return dead_mount(mnt, err);
		if (errno == ENOENT)
			return ckfs_fail(err, CKFS_E_NOTFOUND,
					 "'%s': mount point does not exist", mnt);
		return ckfs_fail_errno(err, "'%s': cannot use as mount point", mnt);
	}
	if (!S_ISDIR(st.st_mode))
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': mount point is not a directory",
				 mnt);
	/* Mounted over its own checkpoint, the daemon would look up its
	 * sources through itself: every source check fails. By identity: a
	 * bind mount shows the same folder under another name. */
	if (ckfs_path_within(src, &st) == 1)
		return ckfs_fail(err, CKFS_E_INVALID, "'%s': is the checkpoint '%s' or a "
				 "folder above it: mount elsewhere", mnt,
				 realpath(src, real_src) ? real_src : src);
	if (ckfs_mountinfo_lookup(mnt, type, sizeof(type), NULL, 0) == 1) {
		/* stat may have been answered from cached attributes; statfs
		 * always asks the daemon. */
		struct statvfs sv;
		if (statvfs(mnt, &sv) != 0 && errno == ENOTCONN)
			return dead_mount(mnt, err);
		return ckfs_fail(err, CKFS_E_EXISTS,
				 "'%s': already a mount point (%s); unmount it first", mnt,
				 type);
	}
	return CKFS_OK;
}

static struct fuse_session *new_session(const struct ckfs_mount_options *opt,
					const struct fuse_lowlevel_ops *ops, void *userdata,
					struct ckfs_error *err)
{
	char *argv[5];
	int argc = 0;
	struct fuse_session *se;

	argv[argc++] = "ckfs";
	argv[argc++] = "-o";
	argv[argc++] = opt->fuse_opts;
	if (opt->debug)
		argv[argc++] = "-d";
	argv[argc] = NULL;
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	capture_begin();
	se = fuse_session_new(&args, ops, sizeof(*ops), userdata);
	capture_end();
	fuse_opt_free_args(&args);
	if (!se)
		ckfs_fail(err, CKFS_E_INVALID, "cannot start a FUSE session: %s",
			  captured[0] ? captured : "bad mount options");
	return se;
}

/* Leave the caller's session and terminal, log to syslog, tell the
 * waiting parent the mount is ready. */
static void detach(int ready_fd)
{
	int nullfd;
	char ok = 0;

	if (setsid() < 0)
		ckfs_log(CKFS_LOG_WARNING, "setsid failed: %s", strerror(errno));
	openlog("ckfs", LOG_PID, LOG_DAEMON);
	ckfs_log_set_sink(syslog_sink);
	nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nullfd >= 0) {
		dup2(nullfd, STDIN_FILENO);
		dup2(nullfd, STDOUT_FILENO);
		dup2(nullfd, STDERR_FILENO);
		if (nullfd > STDERR_FILENO)
			close(nullfd);
	}
	while (write(ready_fd, &ok, 1) < 0 && errno == EINTR)
		;
	close(ready_fd);
}

/* Block the stop signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT) in this
 * thread, the old mask into *old: threads started meanwhile (read-ahead
 * workers, a run's watcher) inherit the mask, and the signals must reach
 * the main thread, where libfuse waits for them. */
static void block_stop_signals(sigset_t *old)
{
	sigset_t stop;

	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGHUP);
	sigaddset(&stop, SIGQUIT);
	pthread_sigmask(SIG_BLOCK, &stop, old);
}

/* Serving: leave the caller's session (ready_fd >= 0: tell the waiting
 * parent), tell systemd, log it. */
static void announce(const struct ckfs_mount_options *opt, struct ckfs_fs *fs, int ready_fd)
{
	char status_line[PATH_MAX * 2 + 64], size_text[32];

	if (chdir("/") != 0)
		ckfs_log(CKFS_LOG_WARNING, "cannot chdir to '/': %s", strerror(errno));
	if (ready_fd >= 0)
		detach(ready_fd);
	ckfs_format_bytes((double)opt->cache_size, size_text, sizeof(size_text));
	snprintf(status_line, sizeof(status_line),
		 "READY=1\nSTATUS=Serving %s at %s\nMAINPID=%ld", opt->src,
		 opt->mountpoint, (long)getpid());
	sd_notify_send(status_line);
	fs->ops->log_serving(fs, size_text);
}

/* The request loop, until unmounted or stopped by a signal: 0, or 1 when
 * it failed. */
static int serve_requests(const struct ckfs_mount_options *opt, struct fuse_session *se)
{
	struct fuse_loop_config *lc = fuse_loop_cfg_create();

	if (!lc) {
		ckfs_log(CKFS_LOG_ERR, "out of memory");
		return 1;
	}
	fuse_loop_cfg_set_clone_fd(lc, 0);
	fuse_loop_cfg_set_max_threads(lc, (unsigned)opt->threads);
	/* Keep idle workers: creating threads per burst costs more. */
	fuse_loop_cfg_set_idle_threads(lc, (unsigned)opt->threads);
	int loop_rc = fuse_session_loop_mt(se, lc);
	fuse_loop_cfg_destroy(lc);
	sd_notify_send("STOPPING=1");
	if (loop_rc < 0) {
		ckfs_log(CKFS_LOG_ERR, "'%s': FUSE loop failed: %s", opt->mountpoint,
			 strerror(-loop_rc));
		return 1;
	}
	ckfs_log(CKFS_LOG_NOTICE, "'%s': unmounting", opt->mountpoint);
	return 0;
}

/* ---- stop signals, noted ----
 *
 * The loop ends on a stop signal (libfuse's handler) or when the kernel
 * unmounted the file system; only the first leaves a mount for the
 * sandbox's helper to remove. libfuse's handlers are wrapped to tell. */

static const int stop_signals[] = { SIGTERM, SIGINT, SIGHUP };
#define N_STOP (sizeof(stop_signals) / sizeof(stop_signals[0]))
static struct sigaction libfuse_action[N_STOP];
static volatile sig_atomic_t stopped_by_signal;

static void note_stop(int sig, siginfo_t *si, void *ctx)
{
	stopped_by_signal = 1;
	for (size_t i = 0; i < N_STOP; i++) {
		const struct sigaction *a = &libfuse_action[i];
		if (stop_signals[i] != sig)
			continue;
		if (a->sa_flags & SA_SIGINFO)
			a->sa_sigaction(sig, si, ctx);
		else if (a->sa_handler != SIG_IGN && a->sa_handler != SIG_DFL)
			a->sa_handler(sig);
	}
}

/* install: wrap libfuse's handlers; else put them back (before libfuse
 * removes them: it only removes its own). */
static void wrap_stop_handlers(bool install)
{
	for (size_t i = 0; i < N_STOP; i++) {
		if (!install) {
			sigaction(stop_signals[i], &libfuse_action[i], NULL);
			continue;
		}
		struct sigaction wrap = { .sa_sigaction = note_stop, .sa_flags = SA_SIGINFO };
		sigemptyset(&wrap.sa_mask);
		sigaction(stop_signals[i], &wrap, &libfuse_action[i]);
	}
}

/* The daemon's sandbox (src/fuse/sandbox.h), entered with no thread but
 * this one running: what it reads and writes from now on. */
static enum ckfs_code enter_sandbox(const struct ckfs_mount_options *opt, struct ckfs_sandbox *sb,
				    struct ckfs_error *err)
{
	static char plans[PATH_MAX];
	struct ckfs_sandbox_rules p = {
		.mountpoint = opt->mountpoint,
		.drop = opt->has_uid && opt->uid != 0 && geteuid() == 0,
		.uid = opt->uid,
		.gid = opt->gid,
		.has_gid = opt->has_gid,
	};
	const char *srcs[] = { opt->src, opt->model.config_path, opt->model.base_path };

	for (size_t i = 0; i < sizeof(srcs) / sizeof(srcs[0]); i++) {
		if (srcs[i] && ckfs_s3_is_url(srcs[i]))
			p.network = true;
		else if (srcs[i])
			p.read[p.n_read++] = srcs[i];
	}
	p.read[p.n_read++] = "/dev/null"; /* detach's stdio */
	p.read[p.n_read++] = getenv("CKFS_PRELOAD_GATE"); /* tests only (preload.c) */
	p.write[p.n_write++] = "/dev/null";
	if (p.drop) /* root's plan cache is not the user's to write */
		setenv("CKFS_PLAN_CACHE", "off", 1);
	if (ckfs_plan_cache_dir(plans, sizeof(plans)))
		p.write[p.n_write++] = plans;
	if (ckfs_remote_cache_dir())
		p.write[p.n_write++] = ckfs_remote_cache_dir();
	CKFS_TRY(ckfs_sandbox_enter(&p, sb, err));
	ckfs_log(CKFS_LOG_INFO, "sandbox: %s, no_new_privs, %s, %s",
		 p.drop ? "the uid= user" : "this user", sb->landlock_abi
		 ? "Landlock read-only beneath the sources" : "no Landlock in this kernel",
		 sb->syscall_filter ? "a system-call allow-list"
		 : "no system-call list for this architecture");
	return CKFS_OK;
}

/* Build, mount and serve; returns the exit status. ready_fd >= 0: the
 * pipe to the waiting parent (daemon mode). */
static int serve(const struct ckfs_mount_options *opt, int ready_fd)
{
	struct ckfs_error err;
	struct ckfs_fs *fs = NULL;
	struct fuse_session *se;
	struct ckfs_sandbox sb = { .helper_fd = -1 };
	bool wrapped = false;
	sigset_t old_mask;
	enum ckfs_code rc;
	int ret = 1;

	ckfs_error_clear(&err);
	fuse_set_log_func(fuse_log_bridge);
	/* What SRC is (src/fuse/tree.h): one checkpoint, built now, or a run
	 * or one step of it, listed now. */
	if (check_mountpoint(opt->mountpoint, opt->src, &err) != CKFS_OK ||
	    ckfs_fs_open(opt, &fs, &err) != CKFS_OK)
		goto err_out0;
	se = new_session(opt, &ckfs_ll_ops, fs, &err);
	if (!se)
		goto err_out1;
	if (ready_fd >= 0) {
		/* A daemon stops on these whatever the shell that started it
		 * ignored (a script's "ckfs mount ... &" ignores SIGINT). In the
		 * foreground an inherited SIG_IGN is kept, as libfuse does, so
		 * nohup keeps meaning no SIGHUP. */
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
	}
	if (fuse_set_signal_handlers(se) != 0) {
		ckfs_fail(&err, CKFS_E_IO, "cannot install signal handlers");
		goto err_out2;
	}
	capture_begin();
	if (fuse_session_mount(se, opt->mountpoint) != 0) {
		capture_end();
		ckfs_fail(&err, CKFS_E_IO, "'%s': mount failed%s%s", opt->mountpoint,
			  captured[0] ? ": " : "", captured);
		goto err_out3;
	}
	capture_end();

	/* Mounted: requests queue in the kernel until the loop runs. The
	 * sandbox comes first, while this is the only thread (Landlock binds
	 * the threads started after it); then the cache's workers, the
	 * preload and a run's watcher, with the stop signals blocked (they
	 * must reach this thread, where libfuse waits for them). */
	ckfs_fs_plan_kernel_readahead(fs, opt->mountpoint);
	if (!opt->nosandbox) {
		wrap_stop_handlers(wrapped = true);
		if (enter_sandbox(opt, &sb, &err) != CKFS_OK)
			goto err_out4;
	}
	block_stop_signals(&old_mask);
	rc = ckfs_fs_start_cache(fs, &err);
	if (rc == CKFS_OK)
		rc = ckfs_fs_start(fs, se, &err);
	pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
	if (rc != CKFS_OK)
		goto err_out4;
	announce(opt, fs, ready_fd);
	ready_fd = -1;
	ret = serve_requests(opt, se);
err_out4:
	ckfs_fs_stop(fs); /* a run's watcher talks to the session */
	/* sandboxed (it may not unmount): the helper does, unless the kernel
	 * did (the loop ended without a stop signal); then libfuse only
	 * closes and frees */
	ckfs_sandbox_leave(&sb, stopped_by_signal || ret != 0);
	fuse_session_unmount(se);
err_out3:
	if (wrapped)
		wrap_stop_handlers(false);
	fuse_remove_signal_handlers(se);
err_out2:
	fuse_session_destroy(se);
err_out1:
	ckfs_fs_free(fs);
err_out0:
	if (err.code != CKFS_OK)
		ckfs_log(CKFS_LOG_ERR, "%s", err.msg[0] ? err.msg : ckfs_strerror(err.code));
	if (ready_fd >= 0)
		close(ready_fd); /* EOF: the parent reports our exit status */
	fuse_set_log_func(NULL);
	return ret;
}

/* Parent side of the daemon fork: 0 once the child says the mount is
 * ready, else the child's failure status. */
static int wait_ready(int fd, pid_t pid)
{
	char c;
	ssize_t r;
	int st;

	do
		r = read(fd, &c, 1);
	while (r < 0 && errno == EINTR);
	close(fd);
	if (r == 1)
		return 0;
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR)
			return 1;
	}
	if (WIFEXITED(st))
		return WEXITSTATUS(st) ? WEXITSTATUS(st) : 1;
	if (WIFSIGNALED(st))
		fprintf(stderr, "ckfs: the mount daemon was killed by signal %d (%s)\n",
			WTERMSIG(st), strsignal(WTERMSIG(st)));
	return 1;
}

int ckfs_fuse_opts_add(char **list, const char *opt, bool escape)
{
	return escape ? fuse_opt_add_opt_escaped(list, opt) : fuse_opt_add_opt(list, opt);
}

int ckfs_fuse_run(const struct ckfs_mount_options *opt)
{
	int fds[2];
	pid_t pid;

	ckfs_log_set_level(opt->log_level);
	ckfs_log_set_sink(stderr_sink);
	if (opt->foreground)
		return serve(opt, -1);
	if (pipe2(fds, O_CLOEXEC) != 0) {
		ckfs_log(CKFS_LOG_ERR, "cannot create a pipe: %s", strerror(errno));
		return 1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		ckfs_log(CKFS_LOG_ERR, "cannot fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return 1;
	}
	if (pid == 0) {
		close(fds[0]);
		return serve(opt, fds[1]);
	}
	close(fds[1]);
	return wait_ready(fds[0], pid);
}
