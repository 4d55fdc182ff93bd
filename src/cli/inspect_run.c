/* SPDX-License-Identifier: MIT */
/* ckfs inspect RUN: a training run's steps (include/ckfs/run.h), what
 * decides which are shown, and for every step shown each role's layout
 * and size, or why it cannot be served; the steps still being saved or
 * rotated away are listed without reading them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckfs/folder.h"
#include "ckfs/json.h"
#include "ckfs/layouts.h"
#include "ckfs/run.h"
#include "ckfs/units.h"
#include "cli/cli.h"
#include "cli/inspect_run.h"

/* One role opened as the mount would: its layout and served size, or the
 * error that makes the mount show it empty. */
struct role_info {
	char layout[64];
	int world_size;
	size_t tensors, files;
	uint64_t params, bytes;
	char error[1024];
};

static void open_role(const char *src, const char *path, const struct cli_common *c,
		      struct role_info *ri)
{
	struct ckfs_model *m = NULL;
	struct ckfs_folder *f = NULL;
	struct ckfs_error err;

	memset(ri, 0, sizeof(*ri));
	ckfs_error_clear(&err);
	if (ckfs_run_open_role(src, path, &c->model, &m, &err) == CKFS_OK &&
	    ckfs_folder_build(m, &c->folder, &f, &err) == CKFS_OK) {
		snprintf(ri->layout, sizeof(ri->layout), "%s", m->layout->name);
		ri->world_size = m->world_size;
		ri->tensors = m->n_tensors;
		for (size_t i = 0; i < m->n_tensors; i++)
			ri->params += m->tensors[i].numel;
		for (size_t i = 0; i < f->n_nodes; i++) {
			ri->files += f->nodes[i].kind != CKFS_NODE_DIR;
			ri->bytes += f->nodes[i].size;
		}
	} else {
		snprintf(ri->error, sizeof(ri->error), "%s",
			 err.msg[0] ? err.msg : ckfs_strerror(err.code));
	}
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

static const char *state_word(enum ckfs_step_state s)
{
	return s == CKFS_STEP_SHOWN ? "shown" : s == CKFS_STEP_EMPTY ? "left out" : "hidden";
}

/* What the report is written to: --json's object, or the terminal. */
struct report {
	const char *src;
	const struct cli_common *c;
	cJSON *root, *steps;       /* --json; NULL for text */
};

/* The run: its tracker and latest (one step alone has neither). */
static void report_run(struct report *r, const struct ckfs_run_scan *scan, bool single,
		       const struct ckfs_run_step *latest)
{
	if (r->root) {
		cJSON_AddStringToObject(r->root, "source", r->src);
		cJSON_AddStringToObject(r->root, "kind", single ? "step" : "run");
		if (!single) {
			cJSON *t = cJSON_AddObjectToObject(r->root, "tracker");
			cJSON_AddBoolToObject(t, "present", scan->has_tracker);
			if (scan->tracker_ok)
				cJSON_AddNumberToObject(t, "step", (double)scan->tracker);
			if (scan->tracker_error[0])
				cJSON_AddStringToObject(t, "error", scan->tracker_error);
			if (latest)
				cJSON_AddStringToObject(r->root, "latest", latest->name);
			else
				cJSON_AddNullToObject(r->root, "latest");
		}
		r->steps = cJSON_AddArrayToObject(r->root, "steps");
		return;
	}
	printf("%-14s %s\n", single ? "step" : "run", ckfs_cli_shown(r->src));
	if (single)
		return;
	if (!scan->has_tracker)
		printf("%-14s none: every step but the newest is complete, the newest "
		       "once nothing under it changed for %d s; latest is the "
		       "newest complete\n", "tracker", CKFS_RUN_QUIET_S);
	else if (scan->tracker_ok && !scan->tracker_error[0])
		printf("%-14s %s: step %llu\n", "tracker", CKFS_RUN_TRACKER,
		       (unsigned long long)scan->tracker);
	else
		printf("%-14s %s\n", "tracker", scan->tracker_error);
	printf("%-14s %s\n", "latest", latest ? latest->name : "(none)");
}

/* A step and its state; --json: the array its roles go in. */
static cJSON *report_step(struct report *r, const struct ckfs_run_step *s,
			  enum ckfs_step_state st)
{
	if (!r->root) {
		printf("%-14s %s%s%s\n", s->name, state_word(st),
		       st == CKFS_STEP_SHOWN ? "" : ": ",
		       st == CKFS_STEP_SHOWN ? "" : ckfs_step_state_name(st));
		return NULL;
	}
	cJSON *js = cJSON_CreateObject();
	cJSON_AddItemToArray(r->steps, js);
	cJSON_AddStringToObject(js, "name", s->name);
	cJSON_AddNumberToObject(js, "step", (double)s->step);
	cJSON_AddStringToObject(js, "state", state_word(st));
	if (st != CKFS_STEP_SHOWN)
		cJSON_AddStringToObject(js, "reason", ckfs_step_state_name(st));
	return cJSON_AddArrayToObject(js, "roles");
}

static void report_role(struct report *r, cJSON *roles, const char *name,
			const struct role_info *ri)
{
	char size[32];

	ckfs_format_bytes((double)ri->bytes, size, sizeof(size));
	if (r->root) {
		cJSON *jr = cJSON_CreateObject();
		cJSON_AddItemToArray(roles, jr);
		cJSON_AddStringToObject(jr, "role", name);
		if (ri->error[0]) {
			cJSON_AddStringToObject(jr, "error", ri->error);
			return;
		}
		cJSON_AddStringToObject(jr, "layout", ri->layout);
		cJSON_AddNumberToObject(jr, "world_size", ri->world_size);
		cJSON_AddNumberToObject(jr, "tensors", (double)ri->tensors);
		cJSON_AddNumberToObject(jr, "parameters", (double)ri->params);
		cJSON_AddNumberToObject(jr, "files", (double)ri->files);
		cJSON_AddNumberToObject(jr, "bytes", (double)ri->bytes);
	} else if (ri->error[0]) {
		printf("  %-12s empty: %s\n", ckfs_cli_shown(name), ri->error);
	} else {
		printf("  %-12s %s, world size %d, %zu tensors, %llu parameters, %s in "
		       "%zu files\n", ckfs_cli_shown(name), ri->layout, ri->world_size,
		       ri->tensors, (unsigned long long)ri->params, size, ri->files);
	}
}

/* Each role of a step shown, opened as the mount would open it. */
static enum ckfs_code report_roles(struct report *r, const char *step_dir, cJSON *roles,
				   struct ckfs_error *err)
{
	char **names;
	size_t n;

	CKFS_TRY(ckfs_run_roles(step_dir, &names, &n, err));
	for (size_t i = 0; i < n; i++) {
		struct role_info ri;
		char role_path[4400];
		snprintf(role_path, sizeof(role_path), "%s/%s", step_dir, names[i]);
		open_role(r->src, role_path, r->c, &ri);
		report_role(r, roles, names[i], &ri);
	}
	ckfs_run_roles_free(names, n);
	return CKFS_OK;
}

/* Names like a step's that are not served, and why. */
static void report_ignored(struct report *r, const struct ckfs_run_scan *scan)
{
	cJSON *arr = NULL;

	for (size_t i = 0; i < scan->n_ignored; i++) {
		if (!r->root) {
			printf("%-14s %s: %s\n", "ignored", scan->ignored[i].name,
			       scan->ignored[i].why);
			continue;
		}
		if (!arr)
			arr = cJSON_AddArrayToObject(r->root, "ignored");
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", scan->ignored[i].name);
		cJSON_AddStringToObject(o, "reason", scan->ignored[i].why);
		ckfs_json_push(arr, o);
	}
}

/* The run folder: SRC, or for one step the folder holding it. */
static void run_folder(const char *src, bool single, char *base, size_t size)
{
	snprintf(base, size, "%s", src);
	if (!single)
		return;
	char *slash = strrchr(base, '/');
	if (slash && slash != base)
		*slash = '\0';
	else
		snprintf(base, size, ".");
}

int ckfs_inspect_run(const char *src, bool single, const struct cli_common *c)
{
	struct report r = { .src = src, .c = c };
	struct ckfs_run_scan scan;
	struct ckfs_error err;
	struct timespec now;
	char base[4096];
	int rc = 0;

	ckfs_error_clear(&err);
	run_folder(src, single, base, sizeof(base));
	if (ckfs_run_scan(base, NULL, &scan, &err) != CKFS_OK)
		return ckfs_cli_report(&err);
	clock_gettime(CLOCK_REALTIME, &now);
	ckfs_run_classify(&scan, &now);
	/* One step: listed as a run of it alone, always shown. */
	const char *only = single ? strrchr(src, '/') ? strrchr(src, '/') + 1 : src : NULL;
	r.root = c->json ? cJSON_CreateObject() : NULL;
	report_run(&r, &scan, single, single ? NULL : ckfs_run_latest(&scan));
	for (size_t i = 0; i < scan.n_steps && rc == 0; i++) {
		const struct ckfs_run_step *s = &scan.steps[i];
		if (only && strcmp(s->name, only) != 0)
			continue;
		enum ckfs_step_state st = only ? CKFS_STEP_SHOWN : s->state;
		cJSON *roles = report_step(&r, s, st);
		if (st != CKFS_STEP_SHOWN)
			continue; /* never read: being saved, or gone */
		char path[4200];
		snprintf(path, sizeof(path), "%s/%s", base, s->name);
		if (report_roles(&r, path, roles, &err) != CKFS_OK)
			rc = ckfs_cli_report(&err);
	}
	if (!only)
		report_ignored(&r, &scan);
	if (r.root) {
		char *text = cJSON_Print(r.root);
		if (text)
			puts(text);
		else
			rc = 1;
		free(text);
		cJSON_Delete(r.root);
	}
	ckfs_run_scan_release(&scan);
	return rc;
}
