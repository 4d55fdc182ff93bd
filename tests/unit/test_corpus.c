/* SPDX-License-Identifier: MIT */
/*
 * The broken-checkpoint corpus (tests/corpus/checkpoints/, written by
 * tests/gen/make_broken_checkpoints.py from real torch files): every case
 * is a whole checkpoint folder broken in one way, and opening it must fail
 * with exactly the code and the full one-line message in the table below,
 * at the stage named there (ckfs_model_open, or ckfs_folder_build for side
 * files), without a crash, a leaked descriptor or a half-made object.
 * Under ASan (CI tier 2) leaks and overflows fail the run too.
 *
 * "{dir}" in a message stands for the real path of the case folder, so the
 * messages are asserted whole wherever the tree is checked out. The ok_*
 * controls must open, build and read back; cases listed with FOLLOW are
 * opened again with follow_symlinks. Every folder of the corpus must have
 * a row and every row a folder, so a new case cannot go unasserted.
 *
 * CKFS_CORPUS_PRINT=1 prints the actual results as table rows, for
 * reviewing a new case's message before pasting it here.
 */
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs/folder.h"
#include "ckfs/layouts.h"
#include "ckfs/model.h"
#include "test.h"

#define CORPUS_DIR CKFS_CORPUS "/checkpoints"

enum stage {
	OPEN,   /* ckfs_model_open fails */
	FOLDER, /* ckfs_model_open succeeds, ckfs_folder_build fails */
	PASS,   /* both succeed and model.safetensors reads back */
};

struct corpus_case {
	const char *name;
	int follow; /* open with follow_symlinks */
	enum stage stage;
	enum ckfs_code code;
	const char *msg;
};

#define NOFOLLOW 0
#define FOLLOW 1

static const struct corpus_case cases[] = {
	/* ---- the rank file's zip container ---- */
	{ "zip64_bad_signature", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': bad zip64 end of central directory signature" },
	{ "zip64_cd_size_huge", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip central directory truncated" },
	{ "zip64_count_huge", NOFOLLOW, OPEN, CKFS_E_LIMIT,
	  "'{dir}/model_world_size_2_rank_1.pt': zip has 1099511627776 entries, more than the limit of 4194304" },
	{ "zip64_count_lie", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': zip entry count 1000 does not fit in a central directory of 745 bytes" },
	{ "zip64_disagree", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': zip64 end of central directory disagrees with end of central directory" },
	{ "zip64_locator_past_end", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': zip64 end of central directory offset out of range" },
	{ "zip_big_endian", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_1.pt': big-endian torch.save files are not supported" },
	{ "zip_cd_bad_signature", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': bad zip central directory signature at entry 5" },
	{ "zip_cd_offset_past_end", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': zip central directory offset out of range" },
	{ "zip_cd_offset_shifted", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': bad zip central directory signature at entry 0" },
	{ "zip_deflate_bomb", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': record 'model_world_size_2_rank_1/data.pkl' inflates past its declared size of 1284 bytes" },
	{ "zip_deflate_corrupt", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': corrupt deflate data in record 'model_world_size_2_rank_1/data.pkl' (invalid code -- missing end-of-block)" },
	{ "zip_deflate_huge_size", NOFOLLOW, OPEN, CKFS_E_LIMIT,
	  "'{dir}/model_world_size_2_rank_1.pt': record 'model_world_size_2_rank_1/data.pkl' is 3221225472 bytes, more than the limit of 1073741824" },
	{ "zip_duplicate_name", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': duplicate zip entry 'model_world_size_2_rank_1/data/1'" },
	{ "zip_empty_file", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': empty file" },
	{ "zip_encrypted", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip entry 'model_world_size_2_rank_1/data/0' is encrypted" },
	{ "zip_legacy_torch", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_1.pt': legacy (non-zip) torch.save format is not supported; re-save with torch >= 1.6" },
	{ "zip_local_name_differs", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': local header name of zip entry 'model_world_size_2_rank_1/data/0' differs from the central directory" },
	{ "zip_local_offset_in_cd", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': local header of zip entry 'model_world_size_2_rank_1/data/0' out of range" },
	{ "zip_local_offset_shifted", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': bad local header signature for zip entry 'model_world_size_2_rank_1/data/0'" },
	{ "zip_method_lzma", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip entry 'model_world_size_2_rank_1/data/0' uses unsupported compression method 14" },
	{ "zip_multi_disk", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_1.pt': multi-disk zip archives are not supported" },
	{ "zip_no_data_pkl", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': no data.pkl record (not a torch.save file)" },
	{ "zip_not_a_zip", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': not a zip archive" },
	{ "zip_record_past_end", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': data of zip entry 'model_world_size_2_rank_1/data/0' extends past end of archive" },
	{ "zip_records_overlap", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': zip entries 'model_world_size_2_rank_1/data/1' and 'model_world_size_2_rank_1/data/2' overlap" },
	{ "zip_storage_deflated", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_1.pt': storage record 'data/0' is compressed" },
	{ "zip_storage_missing", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': storage record 'data/0' of 'model.embed_tokens.weight' is missing" },
	{ "zip_trunc_central_dir", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip end of central directory not found; the file looks truncated (2602 bytes)" },
	{ "zip_trunc_data_pkl", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip end of central directory not found; the file looks truncated (228 bytes)" },
	{ "zip_trunc_eocd", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip end of central directory truncated" },
	{ "zip_trunc_local_header", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip end of central directory not found; the file looks truncated (20 bytes)" },
	{ "zip_trunc_storage", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip end of central directory not found; the file looks truncated (1930 bytes)" },
	{ "zip_trunc_zip64_eocd", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip end of central directory not found; the file looks truncated (3317 bytes)" },
	{ "zip_trunc_zip64_locator", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': zip end of central directory not found; the file looks truncated (3363 bytes)" },
	/* ---- data.pkl ---- */
	{ "pkl_deep_nesting", NOFOLLOW, OPEN, CKFS_E_LIMIT,
	  "'{dir}/model_world_size_2_rank_1.pt: model_world_size_2_rank_1/data.pkl': nesting deeper than 256 in APPEND at offset 100264" },
	{ "pkl_forbidden_global", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_1.pt': value of 'model.embed_tokens.weight' is not a supported tensor (call os.system)" },
	{ "pkl_huge_string", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt: model_world_size_2_rank_1/data.pkl': unexpected end of pickle at offset 294" },
	{ "pkl_memo_out_of_range", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt: model_world_size_2_rank_1/data.pkl': memo index 250 out of range at offset 679" },
	/* ---- torch 2.15 meshes and specs (tests/fixtures/matrix) ---- */
	{ "mesh_unknown_field", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_4_rank_0.pt': 'model.embed_tokens.weight' was written by a torch ckfs does not know (DeviceMesh field '_preserve_rank_ordex'; the file looks like torch 2.13 or newer)" },
	{ "mesh_layout_past_rank_map", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_4_rank_0.pt': device mesh layout of 'model.embed_tokens.weight': view reaches past the end of its storage (16 bytes)" },
	{ "mesh_rank_map_swapped", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_4_rank_1.pt': tensor 'model.embed_tokens.weight': the file is for mesh coordinate (0, 1) but rank 1 is at (0, 0) in the device mesh" },
	{ "spec_shard_order_not_default", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_4_rank_0.pt': DTensor 'model.embed_tokens.weight' has a shard order other than its placements imply" },
	{ "spec_strided_not_order", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_4_rank_0.pt': DTensor 'model.embed_tokens.weight' has _StridedShard placements that its spec says are not a shard order" },
	{ "pkl_not_a_dict", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': data.pkl holds a list, not a state dict" },
	{ "pkl_shard_dim_out_of_range", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': DTensor 'model.embed_tokens.weight' is sharded on dim 5 of a 2-d tensor" },
	{ "pkl_storage_larger_than_record", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': storage record 'data/0' holds 64 bytes, its id declares 800" },
	{ "pkl_storage_smaller_than_view", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.embed_tokens.weight': view reaches past the end of its storage (32 bytes)" },
	{ "pkl_truncated", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt: model_world_size_2_rank_1/data.pkl': unexpected end of pickle at offset 599" },
	/* ---- real torch files that disagree ---- */
	{ "model_bad_local_shape", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.embed_tokens.weight': rank 1 holds 3 along dim 0, its placement implies 4" },
	{ "model_dtype_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.embed_tokens.weight': dtype float32 on rank 0 but bfloat16 on rank 1" },
	{ "model_empty_state_dict", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model_world_size_1_rank_0.pt': the state dict is empty" },
	{ "model_extra_key", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.extra.weight' is not in rank 0's state dict" },
	{ "model_mesh_rank_out_of_range", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_0.pt': device mesh names rank 7 outside world size 2" },
	{ "model_mesh_size_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_3_rank_0.pt': device mesh has 2 ranks but the world size is 3" },
	{ "model_missing_rank", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/model_world_size_2_rank_1.pt': not found (rank 1 is needed)" },
	{ "model_mixed_world_sizes", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}': rank files of several world sizes (4 and 2) and no fsdp_config.json to choose" },
	{ "model_non_utf8_key", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}': tensor 'model.embed_tokens.w\\xed\\xb3\\xbfeight': name is not valid UTF-8 (byte 20)" },
	{ "model_control_chars_key", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.layers.0.\\x0a\\x1b[31mevil\\xc2\\x9b.weight' is not in rank 0's state dict" },
	{ "model_empty_name", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': a tensor has an empty name" },
	{ "model_reserved_name", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': tensor '__metadata__': the name is reserved by the safetensors format" },
	/* plain multi-rank checkpoints and HSDP replicas: every rank present and agreeing */
	{ "model_hsdp_replica_missing", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/model_world_size_4_rank_3.pt': not found (rank 3 is needed)" },
	{ "model_hsdp_replica_shape_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_4_rank_3.pt': tensor 'model.embed_tokens.weight': global shape [8, 4] on rank 0 but [10, 4] on rank 3" },
	{ "model_plain_dtype_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.norm.weight': dtype float32 on rank 0 but bfloat16 on rank 1" },
	{ "model_plain_key_missing", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.norm.weight' of rank 0's state dict is missing" },
	{ "model_plain_missing_rank", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/model_world_size_2_rank_1.pt': not found (rank 1 is needed)" },
	{ "model_plain_shape_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.norm.weight': plain tensor has different shapes on ranks 0 and 1" },
	/* keys of wrapped modules: clashing once the wrapper names go, flat parameters */
	{ "model_fsdp1_flat_param", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model_world_size_2_rank_0.pt': '_fsdp_wrapped_module._flat_param' is an FSDP1 flat parameter (the module's parameters flattened into one vector, as LOCAL_STATE_DICT or the wrapped module's own parameters hold them); save the state dict with StateDictType.SHARDED_STATE_DICT" },
	{ "model_wrapper_name_only", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_1_rank_0.pt': '_orig_mod' names nothing once torch wrapper names are removed" },
	{ "model_wrapper_name_twins", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_1_rank_0.pt': 'model.norm.weight' and '_orig_mod.model.norm.weight' both name 'model.norm.weight' once torch wrapper names are removed" },
	{ "model_wrapper_name_twins_ddp", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_1_rank_0.pt': 'module.model.norm.weight' and 'module._checkpoint_wrapped_module.model.norm.weight' both name 'model.norm.weight' once torch wrapper names are removed" },
	{ "model_rank_copy", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.embed_tokens.weight': the file is for mesh coordinate (0) but rank 1 is at (1) in the device mesh" },
	{ "model_rank_out_of_range", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_5.pt': rank 5 out of range for world size 2" },
	{ "model_ranks_swapped", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_0.pt': tensor 'model.embed_tokens.weight': the file is for mesh coordinate (1) but rank 0 is at (0) in the device mesh" },
	{ "model_renamed_key", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.norm.bias' is not in rank 0's state dict" },
	{ "model_shape_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': tensor 'model.embed_tokens.weight': global shape [8, 4] on rank 0 but [10, 4] on rank 1" },
	{ "model_shape_overflow", NOFOLLOW, OPEN, CKFS_E_LIMIT,
	  "'{dir}': tensor 'model.big.weight': too large to serve (4611686018427387904 elements of 4 bytes; the limit is 4611686018427387904 bytes)" },
	{ "model_sharded_overlap", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}': tensor 'model.embed_tokens.weight': shards of ranks 0 and 1 overlap" },
	{ "model_world_size_disagree", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/fsdp_config.json': world_size 4 disagrees with the rank files (model_world_size_2_rank_*.pt)" },
	/* ---- other layouts: DCP, Hugging Face safetensors, Megatron ---- */
	{ "dcp_chunk_missing", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/.metadata': tensor 'model.embed_tokens.weight': shards hold 19264 of 38528 elements (missing or extra ranks?)" },
	{ "dcp_chunks_overlap", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/.metadata': tensor 'model.embed_tokens.weight': shards of ranks 0 and 0 overlap" },
	{ "dcp_distcp_truncated", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/__0_0.distcp': the item of 'model.layers.0.self_attn.q_proj.weight' at [0, 0] (bytes 40105+9769) lies outside the file (40105 bytes)" },
	{ "dcp_item_past_end", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/__0_0.distcp': the item of 'model.embed_tokens.weight' at [0, 0] (bytes 44201+40105) lies outside the file (40105 bytes)" },
	{ "dcp_metadata_truncated", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/.metadata': unexpected end of pickle at offset 2" },
	{ "dcp_storage_entry_missing", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/.metadata': no storage_data entry for the chunk of 'model.embed_tokens.weight' at [0, 0]" },
	{ "hf_bad_dtype", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/model.safetensors': 'model.layers.0.input_layernorm.weight' has dtype X9" },
	{ "hf_duplicate_tensor_key", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': key 'model.layers.0.input_layernorm.weight' appears twice in one object" },
	{ "hf_header_leading_space", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': header does not start with '{'" },
	{ "hf_header_len_huge", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': bad header length 1099511627776" },
	{ "hf_header_not_utf8", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': header is not UTF-8 (byte 22)" },
	{ "hf_header_nul_padding", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': NUL byte at offset 200" },
	{ "hf_header_control_char", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': control character 0x01 at offset 21" },
	{ "hf_index_duplicate_key", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors.index.json': key 'model.norm.weight' appears twice in one object" },
	{ "hf_index_nul_junk", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors.index.json': NUL byte at offset 210" },
	{ "hf_index_shard_path", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors.index.json': tensor 'model.norm.weight' has a bad shard name" },
	{ "hf_index_symlink_outside_shard", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model-00002-of-00002.safetensors': symlink leads outside the checkpoint; use --follow-symlinks" },
	{ "hf_index_tensor_missing", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors.index.json': tensor 'model.phantom.weight' is not in its shard 'model-00001-of-00002.safetensors'" },
	{ "hf_index_tensor_not_indexed", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model-00001-of-00002.safetensors': tensor 'model.layers.0.input_layernorm.weight' is not in the index for this shard" },
	{ "hf_index_wrong_shard", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors.index.json': tensor 'model.norm.weight' is not in its shard 'model-00001-of-00002.safetensors'" },
	{ "hf_metadata_not_object", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': __metadata__ is not an object" },
	{ "hf_metadata_value_not_string", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': __metadata__ value of 'format' is not a string" },
	{ "hf_number_leading_zero", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': header holds a number that is not a non-negative integer" },
	{ "hf_offsets_exponent", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': header holds a number that is not a non-negative integer" },
	{ "hf_offsets_float", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': header holds a number that is not a non-negative integer" },
	{ "hf_offsets_negative_zero", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': header holds a number that is not a non-negative integer" },
	{ "hf_offsets_past_end", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': data offsets of 'model.norm.weight' do not match its shape" },
	{ "hf_shape_float", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': header holds a number that is not a non-negative integer" },
	{ "hf_symlink_outside_weights", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model.safetensors': symlink leads outside the checkpoint; use --follow-symlinks" },
	{ "hf_tensors_overlap", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/model.safetensors': tensor data not contiguous at 'model.norm.weight'" },
	{ "dcp_wrapper_name_twins", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/.metadata': 'model.norm.weight' and '_orig_mod.model.norm.weight' both name 'model.norm.weight' once torch wrapper names are removed" },
	{ "hf_wrapper_name_twins", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model.safetensors': '_orig_mod.model.norm.weight' and 'model.norm.weight' both name 'model.norm.weight' once torch wrapper names are removed" },
	{ "megatron_missing_tp_rank", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/model/mp_rank_00/model.pt': not found (TP rank 0 of PP stage 0 is needed: TP=2, PP=1)" },
	{ "megatron_tp_size_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model/mp_rank_01/model.pt': 'embedding.word_embeddings.weight' does not match TP rank 0's 'embedding.word_embeddings.weight' (key or local shape differs: mismatched TP sizes?)" },
	/* ---- LoRA actors: PEFT tensors not read, lora_train_meta.json ---- */
	{ "lora_b_missing", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}': module 'model.layers.0.self_attn.q_proj' has lora_A but no lora_B" },
	{ "lora_dora_magnitude", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.default.weight' is a LoRA tensor ckfs does not read: only lora_A and lora_B weights of the adapter named default are (no DoRA, embedding LoRA or second adapter)" },
	{ "lora_embedding", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'base_model.model.model.layers.0.self_attn.q_proj.lora_embedding_A.default' is a LoRA tensor ckfs does not read: only lora_A and lora_B weights of the adapter named default are (no DoRA, embedding LoRA or second adapter)" },
	{ "lora_meta_alpha_string", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/lora_train_meta.json': lora_alpha is not a whole number" },
	{ "lora_meta_duplicate_key", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/lora_train_meta.json': key 'r' appears twice in one object" },
	{ "lora_meta_malformed", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/lora_train_meta.json': invalid JSON at line 2, column 12" },
	{ "lora_meta_not_object", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/lora_train_meta.json': not a JSON object" },
	{ "lora_meta_r_fraction", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/lora_train_meta.json': r is not a whole number" },
	{ "lora_meta_r_mismatch", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/lora_train_meta.json': r 16 does not match the rank of the adapter weights, 8" },
	{ "lora_meta_task_type_number", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/lora_train_meta.json': task_type is not a string" },
	{ "lora_meta_trailing_data", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/lora_train_meta.json': data after the JSON value at offset 53" },
	{ "lora_modules_to_save", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'base_model.model.model.layers.0.self_attn.q_proj.modules_to_save.default.weight' is a PEFT name ckfs does not read (modules_to_save)" },
	{ "lora_outside_peft_model", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'model.layers.0.self_attn.q_proj.lora_A.default.weight' is a LoRA tensor ckfs does not read: only lora_A and lora_B weights of the adapter named default are (no DoRA, embedding LoRA or second adapter)" },
	{ "lora_second_adapter", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.second.weight' is a LoRA tensor ckfs does not read: only lora_A and lora_B weights of the adapter named default are (no DoRA, embedding LoRA or second adapter)" },
	/* ---- names held in memory: model types and stacks not checked ---- */
	{ "names_experts_bias", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'model.layers.0.mlp.experts.down_proj_bias' is a fused expert bias, and transformers writes model_type qwen3_moe's experts one by one, with no bias" },
	{ "names_experts_dense_model_type", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'model.layers.0.mlp.experts.gate_up_proj' is a fused expert stack of model_type qwen3, which ckfs's table from transformers 5.10.4 and 5.23.0 does not cover (tests/gen/make_experts_table.py table --why)" },
	{ "names_experts_down_missing", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}': expert stack 'model.layers.0.mlp.experts.gate_up_proj' has no down_proj" },
	{ "names_experts_unknown_model_type", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'model.layers.0.mlp.experts.gate_up_proj' is a fused expert stack of model_type phimoe, which ckfs's table from transformers 5.10.4 and 5.23.0 does not cover (tests/gen/make_experts_table.py table --why)" },
	{ "names_vlm_outside_rule", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'model.embed_tokens.weight' is not a name qwen3_vl_moe holds in memory" },
	{ "names_vlm_unknown_model_type", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}': 'model.language_model.norm.weight' is a vision-language model's name held in memory, and ckfs does not know how transformers saves model_type qwen3_moe" },
	/* ---- DeepSpeed ZeRO checkpoints ---- */
	{ "deepspeed_bf16opt_no_group_paddings", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt': no zero_stage, and not a BF16_Optimizer state (no single_partition_of_fp32_groups and group_paddings): not a ZeRO checkpoint" },
	{ "deepspeed_frozen_fragment_short", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt': frozen_param_fragments['model.embed_tokens.weight'] holds 1034 elements, ceil(3104/3) = 1035 expected" },
	{ "deepspeed_group_paddings_wrong", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_2_mp_rank_00_optim_states.pt': the fp32 partition of param group 0 holds 5224 elements with 0 of padding, which does not continue rank 0's partitions of 5228" },
	{ "deepspeed_latest_names_missing_folder", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/global_step3': not found (the step folder '{dir}/latest' names)" },
	{ "deepspeed_missing_model_rank", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt': not found (rank 1 of 3 is needed)" },
	{ "deepspeed_missing_model_states", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/global_step2/mp_rank_00_model_states.pt': not found" },
	{ "deepspeed_missing_optim_rank", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/global_step2/zero_pp_rank_2_mp_rank_00_optim_states.pt': not found (rank 2 of 3 is needed)" },
	{ "deepspeed_model_states_ranks_differ", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt': param_shapes differ from rank 0's at 'model.norm.weight': files of different checkpoints?" },
	{ "deepspeed_moe_expert_file", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/expp_rank_0_mp_rank_00_optim_states.pt': a mixture-of-experts file (DeepSpeed MoE checkpoints are not supported)" },
	{ "deepspeed_opaque_flat_group", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt': value of 'fp32_flat_groups[0]' is not a supported tensor (object deepspeed.runtime.zero.stage3.FlatGroup)" },
	{ "deepspeed_opaque_optimizer_state", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt': optimizer_state_dict is a deepspeed.runtime.zero.stage3.ZeroOptimizerState object, not a dict: where its tensors are cannot be known without running it" },
	{ "deepspeed_opaque_zero_stage", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt': zero_stage is a deepspeed.runtime.zero.config.ZeroStage object, not a ZeRO stage" },
	{ "deepspeed_optim_file_truncated", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/global_step2/zero_pp_rank_2_mp_rank_00_optim_states.pt': zip end of central directory not found; the file looks truncated (33289 bytes)" },
	{ "deepspeed_param_shapes_disagree", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt': the fp32 partitions of param group 0 hold 15680 elements, param_shapes (mp_rank_00_model_states.pt) need 15679" },
	{ "deepspeed_param_shapes_disagree_zero3", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt': fp32_flat_groups hold 5240 elements, param_shapes (zero_pp_rank_0_mp_rank_00_model_states.pt) need 5241 (ceil(numel/3) per parameter)" },
	{ "deepspeed_partition_short", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt': fp32_flat_groups hold 5236 elements, param_shapes (zero_pp_rank_0_mp_rank_00_model_states.pt) need 5240 (ceil(numel/3) per parameter)" },
	{ "deepspeed_peft_base_model_name", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/mp_rank_00_model_states.pt': it holds PEFT (LoRA) names (base_model.model., lora_): LoRA checkpoints of DeepSpeed are not supported yet" },
	{ "deepspeed_peft_lora_name", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt': it holds PEFT (LoRA) names (base_model.model., lora_): LoRA checkpoints of DeepSpeed are not supported yet" },
	{ "deepspeed_pipeline_layer_file", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/layer_01-model_states.pt': a pipeline-parallel layer file (DeepSpeed PipelineModule checkpoints are not supported)" },
	{ "deepspeed_rank_of_other_checkpoint", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_2_mp_rank_00_optim_states.pt': ZeRO stage 3 of world size 4, rank 0's is stage 3 of world size 3: files of different checkpoints?" },
	{ "deepspeed_rank_out_of_range", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_3_mp_rank_00_optim_states.pt': rank 3 out of range for world size 3 (partition_count)" },
	{ "deepspeed_tensor_parallel_file", NOFOLLOW, OPEN, CKFS_E_UNSUPPORTED,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_01_optim_states.pt': a tensor-parallel rank's file (DeepSpeed checkpoints with mp_rank above 00 are not supported)" },
	{ "deepspeed_two_files_one_rank", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2': 'bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt' and 'zero_pp_rank_1_mp_rank_00_optim_states.pt' are both rank 1's optimizer state" },
	{ "deepspeed_zero_stage_removed", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt': the fp32 partitions of param group 0 hold 15680 elements, param_shapes (mp_rank_00_model_states.pt) need 15680 and group_paddings 4 (no zero_stage: a BF16_Optimizer state, whose partitions keep their padding)" },
	/* ---- fsdp_config.json and config.json ---- */
	{ "cfg_fsdp_malformed", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': invalid JSON at line 3, column 21" },
	{ "cfg_fsdp_not_object", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': not a JSON object" },
	{ "cfg_fsdp_world_size_fraction", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': world_size 2.5 is not a positive integer" },
	{ "cfg_fsdp_world_size_huge", NOFOLLOW, OPEN, CKFS_E_LIMIT,
	  "'{dir}/fsdp_config.json': world_size 1000000000000 is more than the limit of 65536 ranks" },
	{ "cfg_fsdp_world_size_string", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': world_size is not a number" },
	{ "cfg_fsdp_world_size_zero", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': world_size 0 is not a positive integer" },
	{ "cfg_hf_config_malformed", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': invalid JSON at line 1, column 40" },
	{ "cfg_hf_config_missing", NOFOLLOW, OPEN, CKFS_E_NOTFOUND,
	  "'{dir}/huggingface/config.json': not found; pass --config PATH to a Hugging Face config.json" },
	{ "cfg_hf_config_not_object", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': not a JSON object" },
	{ "cfg_fsdp_duplicate_key", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': key 'world_size' appears twice in one object" },
	{ "cfg_hf_config_duplicate_key", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': key 'tie_word_embeddings' appears twice in one object" },
	{ "cfg_hf_config_tie_not_bool", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': tie_word_embeddings is not true or false" },
	{ "cfg_hf_config_nested_duplicate_key", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': key 'factor' appears twice in one object" },
	/* Read whole, as Python's json reads them (a NUL, a second value, raw
	 * control characters, bytes not UTF-8, a byte order mark). */
	{ "cfg_fsdp_nul_junk", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': NUL byte at offset 46" },
	{ "cfg_fsdp_trailing_data", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/fsdp_config.json': data after the JSON value at offset 47" },
	{ "cfg_hf_config_nul_junk", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': NUL byte at offset 136" },
	{ "cfg_hf_config_control_char", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': control character 0x09 at offset 71" },
	{ "cfg_hf_config_not_utf8", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': not UTF-8 at offset 72" },
	{ "cfg_hf_config_bom", NOFOLLOW, OPEN, CKFS_E_FORMAT,
	  "'{dir}/huggingface/config.json': starts with a byte order mark" },
	/* ---- the folder itself ---- */
	{ "fs_dangling_side_file", NOFOLLOW, FOLDER, CKFS_E_NOTFOUND,
	  "'{dir}/huggingface/tokenizer.json': dangling symlink" },
	{ "fs_fsdp_config_is_directory", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/fsdp_config.json': not a regular file" },
	/* rank file names: one rank, one file, spelt as verl spells it */
	{ "fs_rank_name_copy_suffix", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1 (1).pt': rank '1 (1)' is not a decimal number" },
	{ "fs_rank_name_negative", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_-1.pt': rank '-1' has a sign" },
	{ "fs_rank_name_plus_sign_twin", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}': 'model_world_size_2_rank_+1.pt' and 'model_world_size_2_rank_1.pt' are both rank 1 of world size 2" },
	{ "fs_rank_name_zero_padded", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_01.pt': rank '01' has a leading zero (verl writes model_world_size_2_rank_1.pt)" },
	{ "fs_rank_name_zero_padded_twin", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}': 'model_world_size_1_rank_0.pt' and 'model_world_size_1_rank_00.pt' are both rank 0 of world size 1" },
	{ "fs_rank_number_overflow", NOFOLLOW, OPEN, CKFS_E_LIMIT,
	  "'{dir}/model_world_size_2_rank_99999999999999999999.pt': rank 99999999999999999999 is more than the limit of 65536 ranks" },
	{ "fs_world_size_overflow", NOFOLLOW, OPEN, CKFS_E_LIMIT,
	  "'{dir}/model_world_size_99999999999999999999_rank_0.pt': world size 99999999999999999999 is more than the limit of 65536 ranks" },
	{ "fs_world_size_zero", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_0_rank_0.pt': world size 0 is not a positive number" },
	{ "fs_world_size_zero_padded_twin", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}': 'model_world_size_01_rank_0.pt' and 'model_world_size_1_rank_0.pt' are both rank 0 of world size 1" },
	{ "fs_rank_is_directory", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': not a regular file" },
	{ "fs_symlink_absolute_side_file", NOFOLLOW, FOLDER, CKFS_E_INVALID,
	  "'{dir}/huggingface/tokenizer.json': symlink leads outside the checkpoint; use --follow-symlinks" },
	{ "fs_symlink_loop", NOFOLLOW, OPEN, CKFS_E_IO,
	  "'{dir}/model_world_size_2_rank_1.pt': cannot open: Too many levels of symbolic links" },
	{ "fs_symlink_outside_fsdp_config", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/fsdp_config.json': symlink leads outside the checkpoint; use --follow-symlinks" },
	{ "fs_symlink_outside_huggingface", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/huggingface': symlink leads outside the checkpoint; use --follow-symlinks" },
	{ "fs_symlink_outside_rank", NOFOLLOW, OPEN, CKFS_E_INVALID,
	  "'{dir}/model_world_size_2_rank_1.pt': symlink leads outside the checkpoint; use --follow-symlinks" },
	{ "fs_symlink_outside_side_file", NOFOLLOW, FOLDER, CKFS_E_INVALID,
	  "'{dir}/huggingface/tokenizer.json': symlink leads outside the checkpoint; use --follow-symlinks" },
	{ "fs_zero_byte_rank", NOFOLLOW, OPEN, CKFS_E_TRUNCATED,
	  "'{dir}/model_world_size_2_rank_1.pt': empty file" },
	/* ---- valid controls ---- */
	{ "ok_base", NOFOLLOW, PASS, CKFS_OK, "" },
	{ "ok_symlinks_inside", NOFOLLOW, PASS, CKFS_OK, "" },
	/* ---- the same folders with follow_symlinks ---- */
	{ "fs_symlink_outside_rank", FOLLOW, PASS, CKFS_OK, "" },
	{ "fs_symlink_outside_fsdp_config", FOLLOW, PASS, CKFS_OK, "" },
	{ "fs_symlink_outside_huggingface", FOLLOW, PASS, CKFS_OK, "" },
	{ "fs_symlink_outside_side_file", FOLLOW, PASS, CKFS_OK, "" },
	{ "fs_symlink_loop", FOLLOW, OPEN, CKFS_E_IO,
	  "'{dir}/model_world_size_2_rank_1.pt': cannot open: Too many levels of symbolic links" },
	{ "fs_dangling_side_file", FOLLOW, FOLDER, CKFS_E_NOTFOUND,
	  "'{dir}/huggingface/tokenizer.json': dangling symlink" },
	{ "ok_symlinks_inside", FOLLOW, PASS, CKFS_OK, "" },
};

static char corpus_real[PATH_MAX];

/* msg with every "{dir}" replaced by dir. */
static void expand(const char *msg, const char *dir, char *out, size_t size)
{
	size_t n = 0;

	while (*msg && n + 1 < size) {
		if (strncmp(msg, "{dir}", 5) == 0) {
			n += (size_t)snprintf(out + n, size - n, "%s", dir);
			msg += 5;
		} else {
			out[n++] = *msg++;
		}
	}
	out[n < size ? n : size - 1] = '\0';
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Read every node of f whole; 0 when all reads succeed. */
static int read_all(const struct ckfs_folder *f)
{
	struct ckfs_read_scratch s = { 0 };
	int bad = 0;

	for (size_t i = 0; i < f->n_nodes; i++) {
		const struct ckfs_node *n = &f->nodes[i];
		char *buf = malloc(n->size + 1);
		struct ckfs_error err;
		size_t got = 0;

		ckfs_error_clear(&err);
		if (!buf || ckfs_folder_read(f, n, 0, n->size, buf, &got, &s, &err) != CKFS_OK ||
		    got != n->size) {
			fprintf(stderr, "read of '%s' failed: %s\n", n->name, err.msg);
			bad = 1;
		}
		free(buf);
	}
	ckfs_read_scratch_release(&s);
	return bad;
}

static const char *code_name(enum ckfs_code c)
{
	static const char *const names[] = {
		"CKFS_OK", "CKFS_E_IO", "CKFS_E_NOMEM", "CKFS_E_FORMAT",
		"CKFS_E_TRUNCATED", "CKFS_E_LIMIT", "CKFS_E_UNSUPPORTED",
		"CKFS_E_NOTFOUND", "CKFS_E_INVALID", "CKFS_E_CHANGED",
		"CKFS_E_EXISTS", "CKFS_E_MISMATCH",
	};
	return (unsigned)c < sizeof(names) / sizeof(names[0]) ? names[c] : "?";
}

/* Print a row for the table: the message with the folder put back as {dir}. */
static void print_row(const struct corpus_case *c, const char *dir, enum stage st,
		      const struct ckfs_error *err)
{
	static const char *const stages[] = { "OPEN", "FOLDER", "PASS" };
	char msg[2048];
	size_t n = 0, dl = strlen(dir);

	for (const char *p = err->msg; *p && n + 8 < sizeof(msg);) {
		if (strncmp(p, dir, dl) == 0) {
			n += (size_t)snprintf(msg + n, sizeof(msg) - n, "{dir}");
			p += dl;
		} else if (*p == '"' || *p == '\\') {
			msg[n++] = '\\';
			msg[n++] = *p++;
		} else if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) {
			n += (size_t)snprintf(msg + n, sizeof(msg) - n, "\\x%02x\"\"",
					      (unsigned char)*p++);
		} else {
			msg[n++] = *p++;
		}
	}
	msg[n] = '\0';
	printf("\t{ \"%s\", %s, %s, %s,\n\t  \"%s\" },\n", c->name,
	       c->follow ? "FOLLOW" : "NOFOLLOW", stages[st], code_name(err->code), msg);
}

static void run_case(const struct corpus_case *c)
{
	char dir[PATH_MAX + 256], want[4096];
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_model *m = NULL;
	struct ckfs_folder *f = NULL;
	struct ckfs_error err;
	enum stage got = OPEN;
	int fds = count_fds();

	opt.follow_symlinks = c->follow;
	snprintf(dir, sizeof(dir), "%s/%s", corpus_real, c->name);
	expand(c->msg, dir, want, sizeof(want));
	ckfs_error_clear(&err);
	enum ckfs_code rc = ckfs_model_open(dir, &opt, &m, &err);
	if (rc == CKFS_OK) {
		CHECK(m != NULL);
		got = FOLDER;
		rc = ckfs_folder_build(m, &fopt, &f, &err);
		if (rc == CKFS_OK) {
			CHECK(f != NULL);
			got = PASS;
		} else {
			CHECK(f == NULL); /* no half-built folder */
		}
	} else {
		CHECK(m == NULL); /* no half-opened model */
	}
	CHECK_EQ_INT(rc, err.code);
	if (getenv("CKFS_CORPUS_PRINT")) {
		print_row(c, dir, got, &err);
	} else {
		if (got != c->stage || rc != c->code || strcmp(err.msg, want) != 0)
			fprintf(stderr, "case %s%s:\n", c->name, c->follow ? " (follow)" : "");
		CHECK_EQ_INT(got, c->stage);
		CHECK_EQ_STR(code_name(rc), code_name(c->code));
		CHECK_EQ_STR(err.msg, want);
	}
	if (got == PASS)
		CHECK(read_all(f) == 0);
	/* Failures say one line, never an empty one. */
	CHECK(got == PASS || (err.msg[0] && !strchr(err.msg, '\n')));
	ckfs_folder_free(f);
	ckfs_model_free(m);
	CHECK_EQ_INT(count_fds(), fds); /* every descriptor closed again */
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void test_corpus_cases(void)
{
	if (getenv("CKFS_CORPUS_PRINT")) {
		/* Every folder, in name order, opened as the environment says. */
		DIR *d = opendir(CORPUS_DIR);
		struct dirent *de;
		char *names[512];
		size_t n = 0;
		while (d && (de = readdir(d)) && n < 512)
			if (de->d_name[0] != '.' && de->d_name[0] != '_')
				names[n++] = strdup(de->d_name);
		if (d)
			closedir(d);
		qsort(names, n, sizeof(names[0]), cmp_str);
		for (size_t i = 0; i < n; i++) {
			struct corpus_case c = { names[i], getenv("CKFS_CORPUS_FOLLOW") != NULL,
						 OPEN, CKFS_OK, "" };
			run_case(&c);
			free(names[i]);
		}
		return;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(&cases[i]);
}

/* Every folder has a row and every row a folder; print the counts per
 * category (docs/reliability.md quotes them). */
static void test_corpus_complete(void)
{
	static const char *const cats[] = { "zip", "pkl", "model", "cfg", "fs", "ok",
					     "dcp", "hf", "megatron", "lora", "names", "deepspeed" };
	enum { N_CATS = sizeof(cats) / sizeof(cats[0]) };
	size_t per_cat[N_CATS] = { 0 }, n_dirs = 0;
	DIR *d = opendir(CORPUS_DIR);
	struct dirent *de;

	CHECK(d != NULL);
	while (d && (de = readdir(d))) {
		char path[PATH_MAX + 256];
		struct stat st;
		int found = 0;

		if (de->d_name[0] == '.' || de->d_name[0] == '_')
			continue;
		snprintf(path, sizeof(path), "%s/%s", CORPUS_DIR, de->d_name);
		if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		n_dirs++;
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			found |= strcmp(cases[i].name, de->d_name) == 0;
		if (!found)
			fprintf(stderr, "corpus case '%s' has no row in test_corpus.c\n",
				de->d_name);
		CHECK(found);
		for (size_t k = 0; k < N_CATS; k++) {
			size_t l = strlen(cats[k]);
			if (strncmp(de->d_name, cats[k], l) == 0 &&
			    (de->d_name[l] == '_' || (k == 0 && strncmp(de->d_name + l, "64_", 3) == 0)))
				per_cat[k]++;
		}
	}
	if (d)
		closedir(d);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char path[PATH_MAX + 256];
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", CORPUS_DIR, cases[i].name);
		if (stat(path, &st) != 0)
			fprintf(stderr, "row '%s' has no corpus folder\n", cases[i].name);
		CHECK(stat(path, &st) == 0);
	}
	printf("corpus: %zu cases (zip %zu, pickle %zu, model %zu, config %zu, "
	       "folder %zu, valid controls %zu, dcp %zu, hf %zu, megatron %zu, lora %zu, "
	       "names %zu, deepspeed %zu)\n", n_dirs, per_cat[0], per_cat[1], per_cat[2],
	       per_cat[3], per_cat[4], per_cat[5], per_cat[6], per_cat[7], per_cat[8], per_cat[9],
	       per_cat[10], per_cat[11]);
	CHECK(n_dirs >= 40);
}

/* Copy a small file; 0 on success. */
static int copy_file(const char *from, const char *to)
{
	char buf[1 << 16];
	FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
	size_t n;
	int rc = in && out ? 0 : -1;

	while (rc == 0 && (n = fread(buf, 1, sizeof(buf), in)) > 0)
		rc = fwrite(buf, 1, n, out) == n ? 0 : -1;
	if (in)
		fclose(in);
	if (out && fclose(out) != 0)
		rc = -1;
	return rc;
}

/* Open dir (follow_symlinks as given); the side file name must be served
 * with exactly the bytes want. */
static void check_side_file(const char *dir, int follow, const char *config,
			    const char *name, const char *want)
{
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16,
					  .follow_symlinks = follow,
					  .config_path = config };
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_model *m = NULL;
	struct ckfs_folder *f = NULL;
	struct ckfs_read_scratch s = { 0 };
	struct ckfs_error err;
	char buf[256];
	size_t got = 0;

	ckfs_error_clear(&err);
	if (ckfs_model_open(dir, &opt, &m, &err) != CKFS_OK ||
	    ckfs_folder_build(m, &fopt, &f, &err) != CKFS_OK) {
		fprintf(stderr, "%s: %s\n", dir, err.msg);
		CHECK(0);
		ckfs_model_free(m);
		return;
	}
	const struct ckfs_node *n = NULL;
	for (size_t i = 0; i < f->n_nodes; i++)
		if (strcmp(f->nodes[i].name, name) == 0)
			n = &f->nodes[i];
	CHECK(n != NULL);
	if (n) {
		CHECK_EQ_INT(n->size, strlen(want));
		CHECK_EQ_INT(ckfs_folder_read(f, n, 0, sizeof(buf) - 1, buf, &got, &s, &err),
			     CKFS_OK);
		buf[got] = '\0';
		CHECK_EQ_STR(buf, want);
	}
	ckfs_read_scratch_release(&s);
	ckfs_folder_free(f);
	ckfs_model_free(m);
}

/* Side files reached through symlinks are served when the policy allows
 * them (they were skipped before the policy existed). */
static void test_side_file_symlinks(void)
{
	char dir[PATH_MAX + 64], out[PATH_MAX + 64];

	snprintf(dir, sizeof(dir), "%s/ok_symlinks_inside", corpus_real);
	check_side_file(dir, 0, NULL, "tokenizer.json", "{\"inside\": true}\n");
	snprintf(dir, sizeof(dir), "%s/fs_symlink_outside_side_file", corpus_real);
	check_side_file(dir, 1, NULL, "tokenizer.json", "{\"outside\": true}\n");
	snprintf(dir, sizeof(dir), "%s/fs_symlink_outside_huggingface", corpus_real);
	check_side_file(dir, 1, NULL, "tokenizer.json", "{\"outside\": true}\n");
	/* A checkpoint without huggingface/ and --config naming a folder
	 * outside it: that folder's own side files are the user's choice. */
	char tmp[] = "/tmp/ckfs-corpus-XXXXXX";
	CHECK(mkdtemp(tmp) != NULL);
	snprintf(dir, sizeof(dir), "%s/ok_base", corpus_real);
	snprintf(out, sizeof(out), "%s/_outside/huggingface", corpus_real);
	const char *files[] = { "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt",
				"fsdp_config.json" };
	for (size_t i = 0; i < 3; i++) {
		char from[PATH_MAX + 128], to[PATH_MAX + 128];
		snprintf(from, sizeof(from), "%s/%s", dir, files[i]);
		snprintf(to, sizeof(to), "%s/%s", tmp, files[i]);
		CHECK(copy_file(from, to) == 0);
	}
	check_side_file(tmp, 0, out, "tokenizer.json", "{\"outside\": true}\n");
	for (size_t i = 0; i < 3; i++) {
		char to[PATH_MAX + 128];
		snprintf(to, sizeof(to), "%s/%s", tmp, files[i]);
		unlink(to);
	}
	rmdir(tmp);
}

/* What git cannot hold, made at run time: a FIFO named like a rank file is
 * refused without blocking the open; a FIFO among the side files is
 * skipped (only regular files are side files). */
static void test_fifos(void)
{
	char tmp[] = "/tmp/ckfs-corpus-XXXXXX", path[PATH_MAX + 128], src[PATH_MAX + 128];
	struct ckfs_model_options opt = { .out_dtype = CKFS_DTYPE_BF16 };
	struct ckfs_folder_options fopt = { 0 };
	struct ckfs_model *m = NULL;
	struct ckfs_folder *f = NULL;
	struct ckfs_error err;
	char want[PATH_MAX + 256];

	CHECK(mkdtemp(tmp) != NULL);
	const char *files[] = { "fsdp_config.json", "model_world_size_2_rank_0.pt" };
	for (size_t i = 0; i < 2; i++) {
		snprintf(src, sizeof(src), "%s/ok_base/%s", corpus_real, files[i]);
		snprintf(path, sizeof(path), "%s/%s", tmp, files[i]);
		CHECK(copy_file(src, path) == 0);
	}
	snprintf(path, sizeof(path), "%s/huggingface", tmp);
	CHECK(mkdir(path, 0755) == 0);
	snprintf(src, sizeof(src), "%s/ok_base/huggingface/config.json", corpus_real);
	snprintf(path, sizeof(path), "%s/huggingface/config.json", tmp);
	CHECK(copy_file(src, path) == 0);
	snprintf(path, sizeof(path), "%s/huggingface/tokenizer.json", tmp);
	CHECK(mkfifo(path, 0644) == 0);
	snprintf(path, sizeof(path), "%s/model_world_size_2_rank_1.pt", tmp);
	CHECK(mkfifo(path, 0644) == 0);

	int fds = count_fds();
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(tmp, &opt, &m, &err), CKFS_E_INVALID);
	snprintf(want, sizeof(want), "'%s/model_world_size_2_rank_1.pt': not a regular file",
		 tmp);
	CHECK_EQ_STR(err.msg, want);
	CHECK(m == NULL);
	CHECK_EQ_INT(count_fds(), fds);

	unlink(path);
	snprintf(src, sizeof(src), "%s/ok_base/model_world_size_2_rank_1.pt", corpus_real);
	CHECK(copy_file(src, path) == 0);
	ckfs_error_clear(&err);
	CHECK_EQ_INT(ckfs_model_open(tmp, &opt, &m, &err), CKFS_OK);
	if (m) {
		CHECK_EQ_INT(ckfs_folder_build(m, &fopt, &f, &err), CKFS_OK);
		for (size_t i = 0; f && i < f->n_nodes; i++)
			CHECK(strcmp(f->nodes[i].name, "tokenizer.json") != 0);
		ckfs_folder_free(f);
		ckfs_model_free(m);
	}
	CHECK_EQ_INT(count_fds(), fds);
	const char *all[] = { "huggingface/tokenizer.json", "huggingface/config.json",
			      "model_world_size_2_rank_1.pt", "model_world_size_2_rank_0.pt",
			      "fsdp_config.json", "huggingface" };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", tmp, all[i]);
		if (unlink(path) != 0)
			rmdir(path);
	}
	rmdir(tmp);
}

int main(void)
{
	if (!realpath(CORPUS_DIR, corpus_real)) {
		perror(CORPUS_DIR);
		return 1;
	}
	RUN(test_corpus_complete);
	RUN(test_corpus_cases);
	RUN(test_side_file_symlinks);
	RUN(test_fifos);
	return test_summary();
}
