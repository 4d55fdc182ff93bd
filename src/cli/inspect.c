/* SPDX-License-Identifier: MIT */
/* ckfs inspect SRC [--json]: what ckfs found in a checkpoint, from
 * metadata only: layout, world size, mesh, ranks read, per-tensor table,
 * totals and warnings. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs/folder.h"
#include "ckfs/json.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "ckfs/units.h"
#include "ckfs/run.h"
#include "cli/cli.h"
#include "cli/inspect_run.h"
#include "cli/options.h"

static uint64_t stored_bytes(const struct ckfs_tensor *t)
{
	return t->numel * ckfs_dtype_size(t->stored_dtype);
}

static const char *lora_mode_name(enum ckfs_lora_mode mode)
{
	return mode == CKFS_LORA_FUSE ? "fuse" : mode == CKFS_LORA_BASE ? "base" : "adapter";
}

static void add_lora_json(cJSON *root, const struct ckfs_lora *l)
{
	cJSON *o = cJSON_AddObjectToObject(root, "lora");
	cJSON *arr;

	cJSON_AddStringToObject(o, "mode", lora_mode_name(l->mode));
	cJSON_AddNumberToObject(o, "r", (double)l->r);
	cJSON_AddNumberToObject(o, "lora_alpha", (double)l->alpha);
	cJSON_AddBoolToObject(o, "use_rslora", l->rslora);
	cJSON_AddBoolToObject(o, "adapter_only", l->only);
	arr = cJSON_AddArrayToObject(o, "target_modules");
	for (size_t i = 0; i < l->n_target_modules; i++)
		ckfs_json_push(arr, cJSON_CreateString(l->target_modules[i]));
	arr = cJSON_AddArrayToObject(o, "adapter_tensors");
	for (size_t i = 0; i < l->n_tensors; i++)
		ckfs_json_push(arr, cJSON_CreateString(l->tensors[i].name));
}

static int print_json(const struct ckfs_model *m, struct ckfs_facts *facts,
		      const struct ckfs_folder *f)
{
	cJSON *root = cJSON_CreateObject(), *arr, *tensors, *files;
	uint64_t params = 0, in_bytes = 0, out_bytes = 0;

	cJSON_AddStringToObject(root, "source", m->src_dir);
	cJSON_AddStringToObject(root, "layout", m->layout->name);
	cJSON_AddNumberToObject(root, "world_size", m->world_size);
	if (m->written_by)
		cJSON_AddStringToObject(root, "written_by", m->written_by);
	else
		cJSON_AddNullToObject(root, "written_by");
	for (size_t i = 0; i < facts->n; i++) {
		struct ckfs_fact *x = &facts->v[i];
		if (x->key) {
			if (!cJSON_AddItemToObject(root, x->key, x->value))
				cJSON_Delete(x->value);
			x->value = NULL; /* root's now, or freed */
		}
	}
	arr = cJSON_AddArrayToObject(root, "ranks_read");
	for (size_t i = 0; i < m->n_ranks_read; i++)
		ckfs_json_push(arr, cJSON_CreateNumber(m->ranks_read[i]));
	cJSON_AddStringToObject(root, "config", m->config_path);
	cJSON_AddBoolToObject(root, "tie_word_embeddings", m->tie_word_embeddings);
	if (m->lora)
		add_lora_json(root, m->lora);
	tensors = cJSON_AddArrayToObject(root, "tensors");
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", t->name);
		arr = cJSON_AddArrayToObject(o, "shape");
		for (int k = 0; k < t->ndim; k++)
			ckfs_json_push(arr, cJSON_CreateNumber((double)t->shape[k]));
		cJSON_AddStringToObject(o, "stored_dtype", ckfs_dtype_st_name(t->stored_dtype));
		cJSON_AddStringToObject(o, "dtype", ckfs_dtype_st_name(t->out_dtype));
		cJSON_AddStringToObject(o, "placement", t->placement);
		cJSON_AddNumberToObject(o, "pieces", t->n_chunks);
		ckfs_json_push(tensors, o);
		params += t->numel;
		in_bytes += stored_bytes(t);
		out_bytes += ckfs_tensor_out_bytes(t);
	}
	files = cJSON_AddArrayToObject(root, "files");
	for (size_t i = 0; i < f->n_nodes; i++) {
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", f->nodes[i].name);
		cJSON_AddNumberToObject(o, "size", (double)f->nodes[i].size);
		ckfs_json_push(files, o);
	}
	cJSON *tot = cJSON_AddObjectToObject(root, "totals");
	cJSON_AddNumberToObject(tot, "tensors", (double)m->n_tensors);
	cJSON_AddNumberToObject(tot, "parameters", (double)params);
	cJSON_AddNumberToObject(tot, "stored_bytes", (double)in_bytes);
	cJSON_AddNumberToObject(tot, "output_bytes", (double)out_bytes);
	arr = cJSON_AddArrayToObject(root, "warnings");
	for (size_t i = 0; i < m->n_warnings; i++)
		ckfs_json_push(arr, cJSON_CreateString(m->warnings[i]));
	char *text = cJSON_Print(root);
	cJSON_Delete(root);
	if (!text)
		return 1;
	puts(text);
	free(text);
	return 0;
}

static void print_lora(const struct ckfs_lora *l)
{
	printf("lora         %zu adapted modules, r %lld, lora_alpha %lld%s, served as %s%s\n",
	       l->n_pairs, (long long)l->r, (long long)l->alpha, l->rslora ? " (rsLoRA)" : "",
	       lora_mode_name(l->mode), l->only ? " (adapter saved alone)" : "");
	printf("             target_modules");
	for (size_t i = 0; i < l->n_target_modules; i++)
		printf(" %s", ckfs_cli_shown(l->target_modules[i]));
	printf("\n");
}

static void print_text(const struct ckfs_model *m, const struct ckfs_facts *facts,
		       const struct ckfs_folder *f)
{
	uint64_t params = 0, in_bytes = 0, out_bytes = 0;
	char a[32], b[32], shape[128];
	size_t w = 4;

	printf("source       %s\n", ckfs_cli_shown(m->src_dir));
	for (size_t i = 0; i < facts->n; i++)
		if (facts->v[i].label)
			printf("%-12s %s\n", facts->v[i].label,
			       ckfs_cli_shown(facts->v[i].text ? facts->v[i].text : ""));
	if (m->written_by)
		printf("written by   %s\n", m->written_by);
	if (m->n_ranks_read) {
		printf("ranks read   ");
		for (size_t i = 0; i < m->n_ranks_read; i++)
			printf("%s%d", i ? " " : "", m->ranks_read[i]);
		printf("\n");
	}
	printf("config       %s%s\n", ckfs_cli_shown(m->config_path),
	       m->tie_word_embeddings ? " (tie_word_embeddings)" : "");
	if (m->lora)
		print_lora(m->lora);
	printf("\n");
	for (size_t i = 0; i < m->n_tensors; i++)
		if (strlen(ckfs_cli_shown(m->tensors[i].name)) > w)
			w = strlen(ckfs_cli_shown(m->tensors[i].name));
	printf("%-*s  %-20s %-13s %-22s %s\n", (int)w, "name", "shape", "dtype",
	       "placement", "pieces");
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct ckfs_tensor *t = &m->tensors[i];
		char dt[32];
		ckfs_format_dims(t->ndim, t->shape, "[", "]", shape, sizeof(shape));
		snprintf(dt, sizeof(dt), "%s>%s", ckfs_dtype_st_name(t->stored_dtype),
			 ckfs_dtype_st_name(t->out_dtype));
		printf("%-*s  %-20s %-13s %-22s %u\n", (int)w, ckfs_cli_shown(t->name), shape, dt,
		       t->placement, t->n_chunks);
		params += t->numel;
		in_bytes += stored_bytes(t);
		out_bytes += ckfs_tensor_out_bytes(t);
	}
	ckfs_format_bytes((double)in_bytes, a, sizeof(a));
	ckfs_format_bytes((double)out_bytes, b, sizeof(b));
	printf("\n%zu tensors, %llu parameters, %s stored, %s served\n", m->n_tensors,
	       (unsigned long long)params, a, b);
	printf("files:");
	for (size_t i = 0; i < f->n_nodes; i++)
		printf(" %s", ckfs_cli_shown(f->nodes[i].name));
	printf("\n");
	for (size_t i = 0; i < m->n_warnings; i++)
		printf("warning: %s\n", m->warnings[i]);
}

static const struct cli_opt *const inspect_opts[] = {
	&cli_opt_json,   &cli_opt_dtype, &cli_opt_max_shard_size, &cli_opt_transformers_version,
	CLI_SOURCE_OPTS, CLI_MODEL_OPTS, &cli_opt_log_level,      NULL,
};

const struct cli_command ckfs_cmd_inspect_def = {
	.name = "inspect",
	.args = "SRC",
	.n_args = 1,
	.brief = "describe a checkpoint (metadata only)",
	.about = "Describe checkpoint SRC from its metadata alone: its layout, ranks and\n"
		 "mesh, every tensor served (shape, stored and served dtype, placement,\n"
		 "pieces) and the files of the folder. For a training run (or one\n"
		 "global_step_<N> folder): its steps, which are shown and why, and each\n"
		 "role's layout and size, or why it would be an empty folder.",
	.opts = inspect_opts,
	.run = ckfs_cmd_inspect,
};

static int inspect_apply(void *ctx, const struct cli_opt *o, const struct cli_value *v)
{
	int rc = cli_apply_common(&ckfs_cmd_inspect_def, ctx, o, v);
	return rc < 0 ? 0 : rc;
}

int ckfs_cmd_inspect(int argc, char **argv)
{
	struct cli_common c = { 0 }; /* the defaults are in the option rows */
	struct ckfs_model *m;
	struct ckfs_folder *f;
	struct ckfs_facts facts;
	struct ckfs_error err;
	int first;

	ckfs_error_clear(&err);
	int rc = cli_parse(&ckfs_cmd_inspect_def, argc, argv, inspect_apply, &c, &first);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = cli_attach_stores(&c, (const char *const *)argv + first, 1)) != 0)
		return rc;
	enum ckfs_run_kind kind = ckfs_run_kind(argv[first]);
	if (kind != CKFS_RUN_NOT)
		return ckfs_inspect_run(argv[first], kind == CKFS_RUN_STEP, &c);
	if (ckfs_model_open(argv[first], &c.model, &m, &err) != CKFS_OK)
		return ckfs_cli_report(&err);
	if (ckfs_folder_build(m, &c.folder, &f, &err) != CKFS_OK) {
		ckfs_model_free(m);
		return ckfs_cli_report(&err);
	}
	if (ckfs_model_describe(m, &facts, &err) != CKFS_OK) {
		rc = ckfs_cli_report(&err);
	} else if (c.json) {
		rc = print_json(m, &facts, f);
	} else {
		print_text(m, &facts, f);
	}
	ckfs_facts_release(&facts);
	ckfs_folder_free(f);
	ckfs_model_free(m);
	return rc;
}
