/* src/ckpt: the file layer of sharded checkpoints (docs/checkpoint.md).
 *
 * A checkpoint is a directory:
 *   rank-RRRRR.bin   one per rank: a 64-byte header, then that rank's flat element
 *                    range of every saved tensor (64-byte aligned, raw little-endian)
 *   rank-RRRRR.json  one per rank: the index of its .bin (ranges, offsets, checksums)
 *   meta.json        written by rank 0 once every rank finished: every tensor (name,
 *                    dtype, global shape) with, per rank file, the flat range
 *                    [begin, end) it holds, its byte offset, its rectangular boxes and
 *                    an XXH3 checksum per chunk of `chunk_bytes`; the format version,
 *                    the step and an opaque "extra" object (RNG, data position)
 *   COMPLETE         written last by rank 0: the step, the world and meta.json's XXH3
 * Every file is written under a temporary name, fsynced, renamed and its directory
 * fsynced (rf_file_writer); rank files with O_DIRECT through a bounce buffer. A directory without COMPLETE is
 * not a checkpoint.
 *
 * Loading reads any flat range of any tensor from whichever rank files hold it
 * (resharding: the reader's ranks and ranges need not match the writer's), reading
 * only the checksum chunks that overlap the range and verifying each one. Nothing
 * is ever written by the reader. This layer knows nothing of MPI: the caller gives
 * a callback that acts as a barrier and combines the ranks' statuses. */
#ifndef RF_CKPT_H
#define RF_CKPT_H

#include <stdint.h>

#include "core/core.h"
#include "device/device.h"
#include "rfsdp_ckpt.h"  /* RF_CHECKPOINT_MARKER, RF_CHECKPOINT_STATES_KEY */
#include "rfsdp_types.h" /* struct rf_tensor_view */

#define RF_CKPT_FORMAT "rfsdp-checkpoint"
#define RF_CKPT_VERSION 1
#define RF_CKPT_DEFAULT_CHUNK_BYTES (1 << 20)
#define RF_CKPT_RANK_MAGIC "RFCKRANK"
#define RF_CKPT_RANK_HEADER_BYTES 64
#define RF_CKPT_ALIGN 64
#define RF_CKPT_MARKER RF_CHECKPOINT_MARKER /* include/rfsdp_ckpt.h */
#define RF_CKPT_META "meta.json"

/* ---- save ----------------------------------------------------------------- */

/* This rank's part of one tensor. Borrowed strings and data. */
struct rf_ckpt_piece {
  const char *name;
  enum rf_dtype dtype;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
  int64_t begin, end; /* the flat element range held here; begin == end: nothing */
  const void *data;   /* (end - begin) elements of dtype */
};

/* Called by every rank with its status (0 or -1); must act as a barrier and return
 * 0 only when every rank passed 0 (MPI: an MPI_Allreduce of the status with MPI_MIN). */
typedef int (*rf_ckpt_agree_fn)(void *ctx, int status);

/* Everything a save needs. Borrowed. */
struct rf_ckpt_save_args {
  const char *dir; /* created if missing; must not hold a complete checkpoint */
  int rank, world;
  int64_t step;
  const char *extra_json; /* rank 0's: a JSON object stored verbatim as "extra" (NULL: {}) */
  int64_t chunk_bytes;    /* checksum granularity; 0: RF_CKPT_DEFAULT_CHUNK_BYTES */
  int n_pieces;
  const struct rf_ckpt_piece *pieces;
  rf_ckpt_agree_fn agree;
  void *agree_ctx;
  /* the rank file's O_DIRECT bounce buffer (RF_FILE_DIRECT_ALIGN-aligned,
   * bounce_bytes a multiple of it; borrowed); NULL: the process's own
   * (RF_CKPT_BOUNCE_BYTES, allocated at the first save and kept) */
  void *bounce;
  size_t bounce_bytes;
  /* where the pieces' data live: NULL: host memory, read in place; else memory of `device`
   * (borrowed), which the host never reads: each piece goes to the file through host staging,
   * RF_CKPT_STAGING_BYTES at a time (a whole number of checksum chunks), each part one
   * device-to-host copy on `stream` (rf_device_copy: landed when it returns), checksummed and
   * written from the staging. The file's bytes are the same either way. */
  struct rf_device *device;
  struct rf_device_stream *stream;
  size_t staging_bytes; /* 0: RF_CKPT_STAGING_BYTES (tests: smaller, to stage in several parts) */
};

/* The host staging of a save or a load of device memory, by default (a save rounds it down to
 * whole checksum chunks, at least one). */
#define RF_CKPT_STAGING_BYTES (4u << 20)

/* The bounce buffer the rank file is written through with O_DIRECT. */
#define RF_CKPT_BOUNCE_BYTES (4u << 20)

/* The whole save, on every rank: save_rank, agree, save_finish on rank 0, agree.
 * Returns 0 on every rank when the checkpoint is complete, -1 on every rank when it
 * is not (the directory then holds no COMPLETE marker; a previous checkpoint in
 * another directory is never touched). */
int rf_ckpt_save(const struct rf_ckpt_save_args *args);
/* Step 1, each rank: writes rank-RRRRR.bin then rank-RRRRR.json. */
int rf_ckpt_save_rank(const struct rf_ckpt_save_args *args);
/* Step 2, rank 0 once every rank's step 1 succeeded: checks that the ranks' ranges
 * tile every tensor, writes meta.json, then COMPLETE. */
int rf_ckpt_save_finish(const char *dir, int world, int64_t step, const char *extra_json);

/* ---- load ----------------------------------------------------------------- */

/* One rank file's range of a tensor. Owns `xxh3`. */
struct rf_ckpt_range {
  int rank;
  int64_t begin, end; /* elements */
  uint64_t offset;    /* bytes, in rank-RRRRR.bin */
  int64_t n_chunks;
  uint64_t *xxh3; /* n_chunks checksums of chunk_bytes each (the last may be shorter) */
};

/* A tensor of the checkpoint. Owns name and ranges (sorted by begin, tiling [0, numel)). */
struct rf_ckpt_tensor {
  char *name;
  enum rf_dtype dtype;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
  int64_t numel;
  int n_ranges;
  struct rf_ckpt_range *ranges;
};

/* An open checkpoint: the parsed metadata and one read-only descriptor per rank
 * file. Owns everything; rf_ckpt_close releases it. */
struct rf_ckpt {
  char dir[RF_FILE_PATH_MAX];
  int version;
  int world;
  int64_t step;
  int64_t chunk_bytes;
  char *extra_json; /* the "extra" object, printed compactly */
  int n_tensors;
  struct rf_ckpt_tensor *tensors;
  int *fds;            /* world descriptors */
  uint8_t *chunk_buf;  /* chunk_bytes of scratch for verified reads */
  uint64_t bytes_read; /* data bytes read by rf_ckpt_read/verify since open */
  int finite_only;     /* 1: rf_ckpt_read refuses NaN and inf (set by resume and export) */
};

/* Opens a complete checkpoint: the marker, the metadata (its version and checksum),
 * and every rank file (present, of the size the metadata says, with a header that
 * matches). Fails naming the file and the problem; nothing is left open. */
int rf_ckpt_open(struct rf_ckpt *ck, const char *dir);
void rf_ckpt_close(struct rf_ckpt *ck);
/* NULL when the checkpoint has no tensor of that name. Borrowed. */
const struct rf_ckpt_tensor *rf_ckpt_find(const struct rf_ckpt *ck, const char *name);
/* Reads elements [begin, end) of tensor `name` into `out`, checking that the
 * checkpoint's tensor has this dtype and shape (else: another model). Reads only
 * the checksum chunks that overlap the range, and verifies each; with ck->finite_only,
 * refuses a NaN or infinity in a float tensor, naming the rank file and the element. */
int rf_ckpt_read(struct rf_ckpt *ck, const char *name, enum rf_dtype dtype, int ndim, const int64_t *shape,
                 int64_t begin, int64_t end, void *out);
/* Verifies every checksum of every range (reads all data once). */
int rf_ckpt_verify(struct rf_ckpt *ck);

/* ---- shared by save and load ------------------------------------------------ */

struct cJSON;

/* "<dir>/rank-RRRRR.<ext>" */
void rf_ckpt_rank_path(char *out, size_t cap, const char *dir, int rank, const char *ext);
/* An integer field in [lo, hi] of a JSON object; `file` names the file in the message. */
int rf_ckpt_json_i64(const struct cJSON *obj, const char *key, int64_t lo, int64_t hi, const char *file,
                     int64_t *out);
/* name, dtype and shape of a tensor object into t (t->name newly allocated). */
int rf_ckpt_json_tensor_head(const struct cJSON *obj, const char *file, struct rf_ckpt_tensor *t);
void rf_ckpt_json_add_tensor_head(struct cJSON *obj, const char *name, enum rf_dtype dtype, int ndim,
                                  const int64_t *shape);
/* begin, end, offset and the chunk checksums of a range object (r->xxh3 newly
 * allocated; r->rank is not touched); checks the checksum count against the size. */
int rf_ckpt_json_range(const struct cJSON *obj, const char *file, const struct rf_ckpt_tensor *t,
                       int64_t chunk_bytes, struct rf_ckpt_range *r);
void rf_ckpt_json_add_range(struct cJSON *obj, const struct rf_ckpt_range *r);
/* Chunks of `chunk_bytes` covering `bytes` bytes. */
static inline int64_t rf_ckpt_chunks(int64_t bytes, int64_t chunk_bytes) {
  return rf_ceil_div(bytes, chunk_bytes);
}
/* Sorts t's ranges by begin and checks that they tile [0, numel) exactly. */
int rf_ckpt_tensor_check_ranges(struct rf_ckpt_tensor *t, const char *file);
void rf_ckpt_tensor_free(struct rf_ckpt_tensor *t);

/* ---- tensor views: the runtime's shards and optimizer state (state.c) ------------
 *
 * A view (struct rf_tensor_view, include/rfsdp_types.h) is this rank's piece [begin, end)
 * of one tensor; its master weights are saved as the tensor `view->name` (f32, the
 * view's shape, this rank's range). Each optimizer state is saved as the tensor
 * `view->name` + `suffix`, by the rule of its descriptor:
 *   piece == NULL: addressed like the master weights: the piece is
 *                  slab + shard_offset elements of `dtype`, the same range, the
 *                  same shape (Adam's m and v, 8-bit codes of one byte per element)
 *   piece != NULL: the callback gives the state's own element count for the whole
 *                  tensor, this rank's range of it and where it lives; saved as a
 *                  1-D tensor [numel] (per-block scales: rf_ckpt_state_blocks)
 * Loading reads exactly this rank's range of every view and state, whatever the
 * saver's world and split were (resharding). */

/* One view's piece of one state on this rank. `data` is borrowed. */
struct rf_ckpt_state_piece {
  int64_t numel;      /* the state's elements for the whole tensor */
  int64_t begin, end; /* this rank's range of them */
  void *data;         /* end - begin elements of the state's dtype */
};

/* Fills `out` for view `index` (data: where this rank keeps the piece). */
typedef void (*rf_ckpt_state_piece_fn)(void *ctx, const struct rf_tensor_view *view, int index,
                                       struct rf_ckpt_state_piece *out);

/* An optimizer state saved next to the master weights. Borrowed. */
struct rf_ckpt_state_desc {
  const char *suffix; /* e.g. ".adam_m"; non-empty, unique */
  enum rf_dtype dtype;
  void *slab;                   /* piece == NULL: this rank's state slab (same offsets as the master) */
  rf_ckpt_state_piece_fn piece; /* or: where each view's piece is */
  void *ctx;                    /* for piece */
};

/* One state element per block of `block` elements of the tensor (block-wise
 * scales): numel = ceil(view->numel / block), this rank's blocks
 * [begin / block, ceil(end / block)) (whole blocks when begin is a multiple of
 * block, which the layout guarantees for block-wise optimizers). Sets numel,
 * begin and end; the caller sets data. */
void rf_ckpt_state_blocks(const struct rf_tensor_view *view, int64_t block, struct rf_ckpt_state_piece *out);

/* A save or a load of views. Borrowed. */
struct rf_ckpt_views_args {
  const char *dir;
  int rank, world;        /* save: this rank and the world of the saving run */
  int64_t step;           /* save */
  const char *extra_json; /* save: a JSON object (RNG, data position); NULL: {} */
  int64_t chunk_bytes;    /* save: checksum granularity; 0: RF_CKPT_VIEWS_CHUNK_BYTES */
  int n_views;
  const struct rf_tensor_view *views;
  int n_states;
  const struct rf_ckpt_state_desc *states;
  rf_ckpt_agree_fn agree; /* the barrier that combines statuses (see rf_ckpt_save) */
  void *agree_ctx;
  void *bounce; /* save: as rf_ckpt_save_args' (NULL: the process's own) */
  size_t bounce_bytes;
  /* where the views' master weights and the states' pieces live: NULL: host memory; else
   * memory of `device` (borrowed): a save stages it as rf_ckpt_save_args says, a load reads the
   * file into host staging and writes it with host-to-device copies on `stream` (the stream
   * synchronized before it returns) */
  struct rf_device *device;
  struct rf_device_stream *stream;
  size_t staging_bytes; /* 0: RF_CKPT_STAGING_BYTES */
};

/* The checksum chunk of rf_ckpt_save_views: a resharded load reads at most two
 * extra chunks per overlapping saved range (one model has hundreds of pieces). */
#define RF_CKPT_VIEWS_CHUNK_BYTES (256 << 10)

/* The key added to "extra" by rf_ckpt_save_views: the states saved, as
 * [{"suffix": ".adam_m", "dtype": "f32"}, ...]. */
#define RF_CKPT_STATES_KEY RF_CHECKPOINT_STATES_KEY

/* Every rank: saves its pieces of the master weights and of every state through
 * rf_ckpt_save. Returns 0 on every rank, or -1 on every rank. */
int rf_ckpt_save_views(const struct rf_ckpt_views_args *a);
/* Every rank: opens the checkpoint, checks that it holds every view (f32, the same
 * shape) and every state (dtype and size) and, when it was saved by
 * rf_ckpt_save_views, no other parameter tensor (else: a checkpoint of another
 * model); agrees; then reads this rank's range of each into the views' master
 * weights and the states' pieces; agrees. Returns 0 on every rank, or -1 on every
 * rank (a failure in the checks leaves memory untouched; a failure while reading,
 * e.g. a corrupted chunk, leaves the pieces partly overwritten). Nothing on disk
 * is changed. *step and *extra_json (caller frees; may be NULL) get the saved step
 * and "extra" object. */
int rf_ckpt_load_views(const struct rf_ckpt_views_args *a, int64_t *step, char **extra_json);

/* Whether tensor `t` of an open checkpoint is a parameter (not a state saved by
 * rf_ckpt_save_views: its name is a parameter's name + a listed suffix). */
int rf_ckpt_is_param(const struct rf_ckpt *ck, const struct rf_ckpt_tensor *t);

/* ---- safetensors export and import (export.c) ------------------------------------ */

/* Writes the checkpoint's parameters (not the optimizer states) to a safetensors
 * file under their saved names, as F32 or BF16 (dtype RF_DTYPE_F32 or
 * RF_DTYPE_BF16), tensor by tensor in pieces of at most 256 K elements (never a whole
 * tensor in memory), checksums verified; the file appears atomically when
 * complete. __metadata__: {"format": "pt", "rfsdp_step": "<step>"}. */
int rf_ckpt_export_safetensors(const char *ckpt_dir, const char *out_path, enum rf_dtype dtype);
/* The tensors an export writes in FP8, DeepSeek-V3's format: each named parameter
 * (a matrix [rows, cols], or fused matrices [E, rows, cols]) becomes its e4m3 codes
 * under its own name (F8_E4M3) and NAME + "_scale_inv" (F32: one scale per 128x128
 * tile of each matrix, [ceil(rows/128), ceil(cols/128)] or [E, ...]), the value being
 * code * scale_inv. Scales are amax / 448, powers of two with pow2 (rf_fp8_scale). */
struct rf_ckpt_export_fp8 {
  int n;
  const char *const *names; /* borrowed */
  int pow2;
};
/* rf_ckpt_export_safetensors with the tensors fp8 names quantized (each matrix
 * read whole and quantized by rf_fp8_quantize); the others as there. Refused, the
 * file untouched: a name the checkpoint has no parameter of, a tensor not 2-D or
 * 3-D, a NaN or infinity (the message names the tensor and the element).
 * __metadata__ adds "rfsdp_fp8". */
int rf_ckpt_export_safetensors_fp8(const char *ckpt_dir, const char *out_path, enum rf_dtype dtype,
                                   const struct rf_ckpt_export_fp8 *fp8);
/* Fills this rank's range of every view's master weights from a safetensors file
 * (tensors by name, same shape, F32/BF16/F16 converted to f32), or from the shards
 * of a Hugging Face index when `path` ends in ".json"
 * (model.safetensors.index.json: {"weight_map": {tensor: file}}, files next to
 * it). Checks every view before reading any; a NaN or infinity in this rank's range
 * is refused naming the file, the tensor, the element and the value (the views
 * already read hold the file's values then). Local to the rank: callers agree on the
 * status. */
int rf_ckpt_import_views(const char *path, const struct rf_tensor_view *views, int n);
/* The same into views whose master weights are memory of `device` (borrowed; NULL: host
 * memory, rf_ckpt_import_views): each view's range is read into host staging, checked there and
 * written with one host-to-device copy on `stream` (synchronized before it returns). */
int rf_ckpt_import_views_on(const char *path, const struct rf_tensor_view *views, int n,
                            struct rf_device *device, struct rf_device_stream *stream);

#endif
