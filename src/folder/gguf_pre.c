/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.ggml.pre of a byte-level BPE tokenizer.json, named as
 * convert_hf_to_gguf.py names it: the converter encodes its fixed check
 * text (chktxt) with the Hugging Face tokenizer, hashes Python's str() of
 * the id list with sha256 and looks the hash up in its table. ckfs runs
 * the same tokenizer on the same text in C (pre-tokenizer regex by a
 * hand-written matcher, byte-level mapping, merges by rank) and looks the
 * same hash up in a copy of that table, so it names what the converter
 * names, or refuses where the converter refuses. Only pipelines whose every
 * step is implemented here are run; anything else is refused by name.
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "ckfs/arena.h"
#include "ckfs/json.h"
#include "ckfs/strbuf.h"
#include "folder/gguf_int.h"
#include "folder/gguf_unicode.h"

/* chktxt of convert_hf_to_gguf.py (get_vocab_base_pre), as UTF-8; it is
 * NFC already, so the NFC normalizer leaves it as it is. */
static const char chktxt[] = "\012 \012\012 \012\012\012 \011 \011\011 \011\012  \012   \012  "
			     "  \012     \012\360\237\232\200 (normal) \360\237\230\266\342"
			     "\200\215\360\237\214\253\357\270\217 (multiple emojis concatenat"
			     "ed) \342\234\205 \360\237\246\231\360\237\246\231 3 33 333 3333 "
			     "33333 333333 3333333 33333333 3.3 3..3 3...3 \341\236\200\341"
			     "\236\266\341\236\223\341\237\213\341\236\217\341\237\202\341\236"
			     "\226\341\236\267\341\236\237\341\237\201\341\236\237\341\236\242"
			     "\341\236\266\341\236\205\360\237\230\201 \077\346\210\221\346"
			     "\203\263\345\234\250apple\345\267\245\344\275\2341314151\345\244"
			     "\251\357\275\236 ------======= \320\275\320\265\321\211\320\276 "
			     "\320\275\320\260 \320\221\321\212\320\273\320\263\320\260\321"
			     "\200\321\201\320\272\320\270 ''''''```````\042\042\042\042......"
			     "!!!!!!\077\077\077\077\077\077 I've been 'told he's there, 'RE y"
			     "ou sure\077 'M not sure I'll make it, 'D you like some tea\077 W"
			     "e'Ve a'lL";

/* The converter's table (llama-cpp-python 0.3.36's get_vocab_base_pre):
 * sha256 of str(ids) -> tokenizer.ggml.pre. Its tests are a chain of ifs,
 * so of two rows with one hash the later one wins. */
static const struct {
	const char *hash, *name;
} known[] = {
	{ "b6e8e1518dc4305be2fe39c313ed643381c4da5db34a98f6a04c093f8afbe99b", "chatglm-bpe" },
	{ "81d72c7348a9f0ebe86f23298d37debe0a5e71149e29bd283904c02262b27516", "chatglm-bpe" },
	{ "a1336059768a55c99a734006ffb02203cd450fed003e9a71886c88acf24fdbc2", "glm4" },
	{ "9ca2dd618e8afaf09731a7cf6e2105b373ba6a1821559f258b272fe83e6eb902", "glm4" },
	{ "cdf5f35325780597efd76153d4d1c16778f766173908894c04afc20108536267", "glm4" },
	{ "1431a23e583c97432bc230bff598d103ddb5a1f89960c8f1d1051aaa944d0b35", "minerva-7b" },
	{ "7e57df22b1fe23a7b1e1c7f3dc4e3f96d43a4eb0836d0c6bdc3436d7b2f1c664", "hunyuan" },
	{ "bba3b3366b646dbdded5dbc42d59598b849371afc42f7beafa914afaa5b70aa6", "hunyuan-dense" },
	{ "e6ddf9c6686791c12d698d34c31ab9be1fea9af5a3d9a6909783ab382198ae1c", "hy_v4" },
	{ "a6b57017d60e6edb4d88ecc2845188e0eb333a70357e45dcc9b53964a73bbae6", "falcon-h1" },
	{ "60476e1243776c4fb1b993dbd7a5f15ac22f83c80afdf425fa5ae01c8d44ef86", "falcon-h1" },
	{ "3eda48b4c4dc7de733d1a8b3e3b4a85243dbbf704da2ee9d42c6beced8897896", "falcon-h1" },
	{ "48f8e02c0359c0bbdd82f26909171fac1c18a457bb47573ed1fe3bbb2c1cfd4b", "falcon-h1" },
	{ "81212dc7cdb7e0c1074ca62c5aeab0d43c9f52b8a737be7b12a777c953027890", "kimi-k2" },
	{ "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c", "qwen2" },
	{ "1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f", "qwen35" },
	{ "66b8d4e19ab16c3bfd89bce5d785fb7e0155e8648708a1f42077cb9fe002c273", "grok-2" },
	{ "b3d1dd861f1d4c5c0d2569ce36baf3f90fe8a102db3de50dd71ff860d91be3df", "jina-v2-de" },
	{ "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4", "gpt-2" },
	{ "9e454714343b69b99b71795c1d27a68c2a1d15dab111f4d353109f966af29da7", "lfm2" },
	{ "846deafc5b0fa786186fa4ae6c7b49903cf2f1d1895bdb80b9120d60be135252", "gemma4" },
	{ "0a766d034107bc736a3f2dc4968fd62e54a3570f1454443e0c5a4cc6bd7941ed", "spark2_5" },
	{ "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5", "llama-bpe" },
	{ "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754", "deepseek-llm" },
	{ "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821", "deepseek-coder" },
	{ "8aeee3860c56296a157a1fe2fad249ec40aa59b1bb5709f4ade11c4e6fe652ed", "falcon" },
	{ "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f", "bert-bge" },
	{ "9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e", "falcon3" },
	{ "8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7", "bert-bge-large" },
	{ "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166", "mpt" },
	{ "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34", "starcoder" },
	{ "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2" },
	{ "32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3", "stablelm2" },
	{ "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff", "refact" },
	{ "9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8", "command-r" },
	{ "d772b220ace2baec124bed8cfafce0ead7d6c38a4b65ef11261cf9d5d62246d1", "tiny_aya" },
	{ "52df12b4c8d4176e7481aab4b6e8454d1fd0a210a04a574f6d4e067d10e23c3e", "cohere2moe" },
	{ "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea", "qwen2" },
	{ "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166", "olmo" },
	{ "a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e", "dbrx" },
	{ "c7699093ba4255a91e702aa38a596aa81669f3525dae06c2953267dde580f448", "jina-v1-en" },
	{ "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f", "jina-v2-en" },
	{ "171aeeedd6fb548d418a7461d053f11b6f1f1fc9b387bd66640d28a4b9f5c643", "jina-v2-es" },
	{ "27949a2493fc4a9f53f5b9b029c82689cfbe5d3a1929bb25e043089e28466de6", "jina-v2-de" },
	{ "a023e9fdc5a11f034d3ef515b92350e56fb2af1f66c6b6811a4444ea9bf8763d", "jina-v5-nano" },
	{ "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d", "smaug-bpe" },
	{ "c7ea5862a53e4272c035c8238367063e2b270d51faa48c0f09e9d5b54746c360", "poro-chat" },
	{ "7967bfa498ade6b757b064f31e964dddbb80f8f9a4d68d4ba7998fcf281c531a", "jina-v2-code" },
	{ "7fc505bd3104ca1083b150b17d088b59534ede9bde81f0dd2090967d7fe52cee", "viking" },
	{ "b53802fb28e26d645c3a310b34bfe07da813026ec7c7716883404d5e0f8b1901", "jais" },
	{ "bc5108ee1eb6a3d600cadd065f63190fbd0554dbc9e4bbd6a0d977970afc8d2a", "jais-2" },
	{ "7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f", "codeshell" },
	{ "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e", "tekken" },
	{ "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249", "smollm" },
	{ "3c30d3ad1d6b64202cd222813e7736c2db6e1bd6d67197090fc1211fbc612ae7", "bloom" },
	{ "bc01ce58980e1db43859146dc51b1758b3b88729b217a74792e9f8d43e479d21", "gpt3-finnish" },
	{ "4e2b24cc4770243d65a2c9ec19770a72f08cffc161adbb73fcbb6b7dd45a0aae", "exaone" },
	{ "fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085", "phi-2" },
	{ "60824e3c0d9401f89943cbb2fff727f0e2d4c545ba4df2d6e4f09a6db0f5b450", "chameleon" },
	{ "8b5a93ed704057481f240da0be7e7dca721d7f8f4755263b6807227a2cbeae65", "roberta-bpe" },
	{ "ad851be1dba641f2e3711822f816db2c265f788b37c63b4e1aeacb9ee92de8eb", "gigachat" },
	{ "d4c8f286ea6b520b3d495c4455483cfa2302c0cfcd4be05d781b6a8a0a7cdaf1", "megrez" },
	{ "877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5", "deepseek-v3" },
	{ "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5", "deepseek-r1-qwen" },
	{ "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e", "gpt-4o" },
	{ "7dec86086fcc38b66b7bc1575a160ae21cf705be7718b9d5598190d7c12db76f", "superbpe" },
	{ "1994ffd01900cfb37395608534236ecd63f2bd5995d6cb1004dda1af50240f15", "trillion" },
	{ "96a5f08be6259352137b512d4157e333e21df7edd3fcd152990608735a65b224", "bailingmoe" },
	{ "d353350c764d8c3b39c763113960e4fb4919bea5fbf208a0e3b22e8469dc7406", "llama4" },
	{ "0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3", "pixtral" },
	{ "d5f1dd6f980fec569fb218a81a7658ac45fc56b38c5a0adeb1c232fbe04ef5ec", "seed-coder" },
	{ "b0a6b1c0bd5998ebd9df08611efde34a4ff03faed45ae09c43e6b31ebd4b94cf", "a.x-4.0" },
	{ "f6791d196f87ce6b56a7d234be618e0d58f8cda3549416635b2bebcd22cd95c4", "midm-2.0" },
	{ "169bf0296a13c4d9b7672313f749eb36501d931022de052aad6e36f2bf34dd51", "lfm2" },
	{ "2085e1638f6c377a0aa4ead21b27bb4cb941bf800df86ed391011769c1758dfb", "exaone4" },
	{ "a1e163ecab2e718a4c829d1148b6e86824ec36163bb71941c3dca9cd5ac25756", "mellum" },
	{ "a0b64b4385f123663873756336c085744376d015ff328bb1d901598f63c44152", "modern-bert" },
	{ "49fc0303c9e0d2c2c565c510f64b2d9b271276acdcdadff733249eda9f7d59df", "afmoe" },
	{ "9b1be57e70d20d9501b2b3186e792d81181ae36ada3903c26f9fea418cf87206", "bailingmoe2" },
	{ "53e325976a6e142379c19b09afcae354f2f496f147afa8f9e189a33fe4e3024e", "granite-docling" },
	{ "f4f37b6c8eb9ea29b3eac6bb8c8487c5ab7885f8d8022e67edc1c68ce8403e95", "minimax-m2" },
	{ "4a2e2abae11ca2b86d570fc5b44be4d5eb5e72cc8f22dd136a94b37da83ab665", "kormo" },
	{ "9d70134b369a70e5735009b6de918f7581b5211f7c074d1f89f753aea8248af1", "youtu" },
	{ "16389f0a1f51ee53e562ffd51c371dc508639ab0e4261502071836e50e223e91", "solar-open" },
	{ "6c81ce329e0802883b22eabab0d3fa48357337ef1ecb45443828bf1f6254833f", "exaone-moe" },
	{ "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4", "qwen35" },
	{ "b4b8ca1f9769494fbd956ebc4c249de6131fb277a4a3345a7a92c7dd7a55808d", "joyai-llm" },
	{ "e4d54df1ebc1f2b91acd986c5b51aa50837d5faf7c7398e73c1f9e9ee5d19869", "kanana2" },
	{ "862f827721df956049dff5ca81a57f29e575280bc622e290d3bf4e35eca29015", "f2llmv2" },
	{ "62f6fb0a6fd5098caeabb19b07a5c1099cafc8b9c40eab6ea89ece4ec02fbc57", "sarvam-moe" },
	{ "f728162c1315c26e40249849799b4ba3fe584c32084b4795b03eb295e63cb5af", "talkie" },
	{ "36f3066e97b7f3994b379aaacde306c1444c6ae84e81a5ae3cd2b7ed3b8c42d4", "minicpm5" },
	{ "f241072145675bf8322086f115aebad05e9f869557a238bf2150a2a417d1bf60",
	  "granite-embed-multi-97m" },
	{ "789696f5946cc0fc59371f39f6097cafed196b3acded6140432f26bbb1ae1669",
	  "granite-embed-multi-311m" },
	{ "9dcf830ee9990cdbf78cc523a5f7bd9ad8f3f9890c2d3581d2785ad10f07049d", "mellum2" },
	{ "972da7b59cec44d1f0a490a86c96df53859e486e481563e5dddac155013d87ac", "laguna" },
	{ "653660222fb704f61cbf2b618a8ae6502b7f8b20c980f9a5de07ed78e13319cd", "ufakzeka" },
};

/* ---- sha256 (FIPS 180-4) ---- */

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	0xc67178f2,
};

static uint32_t ror(uint32_t x, int n)
{
	return x >> n | x << (32 - n);
}

static void sha256_block(uint32_t h[8], const unsigned char *p)
{
	uint32_t w[64], s[8];

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ w[i - 15] >> 3;
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ w[i - 2] >> 10;
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	memcpy(s, h, sizeof(s));
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = s[7] + (ror(s[4], 6) ^ ror(s[4], 11) ^ ror(s[4], 25)) +
			      ((s[4] & s[5]) ^ (~s[4] & s[6])) + K[i] + w[i];
		uint32_t t2 = (ror(s[0], 2) ^ ror(s[0], 13) ^ ror(s[0], 22)) +
			      ((s[0] & s[1]) ^ (s[0] & s[2]) ^ (s[1] & s[2]));
		memmove(s + 1, s, 7 * sizeof(s[0]));
		s[4] += t1;
		s[0] = t1 + t2;
	}
	for (int i = 0; i < 8; i++)
		h[i] += s[i];
}

void gguf_sha256_hex(const void *data, size_t len, char hex[65])
{
	uint32_t h[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
			  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
	const unsigned char *p = data;
	unsigned char last[128] = { 0 };
	size_t full = len / 64 * 64, rest = len - full, n_last = rest < 56 ? 64 : 128;
	uint64_t bits = (uint64_t)len * 8;

	for (size_t i = 0; i < full; i += 64)
		sha256_block(h, p + i);
	memcpy(last, p + full, rest);
	last[rest] = 0x80;
	for (int i = 0; i < 8; i++)
		last[n_last - 1 - i] = (unsigned char)(bits >> (8 * i));
	for (size_t i = 0; i < n_last; i += 64)
		sha256_block(h, last + i);
	for (int i = 0; i < 8; i++)
		snprintf(hex + 8 * i, 9, "%08x", h[i]);
}

/* ---- Unicode classes and UTF-8 ---- */

static bool in(const struct gguf_cp_range *r, size_t n, uint32_t c)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (c < r[mid].lo)
			hi = mid;
		else if (c > r[mid].hi)
			lo = mid + 1;
		else
			return true;
	}
	return false;
}

#define IN(table, c) in(table, sizeof(table) / sizeof(table[0]), c)

static bool is_l(uint32_t c)
{
	return IN(gguf_letter, c);
}

static bool is_n(uint32_t c)
{
	return IN(gguf_number, c);
}

static bool is_s(uint32_t c)
{
	return IN(gguf_space, c);
}

static bool is_p(uint32_t c)
{
	return IN(gguf_punct, c);
}

static bool is_sym(uint32_t c)
{
	return IN(gguf_symbol, c);
}

static bool is_m(uint32_t c)
{
	return IN(gguf_mark, c);
}

static bool is_nl(uint32_t c)
{
	return c == '\r' || c == '\n';
}

/* Well-formed UTF-8 (chktxt, a constant) to code points; *n of them. */
static uint32_t *decode(const char *s, size_t len, size_t *n)
{
	uint32_t *cp = malloc((len + 1) * sizeof(*cp));
	const unsigned char *p = (const unsigned char *)s, *end = p + len;

	*n = 0;
	while (cp && p < end) {
		uint32_t c = *p++;
		int more = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
		c &= more ? 0x3fu >> more : 0x7f;
		while (more-- && p < end)
			c = c << 6 | (*p++ & 0x3f);
		cp[(*n)++] = c;
	}
	return cp;
}

/* ---- the Qwen2 pre-tokenizer ---- */

/* ASCII letter c, either case; for 's, also U+017F, which Unicode case
 * folding (the regex's (?i)) makes s. */
static bool ci(uint32_t c, char lower)
{
	return c == (uint32_t)lower || c == (uint32_t)lower - 32 || (lower == 's' && c == 0x17f);
}

/* The whitespace alternatives every one of these regexes ends with,
 * \s*[\r\n]+|\s+(?!\S)|\s+, at cp[i] (0: c is not \s); n ends the piece,
 * where (?!\S) holds. */
static size_t space_match(const uint32_t *cp, size_t n, size_t i)
{
	size_t j, k = i;

	while (k < n && is_s(cp[k]))
		k++;
	if (k == i)
		return 0;
	/* \s*[\r\n]+: \s* gives back to the run's last newline */
	for (j = k; j > i; j--)
		if (is_nl(cp[j - 1]))
			return j - i;
	/* \s+(?!\S): the whole run at the end, else all but its last */
	if (k == n || k - i >= 2)
		return k == n ? k - i : k - 1 - i;
	return k - i; /* \s+ */
}

/* The length of the match of Qwen2's and Llama 3's regexes at cp[i]
 * (every position matches: each code point is \s, \p{L}, \p{N} or else),
 * taking the alternatives in order, each with its greedy backtracking
 * worked out; digits: \p{N}'s count, 1 or {1,3}. */
static size_t split_match(const uint32_t *cp, size_t n, size_t i, size_t digits)
{
	uint32_t c = cp[i], d = i + 1 < n ? cp[i + 1] : 0;
	size_t j;

	/* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
	if (c == '\'' && i + 1 < n) {
		if (ci(d, 's') || ci(d, 't') || ci(d, 'm') || ci(d, 'd'))
			return 2;
		if (i + 2 < n &&
		    ((ci(d, 'r') && ci(cp[i + 2], 'e')) || (ci(d, 'v') && ci(cp[i + 2], 'e')) ||
		     (ci(d, 'l') && ci(cp[i + 2], 'l'))))
			return 3;
	}
	/* [^\r\n\p{L}\p{N}]?\p{L}+ */
	j = i;
	if (!is_nl(c) && !is_l(c) && !is_n(c) && i + 1 < n && is_l(d))
		j = i + 1;
	if (is_l(cp[j])) {
		while (j < n && is_l(cp[j]))
			j++;
		return j - i;
	}
	/* \p{N} or \p{N}{1,3} */
	if (is_n(c)) {
		for (j = i; j < n && j - i < digits && is_n(cp[j]);)
			j++;
		return j - i;
	}
	/* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
#define OTHER(x) (!is_s(x) && !is_l(x) && !is_n(x))
	j = c == ' ' && i + 1 < n && OTHER(d) ? i + 1 : i;
	if (OTHER(cp[j])) {
		while (j < n && OTHER(cp[j]))
			j++;
		while (j < n && is_nl(cp[j]))
			j++;
		return j - i;
	}
#undef OTHER
	return space_match(cp, n, i);
}

static size_t qwen2_match(const uint32_t *cp, size_t n, size_t i)
{
	return split_match(cp, n, i, 1);
}

static size_t llama3_match(const uint32_t *cp, size_t n, size_t i)
{
	return split_match(cp, n, i, 3);
}

/* ---- DeepSeek-V3's three Splits ---- */

/* \p{N}{1,3} */
static size_t digits3_match(const uint32_t *cp, size_t n, size_t i)
{
	size_t j = i;

	while (j < n && j - i < 3 && is_n(cp[j]))
		j++;
	return j - i;
}

/* [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+: CJK ideographs, kana */
static bool is_cjk(uint32_t c)
{
	return (c >= 0x4e00 && c <= 0x9fa5) || (c >= 0x3040 && c <= 0x30ff);
}

static size_t cjk_match(const uint32_t *cp, size_t n, size_t i)
{
	size_t j = i;

	while (j < n && is_cjk(cp[j]))
		j++;
	return j - i;
}

static bool ascii_alpha(uint32_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* The third regex at cp[i], 0 where nothing matches (a digit run, say):
 * [ASCII punctuation][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 * ' ?[\p{P}\p{S}]+[\r\n]*' | the whitespace alternatives. */
static size_t ds3_match(const uint32_t *cp, size_t n, size_t i)
{
	static const char punct[] = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
	uint32_t c = cp[i], d = i + 1 < n ? cp[i + 1] : 0;
	size_t j;

	if (c && c < 0x80 && strchr(punct, (int)c) && ascii_alpha(d)) {
		for (j = i + 1; j < n && ascii_alpha(cp[j]);)
			j++;
		return j - i;
	}
#define LM(x) (is_l(x) || is_m(x))
#define PS(x) (is_p(x) || is_sym(x))
	j = !is_nl(c) && !is_l(c) && !PS(c) && i + 1 < n && LM(d) ? i + 1 : i;
	if (LM(cp[j])) {
		while (j < n && LM(cp[j]))
			j++;
		return j - i;
	}
	j = c == ' ' && i + 1 < n && PS(d) ? i + 1 : i;
	if (PS(cp[j])) {
		while (j < n && PS(cp[j]))
			j++;
		while (j < n && is_nl(cp[j]))
			j++;
		return j - i;
	}
#undef LM
#undef PS
	return space_match(cp, n, i);
}

/* The Split regexes run here, each a list of Isolated Splits applied in
 * turn: Qwen1.5/2/2.5/3's (and transformers' Qwen2Tokenizer's), Llama 3's
 * (the same but for digits by up to three), DeepSeek-V3's. */
typedef size_t (*matcher)(const uint32_t *cp, size_t n, size_t i);
#define MAX_SPLITS 3
static const struct {
	size_t n;
	const char *regex[MAX_SPLITS];
	matcher match[MAX_SPLITS];
	bool qwen2;
} pipes[] = {
	{ 1,
	  { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
	    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
	  { qwen2_match },
	  true },
	{ 1,
	  { "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
	    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
	  { llama3_match },
	  false },
	{ 3,
	  { "\\p{N}{1,3}",
	    "[\344\270\200-\351\276\245\343\201\200-\343\202\237\343\202\240-\343\203\277]+",
	    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
	    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" },
	  { digits3_match, cjk_match, ds3_match },
	  false },
};
#define N_PIPES (sizeof(pipes) / sizeof(pipes[0]))

/* One Isolated Split (the tokenizers library's): each piece of len[0..*n)
 * (lengths in code points, in order) becomes its matches, found left to
 * right, and the stretches between them; into out, *n updated. */
static void isolate(const uint32_t *cp, matcher m, const size_t *len, size_t *n, size_t *out)
{
	size_t k = 0, at = 0;

	for (size_t p = 0, np = *n; p < np; at += len[p++]) {
		size_t gap = at, end = at + len[p];
		for (size_t i = at; i < end;) {
			size_t got = m(cp + at, end - at, i - at);
			if (!got) {
				i++;
				continue;
			}
			if (gap < i)
				out[k++] = i - gap;
			out[k++] = got;
			i += got;
			gap = i;
		}
		if (gap < end)
			out[k++] = end - gap;
	}
	*n = k;
}

/* The pieces (code point counts, into lens, one per code point at most)
 * of the UTF-8 text by the pipes[] row whose last Split regex is regex;
 * -1 when none is. For tests/unit/test_gguf_bpe.c. */
ssize_t gguf_bpe_split(const char *regex, const char *text, size_t *lens)
{
	size_t n, k = 1, r = 0;

	while (r < N_PIPES && strcmp(pipes[r].regex[pipes[r].n - 1], regex) != 0)
		r++;
	uint32_t *cp = r < N_PIPES ? decode(text, strlen(text), &n) : NULL;
	size_t *next = cp ? malloc((n + 1) * sizeof(*next)) : NULL;
	if (!next) {
		free(cp);
		return -1;
	}
	lens[0] = n;
	for (size_t s = 0; s < pipes[r].n; s++) {
		isolate(cp, pipes[r].match[s], lens, &k, next);
		memcpy(lens, next, k * sizeof(*lens));
	}
	free(cp);
	free(next);
	return n ? (ssize_t)k : 0;
}

/* ---- byte-level BPE ---- */

/* GPT-2's bytes_to_unicode: printable bytes are themselves, the others
 * 256, 257, ... in byte order; as UTF-8 (at most 2 bytes each). */
static size_t byte_char(unsigned char b, char out[2])
{
	unsigned cp = b;

	if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
		unsigned k = 0;
		for (unsigned x = 0; x < b; x++)
			if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
				k++;
		cp = 256 + k;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xc0 | cp >> 6);
	out[1] = (char)(0x80 | (cp & 0x3f));
	return 2;
}

/* An open-addressing map from strings (not owned) to ints. */
struct smap {
	const char **key;
	int64_t *val;
	size_t cap;
};

static uint64_t fnv(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
	return h;
}

static bool smap_init(struct smap *m, size_t n)
{
	m->cap = 16;
	while (m->cap < 2 * n + 16)
		m->cap *= 2;
	m->key = calloc(m->cap, sizeof(*m->key));
	m->val = calloc(m->cap, sizeof(*m->val));
	return m->key && m->val;
}

static void smap_free(struct smap *m)
{
	free(m->key);
	free(m->val);
}

/* The slot of s[0..n): its key's, or the empty one it would take. */
static size_t smap_slot(const struct smap *m, const char *s, size_t n)
{
	size_t i = fnv(s, n) & (m->cap - 1);
	while (m->key[i] && !(strlen(m->key[i]) == n && memcmp(m->key[i], s, n) == 0))
		i = (i + 1) & (m->cap - 1);
	return i;
}

/* false when key is there already (a duplicate: refused by callers) */
static bool smap_put(struct smap *m, const char *key, int64_t val)
{
	size_t i = smap_slot(m, key, strlen(key));
	if (m->key[i])
		return false;
	m->key[i] = key;
	m->val[i] = val;
	return true;
}

static bool smap_get(const struct smap *m, const char *s, size_t n, int64_t *val)
{
	size_t i = smap_slot(m, s, n);
	if (!m->key[i])
		return false;
	*val = m->val[i];
	return true;
}

struct bpe {
	struct smap vocab, ranks;
	bool ignore_merges;   /* a word in the vocab is taken whole */
	struct ckfs_arena ar; /* merges given as pairs, joined */
};

/* The word's symbols (UTF-8 spans of buf), merged by rank until no pair
 * is a merge; then each one's id, appended to ids. */
static const char *bpe_word(const struct bpe *b, const char *buf, size_t len,
			    struct ckfs_strbuf *ids, bool *first)
{
	size_t n = 0, *at = malloc((len + 1) * sizeof(*at)), *ln = malloc((len + 1) * sizeof(*ln));
	char pair[1024];
	const char *why = NULL;

	if (!at || !ln) {
		why = "out of memory";
		goto out;
	}
	int64_t whole;
	if (b->ignore_merges && smap_get(&b->vocab, buf, len, &whole)) {
		ckfs_strbuf_fmt(ids, "%s%lld", *first ? "" : ", ", (long long)whole);
		*first = false;
		goto out;
	}
	for (size_t i = 0; i < len; n++) {
		at[n] = i;
		ln[n] = ((unsigned char)buf[i] & 0xe0) == 0xc0 ? 2 : 1;
		i += ln[n];
	}
	for (;;) {
		int64_t best = INT64_MAX, r;
		size_t where = 0;
		for (size_t i = 0; i + 1 < n; i++) {
			if (ln[i] + ln[i + 1] + 1 > sizeof(pair))
				continue;
			memcpy(pair, buf + at[i], ln[i]);
			pair[ln[i]] = ' ';
			memcpy(pair + ln[i] + 1, buf + at[i + 1], ln[i + 1]);
			if (smap_get(&b->ranks, pair, ln[i] + ln[i + 1] + 1, &r) && r < best) {
				best = r;
				where = i;
			}
		}
		if (best == INT64_MAX)
			break;
		ln[where] += ln[where + 1];
		memmove(at + where + 1, at + where + 2, (n - where - 2) * sizeof(*at));
		memmove(ln + where + 1, ln + where + 2, (n - where - 2) * sizeof(*ln));
		n--;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t id;
		if (!smap_get(&b->vocab, buf + at[i], ln[i], &id)) {
			why = "a piece of the check text that is not in the vocabulary";
			goto out;
		}
		char num[32];
		snprintf(num, sizeof(num), "%s%lld", *first ? "" : ", ", (long long)id);
		ckfs_strbuf_str(ids, num);
		*first = false;
	}
out:
	free(at);
	free(ln);
	return why;
}

/* ---- the pipeline ---- */

static const char *str(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool is(const cJSON *o, const char *k, const char *want)
{
	const char *s = str(o, k);
	return s && strcmp(s, want) == 0;
}

/* a key absent, null or false */
static bool off(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return !v || cJSON_IsNull(v) || cJSON_IsFalse(v);
}

/* a key absent, null or "" */
static bool empty(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && !*v->valuestring);
}

/* ByteLevel without a prefix space and without its own regex: bytes to
 * GPT-2's characters, nothing more. */
static bool plain_byte_level(const cJSON *o)
{
	return is(o, "type", "ByteLevel") && off(o, "add_prefix_space") &&
	       cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "use_regex"));
}

/* The pipes[] row of the pre-tokenizer, when it is Sequence[Split(regex,
 * Isolated)..., ByteLevel], the shape every supported tokenizer has;
 * N_PIPES and *why otherwise. */
static size_t pipeline(const cJSON *pre, const char **why)
{
	const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
	int n = cJSON_GetArraySize(seq);
	const char *regex[MAX_SPLITS];

	*why = "a pre-tokenizer other than Split regexes then ByteLevel";
	if (!is(pre, "type", "Sequence") || n < 2 || n > MAX_SPLITS + 1 ||
	    !plain_byte_level(cJSON_GetArrayItem(seq, n - 1)))
		return N_PIPES;
	for (int i = 0; i < n - 1; i++) {
		const cJSON *split = cJSON_GetArrayItem(seq, i);
		const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
		if (!is(split, "type", "Split") || !is(split, "behavior", "Isolated") ||
		    !off(split, "invert") || !str(pat, "Regex"))
			return N_PIPES;
		regex[i] = str(pat, "Regex");
	}
	for (size_t r = 0; r < N_PIPES; r++) {
		size_t k = 0;
		while (k < pipes[r].n && (int)k < n - 1 && strcmp(regex[k], pipes[r].regex[k]) == 0)
			k++;
		if (k == pipes[r].n && (int)k == n - 1) {
			*why = NULL;
			return r;
		}
	}
	*why = "a pre-tokenizer regex the GGUF view does not implement (it runs Qwen2's, "
	       "Llama 3's and DeepSeek-V3's)";
	return N_PIPES;
}

/* TemplateProcessing that puts one special token before the text (Llama
 * 3's BOS): its single template [SpecialToken S, Sequence A], S's one id
 * into *bos; Llama 3's pair template [S, A, S, B] (what SpecialVocab's
 * reading of it, gguf_bpe.c, is written for). */
static bool bos_template(const cJSON *t, int64_t *bos)
{
	const cJSON *single = cJSON_GetObjectItemCaseSensitive(t, "single");
	const cJSON *pair = cJSON_GetObjectItemCaseSensitive(t, "pair");
	const cJSON *s0 =
		cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, 0), "SpecialToken");
	const cJSON *a =
		cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(single, 1), "Sequence");
	const char *id = str(s0, "id");
	static const char *const pair_shape[] = { "SpecialToken", "Sequence", "SpecialToken",
						  "Sequence" };
	static const char *const pair_ids[] = { NULL, "A", NULL, "B" };

	if (!is(t, "type", "TemplateProcessing") || cJSON_GetArraySize(single) != 2 || !id ||
	    !is(a, "id", "A") || cJSON_GetArraySize(pair) != 4)
		return false;
	for (int i = 0; i < 4; i++) {
		const cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(pair, i),
								  pair_shape[i]);
		if (!e || !is(e, "id", pair_ids[i] ? pair_ids[i] : id))
			return false;
	}
	const cJSON *sp = cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(t, "special_tokens"), id);
	const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sp, "ids");
	return cJSON_GetArraySize(ids) == 1 && ckfs_json_whole(ids->child, INT32_MAX, bos);
}

/* The post-processor's effect on the ids: none (absent, ByteLevel, which
 * only trims offsets), or a BOS put first (*bos >= 0), alone or after a
 * ByteLevel in a Sequence. */
static bool post_bos(const cJSON *post, int64_t *bos)
{
	*bos = -1;
	if (!post || cJSON_IsNull(post) || is(post, "type", "ByteLevel"))
		return true;
	if (is(post, "type", "Sequence")) {
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(post, "processors");
		if (cJSON_GetArraySize(p) != 2 || !is(p->child, "type", "ByteLevel"))
			return false;
		post = p->child->next;
	}
	return bos_template(post, bos);
}

/* An empty Sequence (DeepSeek-V3's): the text as it is. */
static bool no_normalizer(const cJSON *norm)
{
	const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
	return is(norm, "type", "Sequence") && cJSON_IsArray(list) && !list->child;
}

static const char *model_checks(const cJSON *tok)
{
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
	const cJSON *norm = cJSON_GetObjectItemCaseSensitive(tok, "normalizer");
	const cJSON *post = cJSON_GetObjectItemCaseSensitive(tok, "post_processor");
	const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(model, "ignore_merges");

	if (!is(model, "type", "BPE") || !off(model, "dropout") || !off(model, "byte_fallback") ||
	    !off(model, "fuse_unk") || (ignore && !cJSON_IsBool(ignore)) ||
	    !empty(model, "continuing_subword_prefix") || !empty(model, "end_of_word_suffix"))
		return "a model other than plain byte-level BPE";
	if (norm && !cJSON_IsNull(norm) && !is(norm, "type", "NFC") && !no_normalizer(norm))
		return "a normalizer other than NFC";
	int64_t bos;
	if (!post_bos(post, &bos))
		return "a post-processor other than ByteLevel and a template putting one token first";
	return NULL;
}

static const char *load(struct bpe *b, const cJSON *tok)
{
	const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
	const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
	const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
	int64_t rank = 0;

	if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
		return "no vocab object or merges list";
	b->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
	if (!smap_init(&b->vocab, (size_t)cJSON_GetArraySize(vocab)) ||
	    !smap_init(&b->ranks, (size_t)cJSON_GetArraySize(merges)))
		return "out of memory";
	for (const cJSON *e = vocab->child; e; e = e->next) {
		int64_t id;
		if (!ckfs_json_whole(e, INT32_MAX, &id))
			return "a vocab id that is not a whole number";
		if (!smap_put(&b->vocab, e->string, id))
			return "a token twice in the vocab";
	}
	for (const cJSON *e = merges->child; e; e = e->next, rank++) {
		const char *key = NULL;
		if (cJSON_IsString(e)) {
			const char *sp = strchr(e->valuestring, ' ');
			if (sp && sp != e->valuestring && sp[1] && !strchr(sp + 1, ' '))
				key = e->valuestring;
		} else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
			   cJSON_IsString(e->child->next) && *e->child->valuestring &&
			   *e->child->next->valuestring && !strchr(e->child->valuestring, ' ') &&
			   !strchr(e->child->next->valuestring, ' ')) {
			key = ckfs_arena_printf(&b->ar, "%s %s", e->child->valuestring,
						e->child->next->valuestring);
			if (!key)
				return "out of memory";
		}
		if (!key)
			return "a merge that is not two tokens";
		/* tokenizers refuses to load merges of or into tokens it lacks */
		size_t left = (size_t)(strchr(key, ' ') - key), all = strlen(key);
		char joined[1024];
		int64_t id;
		if (all > sizeof(joined))
			return "a merge longer than 1 KiB";
		memcpy(joined, key, left);
		memcpy(joined + left, key + left + 1, all - left - 1);
		if (!smap_get(&b->vocab, key, left, &id) ||
		    !smap_get(&b->vocab, key + left + 1, all - left - 1, &id) ||
		    !smap_get(&b->vocab, joined, all - 1, &id))
			return "a merge of or into a token not in the vocab";
		/* tokenizers keeps a repeated merge's last rank; none is expected */
		if (!smap_put(&b->ranks, key, rank))
			return "a merge listed twice";
	}
	return NULL;
}

/* Added tokens are matched in the text before anything else: none of
 * them may occur in chktxt, or the ids would not be the model's alone. */
static const char *added_checks(const cJSON *tok)
{
	const cJSON *added = cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");

	if (added && !cJSON_IsArray(added))
		return "added_tokens that is not a list";
	for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
		const char *c = str(a, "content");
		if (!c || !*c)
			return "an added token without content";
		if (strstr(chktxt, c))
			return "an added token found in the converter's check text";
	}
	return NULL;
}

/* Python's str() of the ids of chktxt: the BOS (bos >= 0), then each
 * piece of the pipeline's splits, byte-level mapped, through BPE. */
static const char *chk_ids(const struct bpe *b, size_t pipe, int64_t bos, struct ckfs_strbuf *ids)
{
	size_t n, n_piece = 1;
	uint32_t *cp = decode(chktxt, sizeof(chktxt) - 1, &n);
	size_t *len = malloc((n + 1) * sizeof(*len)), *next = malloc((n + 1) * sizeof(*next));
	const unsigned char *p = (const unsigned char *)chktxt;
	const char *why = NULL;
	bool first = true;
	char *buf = malloc(2 * sizeof(chktxt));

	if (!cp || !buf || !len || !next) {
		why = "out of memory";
		goto out;
	}
	len[0] = n;
	for (size_t s = 0; s < pipes[pipe].n; s++) {
		isolate(cp, pipes[pipe].match[s], len, &n_piece, next);
		memcpy(len, next, n_piece * sizeof(*len));
	}
	ckfs_strbuf_str(ids, "[");
	if (bos >= 0) {
		ckfs_strbuf_fmt(ids, "%lld", (long long)bos);
		first = false;
	}
	for (size_t i = 0, at = 0; i < n_piece && !why; at += len[i++]) {
		size_t bytes_len = 0;
		for (size_t k = at; k < at + len[i]; k++) {
			int bytes = cp[k] < 0x80 ? 1 : cp[k] < 0x800 ? 2 : cp[k] < 0x10000 ? 3 : 4;
			for (int x = 0; x < bytes; x++)
				bytes_len += byte_char(*p++, buf + bytes_len);
		}
		why = bpe_word(b, buf, bytes_len, ids, &first);
	}
	ckfs_strbuf_str(ids, "]");
out:
	free(cp);
	free(len);
	free(next);
	free(buf);
	return why;
}

/* The content of a tokenizer_config.json special token entry: a string
 * or an object's content. */
static const char *entry(const cJSON *e)
{
	return cJSON_IsString(e) ? e->valuestring : cJSON_IsObject(e) ? str(e, "content") : NULL;
}

/* transformers 4's LlamaTokenizerFast (DeepSeek-V3's tokenizer_class)
 * replaces tokenizer.json's post-processor with a template of its own:
 * the BOS first when add_bos_token (true when absent), the EOS last when
 * add_eos_token (refused). *bos: its id, or -1. */
static const char *llama_fast_bos(const cJSON *tok, const cJSON *tc, int64_t *bos)
{
	const cJSON *add = cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token");
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(tc, "bos_token");
	const cJSON *added = cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");
	const char *content = e ? entry(e) : "<s>"; /* its default */

	*bos = -1;
	const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(tc, "add_prefix_space");
	if (prefix && !cJSON_IsNull(prefix)) /* even false */
		return "an add_prefix_space, with which LlamaTokenizerFast rebuilds the tokenizer "
		       "from a SentencePiece model";
	if (!off(tc, "add_eos_token"))
		return "an add_eos_token, an EOS after the text";
	if (add && !cJSON_IsBool(add) && !cJSON_IsNull(add))
		return "an add_bos_token that is not true or false";
	if (add && !cJSON_IsTrue(add))
		return NULL;
	if (!content)
		return "add_bos_token without a bos_token";
	for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a; a = a->next)
		if (str(a, "content") && strcmp(str(a, "content"), content) == 0 &&
		    ckfs_json_whole(cJSON_GetObjectItemCaseSensitive(a, "id"), INT32_MAX, bos))
			return NULL;
	return "a bos_token that is not one of tokenizer.json's added tokens";
}

enum ckfs_code gguf_bpe_pre(const char *path, const cJSON *tok, const cJSON *tc, const char **pre,
			    struct gguf_bpe_seen *seen, struct ckfs_error *err)
{
	int64_t bos = -1;
	struct bpe b = { 0 };
	struct ckfs_strbuf ids = { 0 };
	const char *why = model_checks(tok), *cls = tc ? str(tc, "tokenizer_class") : NULL;
	size_t r = N_PIPES;
	char hex[65];

	ckfs_arena_init(&b.ar);
	*pre = NULL;
	if (!why)
		r = pipeline(cJSON_GetObjectItemCaseSensitive(tok, "pre_tokenizer"), &why);
	if (!why && cls && strcmp(cls, "LlamaTokenizerFast") == 0)
		why = llama_fast_bos(tok, tc, &bos);
	else if (!why)
		post_bos(cJSON_GetObjectItemCaseSensitive(tok, "post_processor"), &bos);
	if (!why)
		why = added_checks(tok);
	if (!why)
		why = load(&b, tok);
	if (!why)
		why = chk_ids(&b, r, bos, &ids);
	if (!why && (ids.failed || !ids.p))
		why = "out of memory";
	if (!why) {
		gguf_sha256_hex(ids.p, ids.len, hex);
		for (size_t i = sizeof(known) / sizeof(known[0]); i-- > 0 && !*pre;)
			if (strcmp(known[i].hash, hex) == 0)
				*pre = known[i].name;
		if (!*pre)
			why = "a pre-tokenizer the converter does not recognize (its check text hashes "
			      "to none of its table)";
	}
	if (!why) {
		const cJSON *norm = cJSON_GetObjectItemCaseSensitive(tok, "normalizer");
		*seen = (struct gguf_bpe_seen){
			.qwen2_regex = pipes[r].qwen2,
			.nfc = is(norm, "type", "NFC"),
			.bos = bos >= 0,
			.ignore_merges = b.ignore_merges,
		};
	}
	smap_free(&b.vocab);
	smap_free(&b.ranks);
	ckfs_arena_release(&b.ar);
	free(ids.p);
	if (why)
		return ckfs_fail(err, CKFS_E_UNSUPPORTED,
				 "'%s': a BPE tokenizer the GGUF view does not "
				 "reproduce: %s",
				 path, why);
	return CKFS_OK;
}
