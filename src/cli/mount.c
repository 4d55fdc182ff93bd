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
#include "ckfs/s3.h"
#include "ckfs/units.h"

#include "cli/cli.h"
#include "cli/options.h"
#include "fuse/fs.h"

struct mount_args {
	struct cli_common c;
	struct ckfs_mount_options mo;
	char *fuse_opts;       /* the user's libfuse options, comma list */
	bool has_fsname, has_subtype, has_prefetch;
};

static const struct cli_opt opt_foreground = {
	.id = OPT_FOREGROUND, .name = "foreground", .letter = 'f',
	.help = "stay in the foreground, log to stderr"
};
static const struct cli_opt opt_debug = {
	.id = OPT_DEBUG, .name = "debug", .letter = 'd', .key = "debug",
	.help = "trace FUSE requests (implies -f)"
};
static const struct cli_opt opt_options = {
	.id = OPT_MOUNT_OPTIONS, .name = "options", .letter = 'o', .arg = "OPT[,OPT...]",
	.kind = CLI_TEXT,
	.help = "mount options: every key shown with -o here, and libfuse's "
		"(allow_other, allow_root, default_permissions, fsname=, subtype=, "
		"auto_unmount, noatime, ...)"
};
static const struct cli_opt opt_cache_size = {
	.id = OPT_CACHE_SIZE, .name = "cache-size", .key = "cache_size", .arg = "SIZE",
	.kind = CLI_SIZE, .lo = 1, .hi = INT64_MAX, .def = "1GiB",
	.help = "slice cache budget"
};
static const struct cli_opt opt_threads = {
	.id = OPT_THREADS, .name = "threads", .key = "threads", .arg = "N",
	.kind = CLI_COUNT, .lo = 1, .hi = 256, .def = "16",
	.help = "FUSE worker threads; read-ahead workers: min(N, max(4, CPUs)), N for "
		"an s3:// source, unless prefetch_threads="
};
static const struct cli_opt opt_readahead = {
	.id = OPT_READAHEAD, .name = "readahead", .key = "readahead", .arg = "N",
	.kind = CLI_COUNT, .lo = 0, .hi = 4096, .def = "16",
	.help = "read-ahead window, in slices (0 off)"
};
static const struct cli_opt opt_prefetch_threads = {
	.id = OPT_PREFETCH_THREADS, .key = "prefetch_threads", .arg = "N",
	.kind = CLI_COUNT, .lo = 0, .hi = 256, .help = "read-ahead workers (0 off)"
};
static const struct cli_opt opt_slice_size = {
	.id = OPT_SLICE_SIZE, .key = "slice_size", .arg = "SIZE",
	.kind = CLI_SIZE, .lo = 4096, .hi = 64 << 20, .def = "4MiB",
	.help = "cache slice, a power of two from 4KiB to 64MiB"
};
/* = max_read: the kernel asks for whole requests */
static const struct cli_opt opt_kernel_readahead = {
	.id = OPT_KERNEL_READAHEAD,
	.key = "kernel_readahead",
	.arg = "SIZE",
	.kind = CLI_SIZE,
	.lo = 0,
	.hi = 1 << 30,
	.def = "1MiB",
	.help = "the mount's read_ahead_kb when run as root, whole KiB up to "
		"1GiB (0 keeps the kernel's 128KiB); an s3:// source: none unless "
		"given, reads follow the reader"
};
static const struct cli_opt opt_uid = {
	.id = OPT_UID, .key = "uid", .arg = "N", .kind = CLI_COUNT, .lo = 0, .hi = INT32_MAX,
	.help = "owner shown for all files (default: the mounting user); mounted by root, "
		"also the user the daemon runs as once mounted"
};
static const struct cli_opt opt_gid = {
	.id = OPT_GID, .key = "gid", .arg = "N", .kind = CLI_COUNT, .lo = 0, .hi = INT32_MAX,
	.help = "group shown for all files (and the daemon's, with uid=)"
};
static const struct cli_opt opt_umask = {
	.id = OPT_UMASK, .key = "umask", .arg = "M", .kind = CLI_OCTAL, .hi = 0777,
	.help = "modes 0444/0555 less octal M whatever the sources allow (umask=0222 "
		"publishes); default: no file shows more than its sources allow"
};
static const struct cli_opt opt_max_plans = {
	.id = OPT_MAX_PLANS, .key = "max_plans", .arg = "N",
	.kind = CLI_COUNT, .lo = 1, .hi = 4096, .def = "8",
	.help = "a run: step roles kept ready, their files open (LRU)"
};
static const struct cli_opt opt_s3_poll = {
	.id = OPT_S3_POLL, .key = "s3_poll", .arg = "S",
	.kind = CLI_COUNT, .lo = 1, .hi = 86400, .def = "30",
	.help = "a run in an object store (no inotify there): list it again every S "
		"seconds for new steps"
};

static const struct cli_choice share_words[] = {
	{ "auto", CKFS_SHARE_AUTO }, { "on", CKFS_SHARE_ON }, { "off", CKFS_SHARE_OFF },
	{ NULL, 0 }
};
static const struct cli_opt opt_share_slices = {
	.id = OPT_SHARE_SLICES, .key = "share_slices", .arg = "WHEN", .kind = CLI_CHOICE,
	.choices = share_words, .def = "auto",
	.help = "hold slices whose bytes are equal once in the cache (every fill hashed and "
		"compared): on, off, or auto (on for a training run, where steps share what "
		"did not change; off for one checkpoint)"
};

static const struct cli_opt opt_preload = {
	.id = OPT_PRELOAD, .key = "preload",
	.help = "store the weight files into the kernel's page cache from the mount's start, "
		"ahead of the loader, as much of them as preload_max allows"
};
static const struct cli_opt opt_preload_max = {
	.id = OPT_PRELOAD_MAX, .key = "preload_max", .arg = "SIZE",
	.kind = CLI_SIZE, .lo = 0, .hi = INT64_MAX,
	.help = "what preload may store (0: nothing); default: half of the memory available "
		"at mount"
};

static const struct cli_opt opt_nosandbox = {
	.id = OPT_NOSANDBOX, .key = "nosandbox",
	.help = "for debugging only: serve without the daemon's sandbox (the uid= user, "
		"no_new_privs, Landlock read-only beneath the sources, a system-call "
		"allow-list; docs/reliability.md)"
};

static const struct cli_opt *const mount_opts[] = {
	&opt_foreground,
	&opt_debug,
	&opt_options,
	&cli_opt_dtype,
	&cli_opt_max_shard_size,
	&cli_opt_transformers_version,
	&opt_cache_size,
	&opt_threads,
	&opt_readahead,
	CLI_SOURCE_OPTS,
	CLI_MODEL_OPTS,
	&cli_opt_format,
	&cli_opt_model_name,
	&cli_opt_log_level,
	&opt_prefetch_threads,
	&opt_slice_size,
	&opt_kernel_readahead,
	&opt_uid,
	&opt_gid,
	&opt_umask,
	&opt_max_plans,
	&opt_s3_poll,
	&opt_share_slices,
	&opt_preload,
	&opt_preload_max,
	&opt_nosandbox,
	&cli_opt_rank_checks,
	NULL,
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

static int is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

static int mount_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v);

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
			rc = cli_apply_text(&ckfs_cmd_mount_def, o, val, mount_apply, a);
	}
	free(copy);
	return rc;
}

static int mount_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v)
{
	struct mount_args *a = ctx;
	struct ckfs_mount_options *mo = &a->mo;
	int rc = cli_apply_common(&ckfs_cmd_mount_def, &a->c, o, v);

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
		return apply_option_list(a, v->text);
	case OPT_CACHE_SIZE:
		mo->cache_size = (uint64_t)v->n;
		return 0;
	case OPT_SLICE_SIZE:
		if (!is_pow2((uint64_t)v->n))
			return ckfs_cli_usage_error("mount", "slice size '%s' must be a power "
						    "of two from 4KiB to 64MiB", v->text);
		mo->slice_size = (size_t)v->n;
		return 0;
	case OPT_THREADS:
		mo->threads = (int)v->n;
		return 0;
	case OPT_PREFETCH_THREADS:
		mo->prefetch_threads = (int)v->n;
		a->has_prefetch = true;
		return 0;
	case OPT_KERNEL_READAHEAD:
		if (v->n % 1024)
			return ckfs_cli_usage_error("mount", "kernel readahead '%s' must be "
						    "whole KiB up to 1GiB, or 0", v->text);
		mo->kernel_readahead_kb = (unsigned)(v->n / 1024);
		mo->kernel_readahead_set = v->text != o->def;
		return 0;
	case OPT_READAHEAD:
		mo->readahead = (int)v->n;
		return 0;
	case OPT_UID:
		mo->uid = (uid_t)v->n;
		mo->has_uid = true;
		return 0;
	case OPT_GID:
		mo->gid = (gid_t)v->n;
		mo->has_gid = true;
		return 0;
	case OPT_MAX_PLANS:
		mo->max_plans = (int)v->n;
		return 0;
	case OPT_S3_POLL:
		mo->s3_poll_s = (int)v->n;
		return 0;
	case OPT_SHARE_SLICES:
		mo->share_slices = (int)v->n;
		return 0;
	case OPT_PRELOAD:
		mo->preload = true;
		return 0;
	case OPT_NOSANDBOX:
		mo->nosandbox = true;
		return 0;
	case OPT_PRELOAD_MAX:
		mo->preload_max = (uint64_t)v->n;
		mo->has_preload_max = true;
		return 0;
	case OPT_UMASK:
		mo->umask = (mode_t)v->n;
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
static int settle(struct mount_args *a, const char *src)
{
	struct ckfs_mount_options *mo = &a->mo;
	int rc = cli_common_settle(&ckfs_cmd_mount_def, &a->c);

	if (rc)
		return rc;
	if (mo->cache_size < 2 * (uint64_t)mo->slice_size)
		return ckfs_cli_usage_error("mount", "cache size must be at least two slices "
					    "(%zu bytes)", 2 * mo->slice_size);
	if (!a->has_prefetch) {
		/* a store's fills wait on the network: as many as the workers */
		long cpus = ckfs_s3_is_url(src) ? mo->threads : sysconf(_SC_NPROCESSORS_ONLN);
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
	struct mount_args a = { 0 }; /* the defaults are in the option rows */
	char src[PATH_MAX], mnt[PATH_MAX], config[PATH_MAX], base[PATH_MAX], *fo = NULL;
	int first;

	int rc = cli_parse(&ckfs_cmd_mount_def, argc, argv, mount_apply, &a, &first);
	if (rc || (rc = settle(&a, argv[first])) != 0)
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
