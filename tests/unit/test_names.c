/* SPDX-License-Identifier: MIT */
/*
 * The name rule of torch state-dict keys (src/layouts/names.c):
 *  - the rule itself on key lists: wrapper segments removed anywhere,
 *    "module." only when every key has it, one warning counting the names
 *    changed, collisions and flat parameters refused with one line;
 *  - real wrapped state dicts (tests/gen/make_wrapped_fixtures.py: DDP,
 *    torch.compile of the model, of DDP and of each layer, activation
 *    checkpointing under FSDP1, FSDP1 use_orig_params, FSDP1
 *    FULL_STATE_DICT on every rank, DCP and safetensors folders of wrapped
 *    modules) served through every layout that reads torch keys: each must
 *    equal the unwrapped model's weights (original/) tensor for
 *    tensor, bit for bit;
 *  - FSDP1 LOCAL_STATE_DICT and flat parameters refused naming the key and
 *    SHARDED_STATE_DICT.
 */
#include <stdlib.h>

#include "ckfs/model.h"
#include "ckfs/safetensors.h"
#include "layouts/layouts.h"
#include "test.h"
#include "model_check.h"

#define WRAPPED CKFS_FIXTURES "/wrapped"

/* Run the rule over keys; names out, the code returned, the message or
 * the one warning (or "") in msg. */
static enum ckfs_code run_rule_as(const char *const *keys, size_t n, bool in_memory,
				  const char **names, char *msg, size_t size)
{
	struct ckfs_model *m = calloc(1, sizeof(*m));
	struct ckfs_error err;

	ckfs_arena_init(&m->arena);
	ckfs_error_clear(&err);
	enum ckfs_code rc = ckfs_hf_names(m, "sd.pt", keys, names, n, in_memory, &err);
	snprintf(msg, size, "%s", rc != CKFS_OK ? err.msg : m->n_warnings ? m->warnings[0] : "");
	CHECK(m->n_warnings <= 1);
	/* names point into m's arena: copy them out before it goes */
	for (size_t i = 0; rc == CKFS_OK && i < n; i++)
		names[i] = strdup(names[i]);
	ckfs_arena_release(&m->arena);
	free(m);
	return rc;
}

static enum ckfs_code run_rule(const char *const *keys, size_t n, const char **names,
			       char *msg, size_t size)
{
	return run_rule_as(keys, n, true, names, msg, size);
}

static void check_names(const char *const *keys, const char *const *want, size_t n,
			const char *want_warning)
{
	const char *names[8];
	char msg[1024];

	CHECK_EQ_INT(run_rule(keys, n, names, msg, sizeof(msg)), CKFS_OK);
	for (size_t i = 0; i < n; i++) {
		CHECK_EQ_STR(names[i], want[i]);
		free((char *)names[i]);
	}
	CHECK_EQ_STR(msg, want_warning);
}

static void check_refused(const char *const *keys, size_t n, enum ckfs_code code,
			  const char *want)
{
	const char *names[8];
	char msg[1024];

	CHECK_EQ_INT(run_rule(keys, n, names, msg, sizeof(msg)), code);
	CHECK_EQ_STR(msg, want);
}

static void test_rule(void)
{
	const char *plain[] = { "model.embed_tokens.weight", "model.module.weight" };
	check_names(plain, plain, 2, "");

	const char *compiled[] = { "_orig_mod.model.norm.weight", "_orig_mod.lm_head.weight" };
	const char *clean[] = { "model.norm.weight", "lm_head.weight" };
	check_names(compiled, clean, 2, "2 of 2 tensor names carried torch wrapper names "
		    "(_orig_mod.), served without them");

	/* anywhere in the key, several kinds in one key */
	const char *nested[] = { "_fsdp_wrapped_module.model.layers.0._fsdp_wrapped_module."
				 "_checkpoint_wrapped_module.mlp.up_proj.weight",
				 "model.layers.1._orig_mod.mlp.up_proj.weight", "lm_head.weight" };
	const char *nested_clean[] = { "model.layers.0.mlp.up_proj.weight",
				       "model.layers.1.mlp.up_proj.weight", "lm_head.weight" };
	check_names(nested, nested_clean, 3, "2 of 3 tensor names carried torch wrapper names "
		    "(_fsdp_wrapped_module., _checkpoint_wrapped_module., _orig_mod.), served "
		    "without them");

	/* DDP's module. on every key, around or inside torch.compile's */
	const char *ddp[] = { "module._orig_mod.model.norm.weight", "_orig_mod.module.lm_head.weight" };
	check_names(ddp, clean, 2, "2 of 2 tensor names carried torch wrapper names (_orig_mod., "
		    "leading module.), served without them");

	/* a leading module. on some keys only is a submodule named module */
	const char *some[] = { "module.weight", "model.norm.weight" };
	check_names(some, some, 2, "");

	/* a segment that only contains a wrapper's name is not one */
	const char *lookalike[] = { "model._orig_mod_x.weight", "model.my_flat_param" };
	check_names(lookalike, lookalike, 2, "");

	const char *collide[] = { "model.norm.weight", "_orig_mod.model.norm.weight" };
	check_refused(collide, 2, CKFS_E_INVALID,
		      "'sd.pt': 'model.norm.weight' and '_orig_mod.model.norm.weight' both name "
		      "'model.norm.weight' once torch wrapper names are removed");
	const char *collide_ddp[] = { "module.a", "module.b", "module._checkpoint_wrapped_module.a" };
	check_refused(collide_ddp, 3, CKFS_E_INVALID,
		      "'sd.pt': 'module.a' and 'module._checkpoint_wrapped_module.a' both name 'a' "
		      "once torch wrapper names are removed");
	const char *flat[] = { "model.norm.weight", "layers.0.flat_param" };
	check_refused(flat, 2, CKFS_E_UNSUPPORTED,
		      "'sd.pt': 'layers.0.flat_param' is an FSDP1 flat parameter (the module's "
		      "parameters flattened into one vector, as LOCAL_STATE_DICT or the wrapped "
		      "module's own parameters hold them); save the state dict with "
		      "StateDictType.SHARDED_STATE_DICT");
	const char *only[] = { "_orig_mod", "a" };
	check_refused(only, 2, CKFS_E_INVALID,
		      "'sd.pt': '_orig_mod' names nothing once torch wrapper names are removed");
}

/* A wrapped fixture served --dtype auto equals the unwrapped model, with
 * one warning saying what was removed (want_warning; "" for none). */
static void check_fixture(const char *name, const char *want_warning, struct ckfs_st_set *orig)
{
	char src[512];
	struct ckfs_model_options opt = { .as_stored = true };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	snprintf(src, sizeof(src), WRAPPED "/%s", name);
	ckfs_error_clear(&err);
	if (ckfs_model_open(src, &opt, &m, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", name, err.msg);
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(m->n_tensors, orig->n_entries);
	test_model_equals(m, orig, CKFS_DTYPE_INVALID, name);
	size_t n_wrapper_warnings = 0;
	for (size_t i = 0; i < m->n_warnings; i++)
		if (strstr(m->warnings[i], "wrapper")) {
			n_wrapper_warnings++;
			CHECK_EQ_STR(m->warnings[i], want_warning);
		}
	CHECK_EQ_INT(n_wrapper_warnings, want_warning[0] != '\0');
	ckfs_model_free(m);
}

/* PEFT (LoRA) names in a safetensors folder are refused: an adapter or a
 * wrapped model, not a model to serve. Held in memory (FSDP, DCP) the name
 * rule passes them on unchanged: peft.c splits them (test_lora.c). */
static void test_peft_names(void)
{
	const char *lora[] = { "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
			       "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" };
	const char *names[8];
	char msg[1024];

	CHECK_EQ_INT(run_rule_as(lora, 2, false, names, msg, sizeof(msg)), CKFS_E_UNSUPPORTED);
	CHECK_EQ_STR(msg, "'sd.pt': 'base_model.model.model.layers.0.self_attn.q_proj.base_layer."
		     "weight' is a PEFT (LoRA) name: a LoRA adapter or a wrapped model, not a "
		     "model to serve");
	const char *adapter[] = { "model.layers.0.mlp.down_proj.lora_B.weight" };
	CHECK_EQ_INT(run_rule_as(adapter, 1, false, names, msg, sizeof(msg)), CKFS_E_UNSUPPORTED);
	CHECK_EQ_STR(msg, "'sd.pt': 'model.layers.0.mlp.down_proj.lora_B.weight' is a PEFT (LoRA) "
		     "name: a LoRA adapter or a wrapped model, not a model to serve");
	/* After wrapper names are removed too. */
	const char *wrapped[] = { "_orig_mod.model.layers.0.q_proj.lora_magnitude_vector" };
	CHECK_EQ_INT(run_rule_as(wrapped, 1, false, names, msg, sizeof(msg)), CKFS_E_UNSUPPORTED);
	check_names(lora, lora, 2, "");
	/* Names that merely contain those words are ordinary. */
	const char *ordinary[] = { "model.lora_Ax.weight", "model.base_layers.weight" };
	CHECK_EQ_INT(run_rule_as(ordinary, 2, false, names, msg, sizeof(msg)), CKFS_OK);
	free((char *)names[0]);
	free((char *)names[1]);
}

static void test_wrapped_fixtures(void)
{
	struct ckfs_st_set orig;
	struct ckfs_error err;
	const char *all12 = "12 of 12 tensor names carried torch wrapper names ";

	ckfs_error_clear(&err);
	if (ckfs_st_set_open(WRAPPED "/original", NULL, &orig, &err) != CKFS_OK) {
		fprintf(stderr, "%s\n", err.msg);
		CHECK(0);
		return;
	}
	char w[256];
	struct {
		const char *name, *which;
	} cases[] = {
		{ "ddp_w2", "(leading module.)" },
		{ "compiled_w1", "(_orig_mod.)" },
		{ "compiled_ddp_w2", "(_orig_mod., leading module.)" },
		{ "dcp_compiled", "(_orig_mod.)" },
		{ "hf_ddp", "(leading module.)" },
		{ "fsdp1_orig_params_w2", "(_fsdp_wrapped_module.)" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(w, sizeof(w), "%s%s, served without them", all12, cases[i].which);
		check_fixture(cases[i].name, w, &orig);
	}
	/* only the layer's keys carry the wrapper: 9 of 12 */
	check_fixture("compiled_layers_w1", "9 of 12 tensor names carried torch wrapper names "
		      "(_orig_mod.), served without them", &orig);
	check_fixture("checkpoint_wrapped_fsdp1_w2", "9 of 12 tensor names carried torch wrapper "
		      "names (_checkpoint_wrapped_module.), served without them", &orig);
	check_fixture("fsdp1_full_state_dict_w2", "", &orig);
	ckfs_st_set_release(&orig);
}

static void check_refused_fixture(const char *name, const char *want_key)
{
	char src[512], want[1024];
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_model *m = NULL;
	struct ckfs_error err;

	snprintf(src, sizeof(src), WRAPPED "/%s", name);
	char *real = realpath(src, NULL);
	snprintf(want, sizeof(want), "'%s/model_world_size_2_rank_0.pt': '%s' is an FSDP1 flat "
		 "parameter (the module's parameters flattened into one vector, as "
		 "LOCAL_STATE_DICT or the wrapped module's own parameters hold them); save the "
		 "state dict with StateDictType.SHARDED_STATE_DICT", real, want_key);
	free(real);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(src, &opt, &m, &err), CKFS_E_UNSUPPORTED);
	CHECK(m == NULL);
	CHECK_EQ_STR(err.msg, want);
}

static void test_flat_params_refused(void)
{
	check_refused_fixture("refused_fsdp1_local_w2", "_flat_param");
	check_refused_fixture("refused_fsdp1_flat_w2", "_fsdp_wrapped_module._flat_param");
}

int main(void)
{
	RUN(test_rule);
	RUN(test_peft_names);
	RUN(test_wrapped_fixtures);
	RUN(test_flat_params_refused);
	return test_summary();
}
