/* SPDX-License-Identifier: MIT */
/*
 * ckfs_bench_ceiling: the FUSE transport ceiling for tests/bench/bench.sh
 * (benchmark tool, not part of ckfs). A minimal libfuse3 low-level file
 * system serving a flat folder's files read-only, their bytes straight from
 * memory, loaded once at start (the benchmark gives it ckfs's exported
 * folder: the same bytes ckfs serves). Reading them the way the benchmark
 * reads ckfs's mount (cat, safe_open, from_pretrained) measures what the
 * kernel, /dev/fuse and libfuse cost on this machine with no work behind
 * them: ckfs's first read can approach that figure, not exceed it.
 *
 * To measure the same transport, everything FUSE sees is ckfs's choice
 * (src/cli/mount.c, src/fuse/session.c, src/fuse/ll_ops.c), kept in step by
 * hand: mount options "ro,default_permissions,max_read=1048576" plus
 * subtype and fsname; init asks for async reads, no writeback cache, no
 * auto data invalidation, max_read = max_write = 1 MiB, max_background 64,
 * congestion_threshold 48; the multi-threaded loop without clone_fd, 16
 * workers kept idle; day-long entry and attribute timeouts; st_blksize
 * 1 MiB; keep_cache and noflush on open; and reads answered with
 * fuse_reply_iov, one iovec per 4 MiB slice a request covers (ckfs replies
 * from its slice cache that way). Only the daemon's work differs: here a
 * read is a pointer into the buffer.
 *
 * Every file is read into anonymous memory before mounting (MAP_POPULATE,
 * then read), so no page fault is left for the reads; the folder must fit
 * in RAM.
 *
 *   ckfs_bench_ceiling [-f] [--threads N] [--pid-file P] DIR MNT
 *
 * Without -f it returns once the mount is ready, like ckfs mount, and
 * serves in the background until unmounted (umount MNT, fusermount3 -u
 * MNT or ckfs umount MNT) or sent SIGTERM.
 */
#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* The values ckfs uses (see the comment above). */
#define TIMEOUT 86400.0
#define BLKSIZE (1u << 20)
#define MAX_REQUEST (1u << 20)
#define SLICE ((uint64_t)4 << 20)
#define MAX_FILES 64

/* File i has inode i + 2 (the root is 1), as in ckfs. */
struct file {
	char name[256];
	const char *buf;    /* all its bytes */
	uint64_t size;
};

static struct file files[MAX_FILES];
static size_t n_files;

static const struct file *file_of(fuse_ino_t ino)
{
	return ino >= 2 && ino - 2 < n_files ? &files[ino - 2] : NULL;
}

static void fill_stat(fuse_ino_t ino, struct stat *st)
{
	const struct file *f = file_of(ino);

	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_blksize = BLKSIZE;
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
		st->st_size = 4096;
		return;
	}
	st->st_mode = S_IFREG | 0444;
	st->st_nlink = 1;
	st->st_size = (off_t)f->size;
	st->st_blocks = (blkcnt_t)((f->size + 511) / 512);
}

static void ceil_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
	conn->max_read = MAX_REQUEST;
	conn->max_write = MAX_REQUEST;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->time_gran = 1;
}

static void ceil_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;

	memset(&e, 0, sizeof(e));
	e.entry_timeout = TIMEOUT;
	for (size_t i = 0; parent == FUSE_ROOT_ID && i < n_files; i++) {
		if (strcmp(name, files[i].name) != 0)
			continue;
		e.ino = i + 2;
		e.generation = 1;
		e.attr_timeout = TIMEOUT;
		fill_stat(e.ino, &e.attr);
	}
	fuse_reply_entry(req, &e); /* ino 0: a cached negative entry */
}

static void ceil_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	(void)ino;
	(void)nlookup;
	fuse_reply_none(req);
}

static void ceil_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;

	(void)fi;
	if (ino != FUSE_ROOT_ID && !file_of(ino)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_stat(ino, &st);
	fuse_reply_attr(req, &st, TIMEOUT);
}

static void ceil_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (!file_of(ino)) {
		fuse_reply_err(req, ino == FUSE_ROOT_ID ? EISDIR : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	fi->keep_cache = 1;
	fi->noflush = 1;
	fuse_reply_open(req, fi);
}

static void ceil_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

/* One iovec per slice the request covers, as ckfs's read_weights does. */
static void ceil_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	enum { MAX_IOV = MAX_REQUEST / 4096 + 2 };
	struct iovec iov[MAX_IOV];
	const struct file *f = file_of(ino);
	uint64_t pos, end;
	int n = 0;

	(void)fi;
	if (off < 0 || !f) {
		fuse_reply_err(req, off < 0 ? EINVAL : ENOENT);
		return;
	}
	if ((uint64_t)off >= f->size || size == 0) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	pos = (uint64_t)off;
	end = f->size - pos < size ? f->size : pos + size;
	while (pos < end && n < MAX_IOV) {
		uint64_t slice_end = (pos / SLICE + 1) * SLICE;
		uint64_t stop = slice_end < end ? slice_end : end;
		iov[n].iov_base = (void *)(f->buf + pos);
		iov[n].iov_len = (size_t)(stop - pos);
		n++;
		pos = stop;
	}
	fuse_reply_iov(req, iov, n);
}

static void ceil_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

static void ceil_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			 struct fuse_file_info *fi)
{
	char buf[4096];
	size_t pos = 0;
	off_t count = (off_t)n_files + 2;

	(void)ino;
	(void)fi;
	if (size > sizeof(buf))
		size = sizeof(buf);
	for (off_t k = off < 0 ? count : off; k < count; k++) {
		struct stat st;
		fill_stat(k >= 2 ? (fuse_ino_t)k : FUSE_ROOT_ID, &st);
		const char *name = k == 0 ? "." : k == 1 ? ".." : files[k - 2].name;
		size_t want = fuse_add_direntry(req, buf + pos, size - pos, name, &st,
						k + 1);
		if (want > size - pos)
			break;
		pos += want;
	}
	fuse_reply_buf(req, buf, pos);
}

static const struct fuse_lowlevel_ops ceil_ops = {
	.init = ceil_init,
	.lookup = ceil_lookup,
	.forget = ceil_forget,
	.getattr = ceil_getattr,
	.open = ceil_open,
	.read = ceil_read,
	.release = ceil_release,
	.opendir = ceil_opendir,
	.readdir = ceil_readdir,
};

static uint64_t parse_u64(const char *text, const char *what)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(text, &end, 10);
	if (errno || end == text || *end || v == 0) {
		fprintf(stderr, "ckfs_bench_ceiling: bad %s '%s'\n", what, text);
		exit(2);
	}
	return (uint64_t)v;
}

/* The regular files of dir, each read whole into populated anonymous
 * memory so reads never fault. */
static int load_folder(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	if (!d) {
		fprintf(stderr, "ckfs_bench_ceiling: '%s': %s\n", dir, strerror(errno));
		return -1;
	}
	while ((de = readdir(d))) {
		struct file *f = &files[n_files];
		struct stat st;
		int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC);
		char *p = NULL;
		uint64_t done = 0;

		if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		if (n_files == MAX_FILES || strlen(de->d_name) >= sizeof(f->name)) {
			fprintf(stderr, "ckfs_bench_ceiling: '%s': too many files or too long a "
				"name\n", dir);
			close(fd);
			closedir(d);
			return -1;
		}
		if (st.st_size > 0) {
			p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
			if (p == MAP_FAILED)
				p = NULL;
			while (p && done < (uint64_t)st.st_size) {
				ssize_t r = pread(fd, p + done, (size_t)st.st_size - done,
						  (off_t)done);
				if (r <= 0)
					break;
				done += (uint64_t)r;
			}
			if (!p || done != (uint64_t)st.st_size) {
				fprintf(stderr, "ckfs_bench_ceiling: cannot load '%s/%s'\n", dir,
					de->d_name);
				close(fd);
				closedir(d);
				return -1;
			}
		}
		close(fd);
		snprintf(f->name, sizeof(f->name), "%s", de->d_name);
		f->buf = p;
		f->size = (uint64_t)st.st_size;
		n_files++;
	}
	closedir(d);
	return 0;
}

static void usage(FILE *to)
{
	fputs("usage: ckfs_bench_ceiling [-f] [--threads N] [--pid-file PATH] DIR MNT\n"
	      "Serve the files of DIR read-only from memory, with ckfs's FUSE\n"
	      "settings: the transport ceiling for tests/bench/bench.sh.\n",
	      to);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "threads", required_argument, NULL, 't' },
		{ "pid-file", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t threads = 16;
	const char *pid_file = NULL;
	int foreground = 0, c, ready[2] = { -1, -1 }, ret = 1;

	while ((c = getopt_long(argc, argv, "fh", opts, NULL)) != -1) {
		switch (c) {
		case 'f': foreground = 1; break;
		case 't': threads = parse_u64(optarg, "thread count"); break;
		case 'p': pid_file = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (argc - optind != 2 || threads > 256) {
		usage(stderr);
		return 2;
	}
	const char *mnt = argv[optind + 1];
	if (load_folder(argv[optind]) != 0)
		return 1;

	/* Daemon: the parent returns once the mount exists, as ckfs mount. */
	if (!foreground) {
		if (pipe(ready) != 0) {
			perror("ckfs_bench_ceiling: pipe");
			return 1;
		}
		pid_t pid = fork();
		if (pid < 0) {
			perror("ckfs_bench_ceiling: fork");
			return 1;
		}
		if (pid > 0) {
			char b;
			close(ready[1]);
			return read(ready[0], &b, 1) == 1 ? 0 : 1;
		}
		close(ready[0]);
	}

	char *fargv[] = { "ckfs_bench_ceiling", "-o",
			  "ro,default_permissions,max_read=1048576,"
			  "subtype=ckfs-ceiling,fsname=ckfs-ceiling",
			  NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
	struct fuse_session *se = fuse_session_new(&args, &ceil_ops, sizeof(ceil_ops), NULL);
	if (!se)
		goto out0;
	if (fuse_set_signal_handlers(se) != 0)
		goto out1;
	if (fuse_session_mount(se, mnt) != 0)
		goto out2;
	if (pid_file) {
		FILE *f = fopen(pid_file, "w");
		if (f) {
			fprintf(f, "%ld\n", (long)getpid());
			fclose(f);
		}
	}
	if (!foreground) {
		int nullfd = open("/dev/null", O_RDWR);
		if (setsid() < 0 || chdir("/") != 0)
			perror("ckfs_bench_ceiling: detach");
		if (nullfd >= 0) {
			dup2(nullfd, STDIN_FILENO);
			dup2(nullfd, STDOUT_FILENO);
			dup2(nullfd, STDERR_FILENO);
			close(nullfd);
		}
		if (write(ready[1], "", 1) != 1)
			goto out3;
		close(ready[1]);
	}
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	if (!lc)
		goto out3;
	fuse_loop_cfg_set_clone_fd(lc, 0);
	fuse_loop_cfg_set_max_threads(lc, (unsigned)threads);
	fuse_loop_cfg_set_idle_threads(lc, (unsigned)threads);
	ret = fuse_session_loop_mt(se, lc) < 0;
	fuse_loop_cfg_destroy(lc);
out3:
	fuse_session_unmount(se);
out2:
	fuse_remove_signal_handlers(se);
out1:
	fuse_session_destroy(se);
out0:
	fuse_opt_free_args(&args);
	return ret;
}
