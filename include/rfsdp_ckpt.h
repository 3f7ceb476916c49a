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
/* The last failure's message (one per process, valid until the next failure). */
const char *rf_checkpoint_error(void);

#endif
