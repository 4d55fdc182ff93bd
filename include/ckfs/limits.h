/* SPDX-License-Identifier: MIT */
/*
 * Every hard limit ckfs applies to untrusted input, with the reason for each
 * number. A checkpoint exceeding one is refused with CKFS_E_LIMIT naming the
 * file; nothing is ever sized from input before it is checked here.
 */
#ifndef CKFS_LIMITS_H
#define CKFS_LIMITS_H

/* torch tensors have at most 64 dims (c10 kMaxTensorDims is larger, but no
 * model weight comes near); fixed-size shape arrays keep plans allocation-free. */
#define CKFS_MAX_DIMS 16

/* Zip entries per archive: a torch.save of a 70B state dict has ~1,000
 * storages; DCP files can hold more. 4M entries bounds the directory at
 * ~200 MiB of central directory. */
#define CKFS_MAX_ZIP_ENTRIES (4u * 1024 * 1024)

/* Zip record names: torch writes "<folder>/data/<key>"; 64 KiB is the
 * format's own u16 ceiling. */
#define CKFS_MAX_ZIP_NAME 65535u

/* Bytes of zip central directory, which is read into memory whole: 4M
 * entries at ~128 bytes each (46-byte fixed part, a torch name such as
 * "archive/data/123456", a 28-byte zip64 block past 4 GiB). */
#define CKFS_MAX_ZIP_CD_BYTES (512ull * 1024 * 1024)

/* Bytes of a metadata record read into memory (data.pkl, version, DCP
 * .metadata). A 70B state-dict pickle is a few hundred KiB; 1 GiB leaves
 * room for huge MoE checkpoints while stopping decompression bombs. */
#define CKFS_MAX_METADATA_BYTES (1024ull * 1024 * 1024)

/* Pickle VM: stack depth, mark depth, memo size and container sizes. The
 * largest real pickle (a 70B DTensor state dict) needs a few hundred
 * thousand memo slots; nesting never exceeds ~20. */
#define CKFS_MAX_PICKLE_STACK (1u << 20)
#define CKFS_MAX_PICKLE_MARKS 4096u
#define CKFS_MAX_PICKLE_MEMO (1u << 24)
#define CKFS_MAX_PICKLE_NESTING 256u
/* Nodes allocated by one pickle: bounds memory at ~100 bytes per node. */
#define CKFS_MAX_PICKLE_NODES (1u << 25)
/* Container slots (tuple/list/set items, dict keys and values) over all
 * containers of one pickle. A memo reference or DUP is one input byte but
 * fills an 8-byte slot without allocating a node, so slots need their own
 * bound; real pickles use about as many slots as nodes. */
#define CKFS_MAX_PICKLE_ITEMS (1u << 26)
/* Bytes that evaluated calls (_codecs.encode, bytearray, getattr names) may
 * synthesize, as a multiple of the pickle's size (plus 64 KiB): a memo
 * reference lets a few bytes re-run a call on a large string. Real pickles
 * stay below 1x since each such call has its own operand in the stream. */
#define CKFS_MAX_PICKLE_EXPANSION 4u
/* Nodes a full recursive walk of one pickle's tree may visit, counting a
 * shared object once per use. Memo references make a DAG whose expansion
 * can double per two input bytes; real pickles expand to about their node
 * count (a 70B state dict: ~100k), so 1G only stops exponential ones. */
#define CKFS_MAX_PICKLE_TREE (1u << 30)

/* Tensors per state dict and per output model (DeepSeek-V3 has ~92k). */
#define CKFS_MAX_TENSORS (1u << 22)

/* Rank files of one checkpoint (largest public jobs use tens of thousands
 * of GPUs; FSDP world sizes in verl stay far below). */
#define CKFS_MAX_RANKS 65536u

/* Tensor names (Hugging Face names are < 200 bytes). */
#define CKFS_MAX_NAME 4096u

/* JSON side files parsed by ckfs (config.json, fsdp_config.json). */
#define CKFS_MAX_JSON_BYTES (64u * 1024 * 1024)

/* Bytes of one served tensor and of all weights together: 4 EiB keeps every
 * file size, offset and sum far inside off_t (2^63 - 1) with room for the
 * header; the largest models are ~10^6 times smaller. A zero-stride view
 * (torch's expand) can declare any size in a few bytes of pickle. */
#define CKFS_MAX_SERVED_BYTES (1ull << 62)

/* safetensors header: the reference loader refuses more (MAX_HEADER_SIZE). */
#define CKFS_MAX_ST_HEADER 100000000ull

#endif
