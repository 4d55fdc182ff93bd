/* SPDX-License-Identifier: MIT */
/*
 * Differential fuzz target for rank files read by rank 0's template
 * (ckfs_torch_open with .like): the input is a whole torch.save file, read
 * through its pickle and by the template of a real rank 0 (torch 2.13
 * FSDP2, world size 4; the seeds are its ranks), with the mesh
 * coordinate its first DTensor declares, so that the template is taken
 * whenever the bytes allow. Aborts unless both ways give equal entries
 * or the same refusal with the same message (tests/fuzz/like_diff.h).
 */
#include <stdlib.h>

#include "fuzz_common.h"
#include "like_diff.h"

#define RANK0 CKFS_FIXTURES "/matrix/torch-2.13.0/fsdp2/model_world_size_4_rank_0.pt"

static struct ckfs_torch_like *template_once(void)
{
	static struct ckfs_torch_like *like;
	static bool tried;
	struct ckfs_torch_file t;
	struct ckfs_error err;

	if (tried)
		return like;
	tried = true;
	int fd = open(RANK0, O_RDONLY | O_CLOEXEC);
	const struct ckfs_torch_open_opts o = { .label = RANK0, .derive_locals = true,
						.as_template = true };
	if (fd < 0 || ckfs_torch_open(&t, ckfs_file_of_fd(fd), &o, &err) != CKFS_OK)
		abort();
	if (ckfs_torch_like_new(&t, &like, &err) != CKFS_OK || !like)
		abort();
	ckfs_torch_close(&t);
	close(fd);
	return like;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct ckfs_torch_like *like = template_once();
	struct ckfs_torch_file tf;
	struct ckfs_error err;
	int64_t c[CKFS_MAX_DIMS];
	const int64_t *coord = NULL;
	char why[2200];
	bool taken;
	int fd = fuzz_memfd(data, size);

	if (fd < 0)
		return 0;
	const struct ckfs_torch_open_opts o = { .label = "fuzz" };
	if (ckfs_torch_open(&tf, ckfs_file_of_fd(fd), &o, &err) == CKFS_OK) {
		for (size_t i = 0; !coord && i < tf.n_entries; i++)
			if (tf.entries[i].kind == CKFS_ENTRY_DTENSOR && tf.entries[i].dtensor->have_coord)
				coord = memcpy(c, tf.entries[i].dtensor->coord, sizeof(c));
		ckfs_torch_close(&tf);
	}
	if (!like_agrees(ckfs_file_of_fd(fd), "fuzz", like, coord, &taken, why, sizeof(why))) {
		fprintf(stderr, "fuzz_like: the template and the pickle differ: %s\n", why);
		abort();
	}
	close(fd);
	return 0;
}
