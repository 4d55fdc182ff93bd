/* SPDX-License-Identifier: MIT */
/*
 * ckfs mount: the command-line side of the FUSE front end (src/fuse).
 * Options come as long options or as -o keys, both from the one table
 * below, so the same settings work from a shell, from /etc/fstab
 * (mount.fuse3 runs "ckfs SRC MNT -o OPTS") and from systemd units. -o keys
 * that are not ckfs's are libfuse mount options; options only meaningful
 * to mount(8) (noauto, nofail, x-systemd.*, ...) are ignored. The mount is
 * always read-only, so "rw" is ignored too.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckfs/log.h"
#include "ckfs/units.h"

#include "cli/cli.h"
#include "cli/options.h"
#include "fuse/fs.h"

#define DEFAULT_CACHE_SIZE (1ull << 30)     /* 1 GiB */
#define DEFAULT_SLICE_SIZE ((size_t)4 << 20) /* 4 MiB */
#define DEFAULT_THREADS 16
#define DEFAULT_READAHEAD 16                 /* slices: 64 MiB ahead */
#define DEFAULT_KERNEL_READAHEAD_KB 1024     /* = max_read: whole requests */
#define DEFAULT_MAX_PLANS 8                  /* a run: step roles kept built */

struct mount_args {
	struct cli_common c;
	struct ckfs_mount_options mo;
	char *fuse_opts;       /* the user's libfuse options, comma list */
	bool has_fsname, has_subtype, has_prefetch;
};

static const struct cli_opt opt_foreground = {
	OPT_FOREGROUND, "foreground", 'f', NULL, NULL, "stay in the foreground, log to stderr"
};
static const struct cli_opt opt_debug = {
	OPT_DEBUG, "debug", 'd', "debug", NULL, "trace FUSE requests (implies -f)"
};
static const struct cli_opt opt_options = {
	OPT_MOUNT_OPTIONS, "options", 'o', NULL, "OPT[,OPT...]",
	"mount options: every key shown as (-o ...) here, and libfuse's "
	"(allow_other, allow_root, default_permissions, fsname=, subtype=, "
	"auto_unmount, noatime, ...)"
};
static const struct cli_opt opt_cache_size = {
	OPT_CACHE_SIZE, "cache-size", 0, "cache_size", "SIZE",
	"slice cache budget (default 1GiB)"
};
static const struct cli_opt opt_threads = {
	OPT_THREADS, "threads", 0, "threads", "N",
	"FUSE worker threads (default 16); read-ahead workers: "
	"min(N, max(4, CPUs)) unless prefetch_threads="
};
static const struct cli_opt opt_readahead = {
	OPT_READAHEAD, "readahead", 0, "readahead", "N",
	"read-ahead window, in slices (default 16, 0 off)"
};
static const struct cli_opt opt_prefetch_threads = {
	OPT_PREFETCH_THREADS, NULL, 0, "prefetch_threads", "N", "read-ahead workers (0 off)"
};
static const struct cli_opt opt_slice_size = {
	OPT_SLICE_SIZE, NULL, 0, "slice_size", "SIZE",
	"cache slice, a power of two from 4KiB to 64MiB (default 4MiB)"
};
static const struct cli_opt opt_kernel_readahead = {
	OPT_KERNEL_READAHEAD, NULL, 0, "kernel_readahead", "SIZE",
	"the mount's read_ahead_kb when run as root (default 1MiB; "
	"0 keeps the kernel's 128KiB)"
};
static const struct cli_opt opt_uid = {
	OPT_UID, NULL, 0, "uid", "N", "owner shown for all files (default: the mounting user)"
};
static const struct cli_opt opt_gid = {
	OPT_GID, NULL, 0, "gid", "N", "group shown for all files"
};
static const struct cli_opt opt_umask = {
	OPT_UMASK, NULL, 0, "umask", "M",
	"modes 0444/0555 less octal M whatever the sources allow (umask=0222 "
	"publishes); default: no file shows more than its sources allow"
};

static const struct cli_opt opt_max_plans = {
	OPT_MAX_PLANS, NULL, 0, "max_plans", "N",
	"a run: step roles kept ready, their files open (default 8; LRU)"
};

static const struct cli_opt *const mount_opts[] = {
	&opt_foreground, &opt_debug, &opt_options, &cli_opt_dtype, &cli_opt_max_shard_size, &cli_opt_transformers_version,
	&opt_cache_size, &opt_threads, &opt_readahead, &cli_opt_config,
	&cli_opt_follow_symlinks, &cli_opt_raw_names, &cli_opt_lora, &cli_opt_base,
	&cli_opt_lora_alpha, &cli_opt_rslora, &cli_opt_fp8_skip, &cli_opt_log_level,
	&opt_prefetch_threads, &opt_slice_size, &opt_kernel_readahead, &opt_uid, &opt_gid,
	&opt_umask, &opt_max_plans, &cli_opt_rank_checks, NULL,
};

const struct cli_command ckfs_cmd_mount_def = {
	.name = "mount",
	.args = "SRC MNT",
	.n_args = 2,
	.brief = "serve the merged folder through FUSE",
	.about = "Serve the merged Hugging Face folder of checkpoint SRC at MNT\n"
		 "(read-only). Returns once the mount is ready (status 0) or has\n"
		 "failed (status 1). A training run (SRC holding global_step_<N>/\n"
		 "folders or latest_checkpointed_iteration.txt) is served as one\n"
		 "folder per step plus 'latest', following the run as it trains.\n"
		 "See also: ckfs umount MNT, ckfs stats MNT.",
	.opts = mount_opts,
	.run = ckfs_cmd_mount,
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

static int mount_apply(void *ctx, const struct cli_opt *o, const char *value);

/* Keys of mount(8) and systemd, ignored; libfuse's flags and valued keys,
 * passed on (NULL-terminated; also listed by the man page and completion). */
const char *const ckfs_mount_ignored_keys[] = {
	"rw", "ro", "defaults", "auto", "noauto", "user", "users", "nouser",
	"owner", "nofail", "_netdev", "sw", "group", NULL,
};
const char *const ckfs_mount_fuse_flags[] = {
	"allow_other", "allow_root", "auto_unmount", "default_permissions",
	"dev", "nodev", "suid", "nosuid", "exec", "noexec", "async", "sync",
	"dirsync", "atime", "noatime", "diratime", "nodiratime", "relatime",
	"norelatime", "strictatime", "nostrictatime", NULL,
};
const char *const ckfs_mount_fuse_keys[] = {
	"fsname", "subtype", "context", "fscontext", "defcontext", "rootcontext",
	"user", NULL,
};

static bool listed(const char *const *list, const char *key)
{
	for (; *list; list++)
		if (strcmp(*list, key) == 0)
			return true;
	return false;
}

/* A mount(8) or libfuse key: ignored, or kept for libfuse. */
static int other_key(struct mount_args *a, const char *key, const char *val, const char *whole)
{
	if (!val && listed(ckfs_mount_ignored_keys, key))
		return 0;
	if (strncmp(key, "x-", 2) == 0 || strcmp(key, "comment") == 0)
		return 0; /* for mount(8) and systemd only */
	bool known = val ? listed(ckfs_mount_fuse_keys, key) : listed(ckfs_mount_fuse_flags, key);
	if (!known)
		return ckfs_cli_usage_error("mount", "unknown mount option '%s'", whole);
	a->has_fsname |= strcmp(key, "fsname") == 0;
	a->has_subtype |= strcmp(key, "subtype") == 0;
	a->mo.allow_other |= strcmp(key, "allow_other") == 0;
	if (ckfs_fuse_opts_add(&a->fuse_opts, whole, false) != 0)
		return ckfs_cli_usage_error("mount", "out of memory");
	return 0;
}

/* A comma list as given to -o: each key is ckfs's (the table) or not. */
static int apply_option_list(struct mount_args *a, const char *list)
{
	char *copy = strdup(list), *save = NULL;
	int rc = 0;

	if (!copy)
		return ckfs_cli_usage_error("mount", "out of memory");
	for (char *opt = strtok_r(copy, ",", &save); opt && rc == 0;
	     opt = strtok_r(NULL, ",", &save)) {
		char whole[PATH_MAX + 64];
		snprintf(whole, sizeof(whole), "%s", opt);
		char *val = strchr(opt, '=');
		if (val)
			*val++ = '\0';
		const struct cli_opt *o = cli_find_key(&ckfs_cmd_mount_def, opt);
		if (!o)
			rc = other_key(a, opt, val, whole);
		else if (o->arg && (!val || !*val))
			rc = ckfs_cli_usage_error("mount", "option '%s' needs a value", opt);
		else if (!o->arg && val)
			rc = ckfs_cli_usage_error("mount", "option '%s' takes no value", opt);
		else
			rc = mount_apply(a, o, val);
	}
	free(copy);
	return rc;
}

static int mount_apply(void *ctx, const struct cli_opt *o, const char *value)
{
	struct mount_args *a = ctx;
	struct ckfs_mount_options *mo = &a->mo;
	int rc = cli_apply_common(&ckfs_cmd_mount_def, &a->c, o, value);
	uint64_t v;
	long n;

	if (rc >= 0)
		return rc;
	switch (o->id) {
	case OPT_FOREGROUND:
		mo->foreground = true;
		return 0;
	case OPT_DEBUG:
		mo->debug = mo->foreground = true;
		return 0;
	case OPT_MOUNT_OPTIONS:
		return apply_option_list(a, value);
	case OPT_CACHE_SIZE:
		if (!(mo->cache_size = ckfs_parse_size(value)))
			return ckfs_cli_usage_error("mount", "bad size '%s'", value);
		return 0;
	case OPT_SLICE_SIZE:
		v = ckfs_parse_size(value);
		if (!is_pow2(v) || v < 4096 || v > (64u << 20))
			return ckfs_cli_usage_error("mount", "slice size '%s' must be a power "
						    "of two from 4KiB to 64MiB", value);
		mo->slice_size = (size_t)v;
		return 0;
	case OPT_THREADS:
	case OPT_PREFETCH_THREADS:
		if (parse_count(value, o->id == OPT_THREADS ? 1 : 0, 256, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad thread count '%s'", value);
		*(o->id == OPT_THREADS ? &mo->threads : &mo->prefetch_threads) = (int)n;
		a->has_prefetch |= o->id == OPT_PREFETCH_THREADS;
		return 0;
	case OPT_KERNEL_READAHEAD:
		v = strcmp(value, "0") == 0 ? 0 : ckfs_parse_size(value);
		if ((v == 0 && strcmp(value, "0") != 0) || v % 1024 || v > (1u << 30))
			return ckfs_cli_usage_error("mount", "kernel readahead '%s' must be "
						    "whole KiB up to 1GiB, or 0", value);
		mo->kernel_readahead_kb = (unsigned)(v / 1024);
		return 0;
	case OPT_READAHEAD:
		if (parse_count(value, 0, 4096, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad read-ahead window '%s'", value);
		mo->readahead = (int)n;
		return 0;
	case OPT_UID:
	case OPT_GID:
		if (parse_count(value, 0, INT32_MAX, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad %s '%s'", o->key, value);
		if (o->id == OPT_UID) {
			mo->uid = (uid_t)n;
			mo->has_uid = true;
		} else {
			mo->gid = (gid_t)n;
			mo->has_gid = true;
		}
		return 0;
	case OPT_MAX_PLANS:
		if (parse_count(value, 1, 4096, &n) != 0)
			return ckfs_cli_usage_error("mount", "bad plan count '%s' (1 to 4096)",
						    value);
		mo->max_plans = (int)n;
		return 0;
	case OPT_UMASK:
		if (parse_umask(value, &mo->umask) != 0)
			return ckfs_cli_usage_error("mount", "bad umask '%s' (octal, 0 to 0777)",
						    value);
		mo->has_umask = true;
		return 0;
	default:
		return 0;
	}
}

/* The libfuse options: always read-only; requests of up to 1 MiB (max_read
 * must also be set in the init handler); the kernel checks permissions
 * from the modes carried from the sources (or umask=), which is what keeps
 * allow_other from publishing files their sources keep private. */
static int fuse_options(struct mount_args *a, char **out)
{
	char fsname[PATH_MAX + 16];

	*out = NULL;
	snprintf(fsname, sizeof(fsname), "fsname=%s", a->mo.src);
	if (ckfs_fuse_opts_add(out, "ro,default_permissions", false) != 0 ||
	    ckfs_fuse_opts_add(out, "max_read=1048576", false) != 0 ||
	    (!a->has_subtype && ckfs_fuse_opts_add(out, "subtype=ckfs", false) != 0) ||
	    (!a->has_fsname && ckfs_fuse_opts_add(out, fsname, true) != 0) ||
	    (a->fuse_opts && ckfs_fuse_opts_add(out, a->fuse_opts, false) != 0)) {
		free(*out);
		*out = NULL;
		ckfs_cli_say("out of memory");
		return 1;
	}
	return 0;
}

/* Defaults that depend on other options, and the checks across them. */
static int settle(struct mount_args *a)
{
	struct ckfs_mount_options *mo = &a->mo;

	if (mo->cache_size < 2 * (uint64_t)mo->slice_size)
		return ckfs_cli_usage_error("mount", "cache size must be at least two slices "
					    "(%zu bytes)", 2 * mo->slice_size);
	if (!a->has_prefetch) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		int cap = cpus > 4 ? (int)cpus : 4;
		mo->prefetch_threads = mo->threads < cap ? mo->threads : cap;
	}
	mo->log_level = mo->debug ? CKFS_LOG_DEBUG : ckfs_log_get_level();
	mo->model = a->c.model;
	mo->folder = a->c.folder;
	return 0;
}

int ckfs_cmd_mount(int argc, char **argv)
{
	struct mount_args a = {
		.c.model.out_dtype = CKFS_DTYPE_BF16,
		.c.model.rank_checks = CKFS_RANK_CHECKS_AUTO,
		.mo = {
			.cache_size = DEFAULT_CACHE_SIZE,
			.slice_size = DEFAULT_SLICE_SIZE,
			.threads = DEFAULT_THREADS,
			.readahead = DEFAULT_READAHEAD,
			.kernel_readahead_kb = DEFAULT_KERNEL_READAHEAD_KB,
			.max_plans = DEFAULT_MAX_PLANS,
		},
	};
	char src[PATH_MAX], mnt[PATH_MAX], config[PATH_MAX], base[PATH_MAX], *fo = NULL;
	int first;

	int rc = cli_parse(&ckfs_cmd_mount_def, argc, argv, mount_apply, &a, &first);
	if (rc || (rc = settle(&a)) != 0)
		goto out;
	/* Absolute paths: the daemon works from "/", and the core re-checks
	 * sources by path. */
	const char *src_arg = argv[first], *mnt_arg = argv[first + 1];
	a.mo.src = realpath(src_arg, src) ? src : src_arg;
	if (strncmp(mnt_arg, "/dev/fd/", 8) == 0) {
		a.mo.mountpoint = mnt_arg;
	} else if (ckfs_abs_path(mnt_arg, mnt, sizeof(mnt)) == 0) {
		a.mo.mountpoint = mnt;
	} else {
		ckfs_cli_say("'%s': mount point does not exist", mnt_arg);
		rc = 1;
		goto out;
	}
	if (a.mo.model.config_path)
		a.mo.model.config_path = realpath(a.mo.model.config_path, config)
						 ? config : a.mo.model.config_path;
	if (a.mo.model.base_path)
		a.mo.model.base_path = realpath(a.mo.model.base_path, base)
					       ? base : a.mo.model.base_path;
	if ((rc = fuse_options(&a, &fo)) != 0)
		goto out;
	a.mo.fuse_opts = fo;
	rc = ckfs_fuse_run(&a.mo);
out:
	free(fo);
	free(a.fuse_opts);
	return rc < 0 ? 0 : rc;
}
