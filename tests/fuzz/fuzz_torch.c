/* SPDX-License-Identifier: MIT */
/* Fuzz target: a whole torch.save file: zip, pickle and the tensor
 * decoders (DTensor, ShardedTensor, views and their bounds). */
#include "ckfs/torch.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckfs_torch_file tf;
	struct ckfs_error err;
	int fd = fuzz_memfd(data, size);

	if (fd < 0)
		return 0;
	ckfs_error_clear(&err);
	const struct ckfs_torch_open_opts o = { .label = "fuzz" };
	if (ckfs_torch_open(&tf, ckfs_file_of_fd(fd), &o, &err) == CKFS_OK)
		ckfs_torch_close(&tf);
	close(fd);
	return 0;
}
