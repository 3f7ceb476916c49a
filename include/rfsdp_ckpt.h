/* rfsdp checkpoint reader: any tensor of a checkpoint, whole, from its rank files.
 *
 * A checkpoint directory (docs/checkpoint.md) holds each tensor as RaggedShard
 * ranges spread over the rank files of the run that saved it, at any world size;
 * reading a tensor gathers its ranges in order, each checksum chunk verified, so
 * the result does not depend on the W it was saved at. Master weights and the
 * optimizer's states ("NAME.adamw.m", ...) are tensors alike.
 *
 * Local (no MPI, no runtime context): for tools, notebooks and the Python module
 * (python/rfsdp). Functions return 0, or -1 with the message (naming the file and
 * the problem) in rf_checkpoint_error(). The handle owns its descriptors; strings
 * it returns are borrowed until rf_checkpoint_close. */
#ifndef RFSDP_CKPT_H
#define RFSDP_CKPT_H

#include <stdint.h>

#include "rfsdp_types.h"

#define RF_CHECKPOINT_MAX_DIMS 8
/* The file a complete checkpoint directory holds, written last: a directory without it is not a
 * checkpoint (an unfinished save, or a folder of checkpoints such as a --ckpt-dir). */
#define RF_CHECKPOINT_MARKER "COMPLETE"
/* The key of the "extra" object under which a run saved from tensor views lists its optimizer
 * states, as [{"suffix": ".adamw.m", "dtype": "f32"}, ...]. */
#define RF_CHECKPOINT_STATES_KEY "rfsdp_states"

struct rf_checkpoint;

/* Opens a complete checkpoint (its COMPLETE marker, metadata and rank files checked). */
int rf_checkpoint_open(struct rf_checkpoint **out, const char *dir);
void rf_checkpoint_close(struct rf_checkpoint *c); /* NULL allowed */
/* The optimizer steps the checkpoint holds, and the world size that saved it. */
int64_t rf_checkpoint_step(const struct rf_checkpoint *c);
int rf_checkpoint_world(const struct rf_checkpoint *c);
/* The "extra" JSON object the run saved (its program's state), compact. */
const char *rf_checkpoint_extra_json(const struct rf_checkpoint *c);
int rf_checkpoint_tensor_count(const struct rf_checkpoint *c);
/* Tensor i (0 <= i < count): its name (NULL when i is out of range). */
const char *rf_checkpoint_tensor_name(const struct rf_checkpoint *c, int i);
/* The dtype and shape (ndim <= RF_CHECKPOINT_MAX_DIMS) of tensor `name`. */
int rf_checkpoint_tensor_info(const struct rf_checkpoint *c, const char *name, enum rf_dtype *dtype,
                              int *ndim, int64_t *shape);
/* The whole tensor `name` into `out` (its numel elements of its own dtype, row-major). */
int rf_checkpoint_read(struct rf_checkpoint *c, const char *name, void *out);
/* The format version (docs/checkpoint.md) and the checksum chunk in bytes; -1 for a NULL handle. */
int rf_checkpoint_format_version(const struct rf_checkpoint *c);
int64_t rf_checkpoint_chunk_bytes(const struct rf_checkpoint *c);
/* The number of ranges (pieces in the rank files) that hold tensor `name`, or -1. */
int rf_checkpoint_tensor_ranges(const struct rf_checkpoint *c, const char *name);
/* 1 when tensor `name` is a parameter, 0 when it is an optimizer state (a parameter's name plus
 * a suffix listed under RF_CHECKPOINT_STATES_KEY), or -1. */
int rf_checkpoint_tensor_is_param(const struct rf_checkpoint *c, const char *name);
/* Reads every data byte of every rank file and checks every checksum: 0, or -1 naming the file
 * and the chunk. *bytes (may be NULL) gets the data bytes read through c since it was opened. */
int rf_checkpoint_verify(struct rf_checkpoint *c, uint64_t *bytes);

/* Writes the parameters (not the optimizer states) of the checkpoint in `dir` to the safetensors
 * file `out` under their saved names, as F32 or BF16 (`dtype`), checksums verified, the file
 * appearing atomically when complete (__metadata__: "format": "pt", "rfsdp_step"). The n_fp8
 * tensors of `fp8_names` (NULL when n_fp8 is 0; rf_train_model_fp8_names gives a built-in
 * model's) are written in DeepSeek-V3's FP8 format instead: e4m3 codes under the tensor's name
 * (F8_E4M3) and NAME + "_scale_inv" (F32, one scale per 128x128 tile of each matrix, value = code x
 * scale_inv; fp8_pow2: scales rounded up to powers of two), "rfsdp_fp8" added to __metadata__.
 * Local; 0, or -1 with the file untouched and the message naming the checkpoint and the problem
 * (a name the checkpoint has no parameter of, a tensor not 2-D or 3-D, a NaN or infinity). */
int rf_checkpoint_export(const char *dir, const char *out, enum rf_dtype dtype, const char *const *fp8_names,
                         int n_fp8, int fp8_pow2);
/* The last failure's message (one per process, valid until the next failure). */
const char *rf_checkpoint_error(void);

#endif
