/* SPDX-License-Identifier: MIT */
/*
 * Run discovery (src/layouts/run.c): step names parsed strictly (leading
 * zeros, signs, non-digits and numbers past 2^53 refused, never served),
 * the tracker parsed strictly and its last good value kept, the
 * completeness rule with and without tracker, what a folder is (run, step
 * or plain checkpoint: the layouts' own detection, checked against
 * ckfs_model_open on every fixture folder), roles and the fingerprint
 * seeing a changed file.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckfs/layouts.h"
#include "ckfs/run.h"
#include "layouts/layouts.h"
#include "test.h"

static char root[256];

static void mk(const char *rel)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	CHECK(mkdir(p, 0755) == 0);
}

static void put(const char *rel, const char *text)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	FILE *f = fopen(p, "w");
	CHECK(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static void fresh_root(void)
{
	char cmd[300];
	if (root[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
		CHECK(system(cmd) == 0);
	}
	snprintf(root, sizeof(root), "/tmp/ckfs-test-run-XXXXXX");
	CHECK(mkdtemp(root) != NULL);
}

static void test_step_names(void)
{
	uint64_t s = 99;
	const char *why = NULL;

	CHECK_EQ_INT(ckfs_run_step_name("global_step_50", &s, &why), CKFS_STEP_NAME_OK);
	CHECK_EQ_INT(s, 50);
	CHECK_EQ_INT(ckfs_run_step_name("global_step_0", &s, &why), CKFS_STEP_NAME_OK);
	CHECK_EQ_INT(s, 0);
	CHECK_EQ_INT(ckfs_run_step_name("global_step_9007199254740992", &s, &why),
		     CKFS_STEP_NAME_OK);
	CHECK(s == (UINT64_C(1) << 53));
	static const char *const bad[] = {
		"global_step_", "global_step_007", "global_step_00", "global_step_1a",
		"global_step_-1", "global_step_+1", "global_step_ 1", "global_step_1 ",
		"global_step_9007199254740993", "global_step_99999999999999999999999",
		"global_step_0x10",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why = NULL;
		CHECK_EQ_INT(ckfs_run_step_name(bad[i], &s, &why), CKFS_STEP_NAME_BAD);
		CHECK(why != NULL);
	}
	CHECK_EQ_INT(ckfs_run_step_name("global_step10", &s, &why), CKFS_STEP_NAME_NONE);
	CHECK_EQ_INT(ckfs_run_step_name("actor", &s, &why), CKFS_STEP_NAME_NONE);
}

static void test_tracker_text(void)
{
	struct ckfs_error err;
	uint64_t s = 0;

	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_run_parse_tracker("t", "100", 3, &s, &err), CKFS_OK);
	CHECK_EQ_INT(s, 100);
	CHECK_EQ_INT(ckfs_run_parse_tracker("t", " 7\n", 3, &s, &err), CKFS_OK);
	CHECK_EQ_INT(s, 7);
	static const char *const bad[] = { "", "\n", "1 2", "07", "-3", "3.0", "x", "1\0002" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ckfs_error_clear(&err);
		size_t len = i == 7 ? 3 : strlen(bad[i]);
		CHECK_EQ_INT(ckfs_run_parse_tracker("t", bad[i], len, &s, &err), CKFS_E_FORMAT);
		CHECK(strstr(err.msg, "'t': ") == err.msg);
	}
}

static void test_scan_with_tracker(void)
{
	struct ckfs_run_scan s, s2;
	struct ckfs_error err;
	struct timespec now;

	fresh_root();
	mk("global_step_5");
	mk("global_step_5/actor");
	mk("global_step_10");
	mk("global_step_10/actor");
	mk("global_step_10/critic");
	mk("global_step_15");
	mk("global_step_15/actor");
	mk("global_step_4");  /* rotated away: its actor/ removed */
	put("global_step_4/data.pt", "x");
	mk("global_step_010");
	mk("global_step_x");
	put("global_step_20", "a file, not a step");
	put(CKFS_RUN_TRACKER, "10");
	CHECK_EQ_INT(ckfs_run_kind(root), CKFS_RUN_RUN);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_run_scan(root, NULL, &s, &err), CKFS_OK);
	clock_gettime(CLOCK_REALTIME, &now);
	CHECK_EQ_INT(ckfs_run_classify(&s, &now), 0);
	CHECK_EQ_INT(s.n_steps, 4);
	CHECK_EQ_INT(s.n_ignored, 2);
	CHECK(s.has_tracker && s.tracker_ok);
	CHECK_EQ_INT(s.tracker, 10);
	if (s.n_steps == 4) {
		CHECK_EQ_INT(s.steps[0].step, 4);
		CHECK_EQ_INT(s.steps[0].state, CKFS_STEP_EMPTY);
		CHECK_EQ_INT(s.steps[1].step, 5);
		CHECK_EQ_INT(s.steps[1].state, CKFS_STEP_SHOWN);
		CHECK_EQ_INT(s.steps[2].state, CKFS_STEP_SHOWN);
		CHECK_EQ_INT(s.steps[2].n_roles, 2);
		CHECK(s.steps[2].roles_hash != s.steps[1].roles_hash);
		/* The same role names, saved again: another step. */
		uint64_t before = s.steps[1].roles_hash;
		char cmd[700];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s/global_step_5/actor'", root);
		CHECK(system(cmd) == 0);
		mk("global_step_5/actor");
		CHECK_EQ_INT(ckfs_run_scan(root, NULL, &s2, &err), CKFS_OK);
		CHECK(s2.n_steps == 4 && s2.steps[1].roles_hash != before);
		ckfs_run_scan_release(&s2);
		CHECK_EQ_INT(s.steps[3].state, CKFS_STEP_AHEAD);
		CHECK(ckfs_run_latest(&s) == &s.steps[2]);
	}
	/* A relative path to the run reads the same tracker. */
	char cwd[512];
	CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
	CHECK(chdir("/tmp") == 0);
	CHECK_EQ_INT(ckfs_run_scan(root + 5, NULL, &s2, &err), CKFS_OK);
	CHECK(s2.tracker_ok && s2.tracker == 10);
	ckfs_run_scan_release(&s2);
	CHECK(chdir(cwd) == 0);
	/* Rewritten in place and read empty: the last good value stays. */
	put(CKFS_RUN_TRACKER, "");
	CHECK_EQ_INT(ckfs_run_scan(root, &s, &s2, &err), CKFS_OK);
	ckfs_run_classify(&s2, &now);
	CHECK(s2.tracker_ok);
	CHECK_EQ_INT(s2.tracker, 10);
	CHECK(s2.tracker_error[0] != '\0');
	ckfs_run_scan_release(&s2);
	/* Never good: nothing shown, fail closed. */
	CHECK_EQ_INT(ckfs_run_scan(root, NULL, &s2, &err), CKFS_OK);
	ckfs_run_classify(&s2, &now);
	CHECK(!s2.tracker_ok);
	for (size_t i = 0; i < s2.n_steps; i++)
		CHECK_EQ_INT(s2.steps[i].state, CKFS_STEP_NO_TRACKER);
	CHECK(ckfs_run_latest(&s2) == NULL);
	ckfs_run_scan_release(&s2);
	/* The tracker names a step that is not there: no latest. */
	put(CKFS_RUN_TRACKER, "12\n");
	CHECK_EQ_INT(ckfs_run_scan(root, NULL, &s2, &err), CKFS_OK);
	ckfs_run_classify(&s2, &now);
	CHECK(ckfs_run_latest(&s2) == NULL);
	CHECK_EQ_INT(s2.steps[2].state, CKFS_STEP_SHOWN);
	ckfs_run_scan_release(&s2);
	ckfs_run_scan_release(&s);
}

static void test_scan_without_tracker(void)
{
	struct ckfs_run_scan s;
	struct ckfs_error err;
	struct timespec now;

	fresh_root();
	mk("global_step_1");
	mk("global_step_1/actor");
	mk("global_step_2");
	mk("global_step_2/actor");
	put("global_step_2/actor/model_world_size_2_rank_0.pt", "x");
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_run_scan(root, NULL, &s, &err), CKFS_OK);
	CHECK(!s.has_tracker);
	clock_gettime(CLOCK_REALTIME, &now);
	long pending = ckfs_run_classify(&s, &now);
	CHECK(pending > 0 && pending <= CKFS_RUN_QUIET_S);
	CHECK_EQ_INT(s.steps[0].state, CKFS_STEP_SHOWN);
	CHECK_EQ_INT(s.steps[1].state, CKFS_STEP_WRITING);
	CHECK(ckfs_run_latest(&s) == &s.steps[0]);
	/* Quiet long enough: complete (the clock moved, not the files). */
	now.tv_sec += CKFS_RUN_QUIET_S + 1;
	CHECK_EQ_INT(ckfs_run_classify(&s, &now), 0);
	CHECK_EQ_INT(s.steps[1].state, CKFS_STEP_SHOWN);
	CHECK(ckfs_run_latest(&s) == &s.steps[1]);
	ckfs_run_scan_release(&s);
}

static void test_kinds_roles_fingerprint(void)
{
	char p[512], **roles;
	size_t n;
	struct ckfs_error err;
	uint64_t a, b;

	fresh_root();
	mk("global_step_3");
	mk("global_step_3/critic");
	mk("global_step_3/actor");
	mk("global_step_3/.hidden");
	put("global_step_3/data.pt", "x");
	put("global_step_3/actor/f", "1");
	snprintf(p, sizeof(p), "%s/global_step_3", root);
	CHECK_EQ_INT(ckfs_run_kind(p), CKFS_RUN_STEP);
	snprintf(p, sizeof(p), "%s/global_step_3/actor", root);
	CHECK_EQ_INT(ckfs_run_kind(p), CKFS_RUN_NOT);
	snprintf(p, sizeof(p), "%s/global_step_3", root);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_run_roles(p, &roles, &n, &err), CKFS_OK);
	CHECK_EQ_INT(n, 2);
	if (n == 2) {
		CHECK_EQ_STR(roles[0], "actor");
		CHECK_EQ_STR(roles[1], "critic");
	}
	ckfs_run_roles_free(roles, n);
	snprintf(p, sizeof(p), "%s/global_step_3/actor", root);
	CHECK_EQ_INT(ckfs_run_fingerprint(p, &a, NULL, &err), CKFS_OK);
	CHECK_EQ_INT(ckfs_run_fingerprint(p, &b, NULL, &err), CKFS_OK);
	CHECK(a == b);
	put("global_step_3/actor/f", "22");
	CHECK_EQ_INT(ckfs_run_fingerprint(p, &b, NULL, &err), CKFS_OK);
	CHECK(a != b);
	/* A checkpoint that happens to be named global_step_<N> is that
	 * checkpoint, not a step. */
	mk("global_step_9");
	put("global_step_9/model.safetensors", "x");
	snprintf(p, sizeof(p), "%s/global_step_9", root);
	CHECK_EQ_INT(ckfs_run_kind(p), CKFS_RUN_NOT);
	mk("global_step_8");
	put("global_step_8/model_world_size_1_rank_0.pt", "x");
	snprintf(p, sizeof(p), "%s/global_step_8", root);
	CHECK_EQ_INT(ckfs_run_kind(p), CKFS_RUN_NOT);
	/* Roles named as a layout's folders are still roles unless a layout
	 * claims the step (model/ without mp_rank_*, huggingface/ without
	 * weights), and a name that only starts like a rank file is none. */
	mk("global_step_7");
	mk("global_step_7/model");
	put("global_step_7/model/model_world_size_1_rank_0.pt", "x");
	mk("global_step_7/huggingface");
	mk("global_step_7/model_world_size_notes");
	snprintf(p, sizeof(p), "%s/global_step_7", root);
	CHECK_EQ_INT(ckfs_run_kind(p), CKFS_RUN_STEP);
	/* A DeepSpeed step folder beside no `latest`: DeepSpeed's checkpoint
	 * (its reader asks which step folder to serve), not a step. */
	mk("global_step_6");
	mk("global_step_6/global_step6");
	put("global_step_6/global_step6/mp_rank_00_model_states.pt", "x");
	snprintf(p, sizeof(p), "%s/global_step_6", root);
	CHECK_EQ_INT(ckfs_run_kind(p), CKFS_RUN_NOT);
	/* An ordinary folder is not a run. */
	fresh_root();
	mk("actor");
	CHECK_EQ_INT(ckfs_run_kind(root), CKFS_RUN_NOT);
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	CHECK(system(cmd) == 0);
}

/* ---- the run scanner and ckfs_model_open agree on every fixture and corpus folder ---- */

static char link_dir[256];
static int n_agree;

/* Whether ckfs_model_open finds no layout in dir (it fails with the
 * message for a folder no layout claims). */
static bool no_layout(const char *dir)
{
	const struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;
	struct ckfs_error err, none;
	char real[PATH_MAX];

	ckfs_error_clear(&err);
	if (ckfs_model_open(dir, &opt, &m, &err) == CKFS_OK) {
		ckfs_model_free(m);
		return false;
	}
	ckfs_error_clear(&none);
	CHECK(realpath(dir, real) != NULL);
	(void)ckfs_layout_not_found(real, dir, &none);
	return strcmp(err.msg, none.msg) == 0;
}

static int agree_on(const char *dir, const struct stat *st, int flag, struct FTW *ftw)
{
	char step[512];

	(void)st;
	(void)ftw;
	if (flag != FTW_D)
		return 0;
	/* Named as a step, a folder is one exactly when no layout claims it
	 * (runs themselves are another question). */
	snprintf(step, sizeof(step), "%s/global_step_7", link_dir);
	unlink(step);
	CHECK(symlink(dir, step) == 0);
	enum ckfs_run_kind kind = ckfs_run_kind(step);
	if (kind != CKFS_RUN_RUN) {
		enum ckfs_run_kind want = no_layout(dir) ? CKFS_RUN_STEP : CKFS_RUN_NOT;
		if (kind != want)
			fprintf(stderr, "%s: the run scanner and detection disagree\n", dir);
		CHECK_EQ_INT(kind, want);
		n_agree++;
	}
	return 0;
}

static void test_scanner_agrees_with_detection(void)
{
	char cmd[300];

	snprintf(link_dir, sizeof(link_dir), "/tmp/ckfs-test-agree-XXXXXX");
	CHECK(mkdtemp(link_dir) != NULL);
	CHECK(nftw(CKFS_FIXTURES, agree_on, 16, FTW_PHYS) == 0);
	CHECK(nftw(CKFS_CORPUS, agree_on, 16, FTW_PHYS) == 0);
	CHECK(n_agree > 600);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", link_dir);
	CHECK(system(cmd) == 0);
}

int main(void)
{
	RUN(test_step_names);
	RUN(test_tracker_text);
	RUN(test_scan_with_tracker);
	RUN(test_scan_without_tracker);
	RUN(test_kinds_roles_fingerprint);
	RUN(test_scanner_agrees_with_detection);
	return test_summary();
}
