/* SPDX-License-Identifier: MIT */
/*
 * ckfs mount | umount | stats: the command-line side of the FUSE front end
 * (src/fuse). Options come as long options or as -o keys, so the same
 * settings work from a shell, from /etc/fstab (mount.fuse3 runs
 * "ckfs SRC MNT -o OPTS") and from systemd units. -o keys that are not
 * ckfs's are libfuse mount options; options only meaningful to mount(8)
 * (noauto, nofail, x-systemd.*, ...) are ignored. The mount is always
 * read-only, so "rw" is ignored too.
 */
#define FUSE_USE_VERSION 312

#include <cjson/cJSON.h>
#include <errno.h>
#include <fuse_opt.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "ckfs/log.h"
#include "ckfs/units.h"

#include "cli/cli.h"
#include "fuse/fs.h"

#define DEFAULT_CACHE_SIZE (1ull << 30)     /* 1 GiB */
#define DEFAULT_SLICE_SIZE ((size_t)4 << 20) /* 4 MiB */
#define DEFAULT_THREADS 16
#define DEFAULT_READAHEAD 16                 /* slices: 64 MiB ahead */
#define DEFAULT_KERNEL_READAHEAD_KB 1024     /* = max_read: whole requests */

static void mount_usage(FILE *to)
{
	fputs("usage: ckfs mount [options] SRC MNT\n"
	      "Serve the merged Hugging Face folder of checkpoint SRC at MNT (read-only).\n"
	      "\n"
	      "  -f, --foreground          stay in the foreground, log to stderr\n"
	      "  -d, --debug               trace FUSE requests (implies -f)\n"
	      "  -o OPT[,OPT...]           mount options: the keys below, and libfuse's\n"
	      "                            (allow_other, allow_root, default_permissions,\n"
	      "                            fsname=, subtype=, auto_unmount, noatime, ...)\n"
	      "      --dtype T             bf16 (default), fp16, fp32 or auto      -o dtype=\n"
	      "      --max-shard-size N    split weights into shards of N (e.g. 5GB)\n"
	      "                                                           -o max_shard_size=\n"
	      "      --cache-size N        slice cache budget (default 1GiB)  -o cache_size=\n"
	      "      --threads N           FUSE worker threads (default 16); read-ahead\n"
	      "                            workers: min(N, max(4, CPUs))     -o threads=\n"
	      "      --readahead N         read-ahead window, in slices (default 16, 0 off)\n"
	      "                                                                -o readahead=\n"
	      "      --config PATH         config.json (or a folder holding one) -o config=\n"
	      "      --follow-symlinks     serve files whose symlinks lead outside SRC\n"
	      "                                                          -o follow_symlinks\n"
	      "      --raw-names           serve Megatron keys without a Hugging Face\n"
	      "                            name under their own names      -o raw_names\n"
	      "      --log-level L         err|warning|notice|info|debug      -o log_level=\n"
	      "  -o prefetch_threads=N, slice_size=N (power of two, default 4MiB),\n"
	      "     kernel_readahead=N (the mount's read_ahead_kb when run as root,\n"
	      "     default 1MiB; 0 keeps the kernel's 128KiB),\n"
	      "     uid=N, gid=N (owner shown for all files; default: the mounting user),\n"
	      "     umask=M (modes 0444/0555 less octal M whatever the sources allow,\n"
	      "     e.g. umask=0222 to publish; default: each file shows no more than\n"
	      "     its sources allow)\n"
	      "\n"
	      "Returns once the mount is ready (status 0) or has failed (status 1).\n"
	      "See also: ckfs umount MNT, ckfs stats MNT.\n",
	      to);
}

struct mount_parse {
	struct ckfs_mount_options *mo;
	char *fuse_opts;       /* user libfuse options, comma list */
	bool has_fsname, has_subtype, has_prefetch;
	const char *config;
};

static int parse_count(const char *text, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* An octal umask of at most 0777, as sshfs and ntfs-3g take it. */
static int parse_umask(const char *text, mode_t *out)
{
	char *end;
	unsigned long v;

	if (*text < '0' || *text > '7')
		return -1;
	errno = 0;
	v = strtoul(text, &end, 8);
	if (errno || *end || v > 0777)
		return -1;
	*out = (mode_t)v;
	return 0;
}

static int is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

/* One key[=value]: a ckfs setting, an option to ignore, or a libfuse mount
 * option. 0 on success, else the usage-error status. */
static int apply_key(struct mount_parse *p, const char *key, const char *val,
		     const char *whole)
{
	static const char *const ignored[] = {
		"rw", "ro", "defaults", "auto", "noauto", "user", "users", "nouser",
		"owner", "nofail", "_netdev", "sw", "group",
	};
	static const char *const fuse_flags[] = {
		"allow_other", "allow_root", "auto_unmount", "default_permissions",
		"dev", "nodev", "suid", "nosuid", "exec", "noexec", "async", "sync",
		"dirsync", "atime", "noatime", "diratime", "nodiratime", "relatime",
		"norelatime", "strictatime", "nostrictatime",
	};
	static const char *const fuse_keys[] = {
		"fsname", "subtype", "context", "fscontext", "defcontext", "rootcontext",
		"user",
	};
	struct ckfs_mount_options *mo = p->mo;
	long n;

#define NEED_VALUE()                                                             \
	do {                                                                     \
		if (!val || !*val)                                               \
			return ckfs_cli_usage_error("mount", "option '%s' needs a value", \
						    key);                        \
	} while (0)

	if (strcmp(key, "dtype") == 0) {
		NEED_VALUE();
		if (ckfs_cli_parse_dtype(val, &mo->model.out_dtype) != 0)
			return ckfs_cli_usage_error("mount", "unknown dtype '%s'", val);
	} else if (strcmp(key, "max_shard_size") == 0) {
		NEED_VALUE();
		if (!(mo->folder.max_shard_size = ckfs_parse_size(val)))
			return ckfs_cli_usage_error("mount", "bad size '%s'", val);
	} else if (strcmp(key, "cache_size") == 0) {
		NEED_VALUE();
		if (!(mo->cache_size = ckfs_parse_size(val)))
			return ckfs_cli_usage_error("mount", "bad size '%s'", val);
	} else if (strcmp(key, "slice_size") == 0) {
		NEED_VALUE();
		uint64_t v = ckfs_parse_size(val);
		if (!is_pow2(v) || v < 4096 || v > (64u << 20))
			return ckfs_cli_usage_error("mount", "slice size '%s' must be a power "
						    "of two from 4KiB to 64MiB", val);
		mo->slice_size = (size_t)v;
	} else if (strcmp(key, "threads") == 0) {
		NEED_VALUE();
		if (parse_count(val, 1, 256, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad thread count '%s'", val);
		mo->threads = (int)n;
	} else if (strcmp(key, "prefetch_threads") == 0) {
		NEED_VALUE();
		if (parse_count(val, 0, 256, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad thread count '%s'", val);
		mo->prefetch_threads = (int)n;
		p->has_prefetch = true;
	} else if (strcmp(key, "kernel_readahead") == 0) {
		NEED_VALUE();
		uint64_t v = strcmp(val, "0") == 0 ? 0 : ckfs_parse_size(val);
		if ((v == 0 && strcmp(val, "0") != 0) || v % 1024 || v > (1u << 30))
			return ckfs_cli_usage_error("mount", "kernel readahead '%s' must be "
						    "whole KiB up to 1GiB, or 0", val);
		mo->kernel_readahead_kb = (unsigned)(v / 1024);
	} else if (strcmp(key, "readahead") == 0) {
		NEED_VALUE();
		if (parse_count(val, 0, 4096, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad read-ahead window '%s'", val);
		mo->readahead = (int)n;
	} else if (strcmp(key, "log_level") == 0) {
		NEED_VALUE();
		int lv = ckfs_log_parse_level(val);
		if (lv < 0)
			return ckfs_cli_usage_error("mount", "bad log level '%s'", val);
		mo->log_level = (enum ckfs_log_level)lv;
	} else if (strcmp(key, "config") == 0) {
		NEED_VALUE();
		p->config = val;
	} else if (strcmp(key, "uid") == 0 || strcmp(key, "gid") == 0) {
		NEED_VALUE();
		if (parse_count(val, 0, INT32_MAX, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad %s '%s'", key, val);
		if (key[0] == 'u') {
			mo->uid = (uid_t)n;
			mo->has_uid = true;
		} else {
			mo->gid = (gid_t)n;
			mo->has_gid = true;
		}
	} else if (strcmp(key, "umask") == 0) {
		NEED_VALUE();
		if (parse_umask(val, &mo->umask) != 0)
			return ckfs_cli_usage_error("mount", "bad umask '%s' (octal, 0 to 0777)",
						    val);
		mo->has_umask = true;
	} else if (strcmp(key, "follow_symlinks") == 0 && !val) {
		mo->model.follow_symlinks = true;
	} else if (strcmp(key, "raw_names") == 0 && !val) {
		mo->model.raw_names = true;
	} else if (strcmp(key, "debug") == 0 && !val) {
		mo->debug = true;
		mo->foreground = true;
	} else {
		for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
			if (!val && strcmp(key, ignored[i]) == 0)
				return 0;
		if (strncmp(key, "x-", 2) == 0 || strcmp(key, "comment") == 0)
			return 0; /* for mount(8) and systemd only */
		int known = 0;
		for (size_t i = 0; !known && i < sizeof(fuse_flags) / sizeof(fuse_flags[0]); i++)
			known = !val && strcmp(key, fuse_flags[i]) == 0;
		for (size_t i = 0; !known && i < sizeof(fuse_keys) / sizeof(fuse_keys[0]); i++)
			known = val && strcmp(key, fuse_keys[i]) == 0;
		if (!known)
			return ckfs_cli_usage_error("mount", "unknown mount option '%s'", whole);
		if (strcmp(key, "fsname") == 0)
			p->has_fsname = true;
		if (strcmp(key, "subtype") == 0)
			p->has_subtype = true;
		if (strcmp(key, "allow_other") == 0)
			mo->allow_other = true;
		if (fuse_opt_add_opt(&p->fuse_opts, whole) != 0)
			return ckfs_cli_usage_error("mount", "out of memory");
	}
	return 0;
#undef NEED_VALUE
}

/* A comma list as given to -o. */
static int apply_option_list(struct mount_parse *p, const char *list)
{
	char *copy = strdup(list), *save = NULL;
	int rc = 0;

	if (!copy)
		return ckfs_cli_usage_error("mount", "out of memory");
	for (char *opt = strtok_r(copy, ",", &save); opt && rc == 0;
	     opt = strtok_r(NULL, ",", &save)) {
		char whole[PATH_MAX + 64];
		snprintf(whole, sizeof(whole), "%s", opt);
		char *eq = strchr(opt, '=');
		if (eq)
			*eq = '\0';
		rc = apply_key(p, opt, eq ? eq + 1 : NULL, whole);
	}
	free(copy);
	return rc;
}

int ckfs_cmd_mount(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "foreground", no_argument, NULL, 'f' },
		{ "debug", no_argument, NULL, 'd' },
		{ "options", required_argument, NULL, 'o' },
		{ "dtype", required_argument, NULL, 'D' },
		{ "max-shard-size", required_argument, NULL, 'S' },
		{ "cache-size", required_argument, NULL, 'C' },
		{ "threads", required_argument, NULL, 'T' },
		{ "readahead", required_argument, NULL, 'R' },
		{ "config", required_argument, NULL, 'c' },
		{ "log-level", required_argument, NULL, 'L' },
		{ "follow-symlinks", no_argument, NULL, 'F' },
		{ "raw-names", no_argument, NULL, 'N' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct ckfs_mount_options mo = {
		.model = { .out_dtype = CKFS_DTYPE_BF16 },
		.cache_size = DEFAULT_CACHE_SIZE,
		.slice_size = DEFAULT_SLICE_SIZE,
		.threads = DEFAULT_THREADS,
		.readahead = DEFAULT_READAHEAD,
		.kernel_readahead_kb = DEFAULT_KERNEL_READAHEAD_KB,
		.log_level = CKFS_LOG_NOTICE,
	};
	struct mount_parse p = { .mo = &mo };
	static const char *const long_keys[] = {
		['D'] = "dtype", ['S'] = "max_shard_size", ['C'] = "cache_size",
		['T'] = "threads", ['R'] = "readahead", ['c'] = "config",
		['L'] = "log_level",
	};
	char src[PATH_MAX], mnt[PATH_MAX], config[PATH_MAX];
	int c, rc = 2;

	optind = 1;
	while ((c = getopt_long(argc, argv, "fdo:h", opts, NULL)) != -1) {
		switch (c) {
		case 'f':
			mo.foreground = true;
			break;
		case 'd':
			mo.debug = mo.foreground = true;
			break;
		case 'F':
			mo.model.follow_symlinks = true;
			break;
		case 'N':
			mo.model.raw_names = true;
			break;
		case 'o':
			if ((rc = apply_option_list(&p, optarg)) != 0)
				goto out;
			break;
		case 'D': case 'S': case 'C': case 'T': case 'R': case 'c': case 'L': {
			char whole[PATH_MAX + 64];
			snprintf(whole, sizeof(whole), "%s=%s", long_keys[c], optarg);
			if ((rc = apply_key(&p, long_keys[c], optarg, whole)) != 0)
				goto out;
			break;
		}
		case 'h':
			mount_usage(stdout);
			rc = 0;
			goto out;
		default:
			mount_usage(stderr);
			rc = 2;
			goto out;
		}
	}
	if (argc - optind != 2) {
		rc = ckfs_cli_usage_error("mount", "expected SRC and MNT");
		goto out;
	}
	if (mo.cache_size < 2 * (uint64_t)mo.slice_size) {
		rc = ckfs_cli_usage_error("mount", "cache size must be at least two slices "
					  "(%zu bytes)", 2 * mo.slice_size);
		goto out;
	}
	if (!p.has_prefetch) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		int cap = cpus > 4 ? (int)cpus : 4;
		mo.prefetch_threads = mo.threads < cap ? mo.threads : cap;
	}
	if (mo.debug)
		mo.log_level = CKFS_LOG_DEBUG;

	/* Absolute paths: the daemon works from "/", and the core re-checks
	 * sources by path. */
	const char *src_arg = argv[optind], *mnt_arg = argv[optind + 1];
	mo.src = realpath(src_arg, src) ? src : src_arg;
	if (strncmp(mnt_arg, "/dev/fd/", 8) == 0) {
		mo.mountpoint = mnt_arg;
	} else if (ckfs_abs_path(mnt_arg, mnt, sizeof(mnt)) == 0) {
		mo.mountpoint = mnt;
	} else {
		ckfs_cli_say("'%s': mount point does not exist", mnt_arg);
		rc = 1;
		goto out;
	}
	if (p.config)
		mo.model.config_path = realpath(p.config, config) ? config : p.config;

	/* Always read-only; requests of up to 1 MiB (max_read must also be
	 * set in the init handler); the kernel checks permissions from the
	 * modes carried from the sources (or umask=), which is what keeps
	 * allow_other from publishing files their sources keep private. */
	char *fo = NULL;
	char fsname[PATH_MAX + 16];
	snprintf(fsname, sizeof(fsname), "fsname=%s", mo.src);
	if (fuse_opt_add_opt(&fo, "ro,default_permissions") != 0 ||
	    fuse_opt_add_opt(&fo, "max_read=1048576") != 0 ||
	    (!p.has_subtype && fuse_opt_add_opt(&fo, "subtype=ckfs") != 0) ||
	    (!p.has_fsname && fuse_opt_add_opt_escaped(&fo, fsname) != 0) ||
	    (p.fuse_opts && fuse_opt_add_opt(&fo, p.fuse_opts) != 0)) {
		free(fo);
		ckfs_cli_say("out of memory");
		rc = 1;
		goto out;
	}
	mo.fuse_opts = fo;
	rc = ckfs_fuse_run(&mo);
	free(fo);
out:
	free(p.fuse_opts);
	return rc;
}

/* ---- umount ---- */

static int is_fuse_type(const char *type)
{
	return strcmp(type, "fuse") == 0 || strncmp(type, "fuse.", 5) == 0;
}

/* Non-root: fusermount3 (setuid) unmounts mounts the user made. */
static int run_fusermount(const char *mnt, int lazy)
{
	char *argv[6];
	int argc = 0;
	pid_t pid;
	int st;

	argv[argc++] = "fusermount3";
	argv[argc++] = "-u";
	if (lazy)
		argv[argc++] = "-z";
	argv[argc++] = "--";
	argv[argc++] = (char *)mnt;
	argv[argc] = NULL;
	pid = fork();
	if (pid < 0) {
		ckfs_cli_say("cannot fork: %s", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		execvp(argv[0], argv);
		ckfs_cli_say("cannot run fusermount3: %s", strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return 1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int ckfs_cmd_umount(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "lazy", no_argument, NULL, 'z' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char mnt[PATH_MAX], type[128];
	int lazy = 0, c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "zh", opts, NULL)) != -1) {
		switch (c) {
		case 'z': lazy = 1; break;
		case 'h':
			fputs("usage: ckfs umount [-z|--lazy] MNT\n"
			      "Unmount a ckfs mount. A busy mount (files open) is refused unless\n"
			      "-z detaches it now and lets the daemon exit when the last file\n"
			      "is closed. A dead mount (daemon killed) is cleaned up.\n", stdout);
			return 0;
		default:
			return 2;
		}
	}
	if (argc - optind != 1)
		return ckfs_cli_usage_error("umount", "expected MNT");
	const char *arg = argv[optind];
	if (ckfs_abs_path(arg, mnt, sizeof(mnt)) != 0) {
		ckfs_cli_say("'%s': %s", arg, strerror(errno));
		return 1;
	}
	switch (ckfs_mountinfo_lookup(mnt, type, sizeof(type), NULL, 0)) {
	case 0:
		ckfs_cli_say("'%s': not mounted", arg);
		return 1;
	case 1:
		if (!is_fuse_type(type)) {
			ckfs_cli_say("'%s': not a ckfs mount (%s)", arg, type);
			return 1;
		}
		break;
	default:
		break; /* cannot tell: let the kernel decide */
	}
	if (geteuid() != 0)
		return run_fusermount(mnt, lazy);
	if (umount2(mnt, lazy ? MNT_DETACH : 0) == 0)
		return 0;
	if (errno == EBUSY)
		ckfs_cli_say("'%s': busy (files are open); 'ckfs umount -z %s' detaches it now",
			     arg, arg);
	else
		ckfs_cli_say("'%s': cannot unmount: %s", arg, strerror(errno));
	return 1;
}

/* ---- stats ---- */

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *bytes(const cJSON *o, const char *key, char *buf, size_t size)
{
	ckfs_format_bytes(num(o, key), buf, size);
	return buf;
}

static void print_stats(const cJSON *o)
{
	char a[32], b[32], s[32];
	const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");
	double hits = num(o, "hits"), misses = num(o, "misses");

	printf("source          %s\n", cJSON_IsString(src) ? src->valuestring : "?");
	printf("daemon pid      %.0f\n", num(o, "pid"));
	printf("files           %.0f\n", num(o, "files"));
	printf("uptime          %.1f s\n", num(o, "uptime_s"));
	printf("cache           %s of %s in %.0f slices of %s\n",
	       bytes(o, "bytes_cached", a, sizeof(a)), bytes(o, "budget", b, sizeof(b)),
	       num(o, "slices_cached"), bytes(o, "slice_size", s, sizeof(s)));
	printf("hits/misses     %.0f / %.0f (%.1f%% hits), %.0f waits, %.0f evictions\n",
	       hits, misses, hits + misses > 0 ? 100.0 * hits / (hits + misses) : 0.0,
	       num(o, "waits"), num(o, "evictions"));
	printf("filled          %s in %.0f fills, %.0f failed, %.0f into recycled buffers\n",
	       bytes(o, "bytes_filled", a, sizeof(a)), num(o, "fills"),
	       num(o, "fill_errors"), num(o, "recycled"));
	printf("read-ahead      %.0f sequential reads, %.0f slices queued, %.0f dropped, "
	       "%.0f used\n",
	       num(o, "readahead_sequential"), num(o, "prefetch_queued"),
	       num(o, "prefetch_dropped"), num(o, "prefetch_hits"));
	printf("served          %.0f reads, %s, %.0f opens, %.0f errors\n", num(o, "reads"),
	       bytes(o, "bytes_read", a, sizeof(a)), num(o, "opens"), num(o, "errors"));
	printf("source read     %s\n", bytes(o, "source_bytes_read", a, sizeof(a)));
}

int ckfs_cmd_stats(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int json = 0, c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'h':
			fputs("usage: ckfs stats [--json] MNT\n"
			      "Counters of a running mount (slice cache, read-ahead, reads).\n",
			      stdout);
			return 0;
		default:
			return 2;
		}
	}
	if (argc - optind != 1)
		return ckfs_cli_usage_error("stats", "expected MNT");
	const char *mnt = argv[optind];
	char buf[65536];
	ssize_t n = getxattr(mnt, CKFS_STATS_XATTR, buf, sizeof(buf) - 1);
	if (n < 0) {
		if (errno == ENODATA || errno == ENOTSUP)
			ckfs_cli_say("'%s': not a ckfs mount", mnt);
		else if (errno == ENOTCONN)
			ckfs_cli_say("'%s': the daemon is gone (transport endpoint is not "
				     "connected); run 'ckfs umount %s'", mnt, mnt);
		else
			ckfs_cli_say("'%s': %s", mnt, strerror(errno));
		return 1;
	}
	buf[n] = '\0';
	if (json) {
		fputs(buf, stdout);
		return 0;
	}
	cJSON *o = cJSON_Parse(buf);
	if (!o) {
		ckfs_cli_say("'%s': unreadable statistics", mnt);
		return 1;
	}
	print_stats(o);
	cJSON_Delete(o);
	return 0;
}
