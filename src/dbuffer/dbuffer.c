/* Gather and reduce over a unit's DBuffer. The planned and flat layouts move data
 * in place: the only pass over the data outside the collectives is the write of
 * this rank's master shard into its range of the slot (own-shard bytes). The fsdp2
 * layout adds the copies PyTorch FSDP2 makes (copied bytes). Every byte moved here
 * goes through src/device's counted helpers (rf_move_*) on the DBuffer's device. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dbuffer/dbuffer.h"

static inline uint8_t *rf_dbuffer_at(void *base, int64_t elems, size_t size) {
  return (uint8_t *)base + (size_t)elems * size;
}

/* FP8 tensor x's tile scales in the param slot. */
static inline float *rf_dbuffer_scales(void *slot, const struct rf_dbuffer_tensor *x) {
  return (float *)(void *)rf_dbuffer_at(slot, x->scale_byte, 1);
}

size_t rf_dbuffer_param_slot_bytes(const struct rf_dbuffer *db) { return db->slot_bytes; }

/* The grad slot: f32 views, then the staging buffer (reduce dtype) when one is
 * needed, then the receive scratch (this rank's shard, f32-sized). */
static int rf_dbuffer_needs_staging(const struct rf_dbuffer *db, enum rf_dtype reduce_dtype) {
  return db->layout == RF_LAYOUT_FSDP2 || reduce_dtype != RF_DTYPE_F32;
}

static size_t rf_dbuffer_staging_offset(const struct rf_dbuffer *db) {
  return (size_t)rf_round_up(db->gview_elems * (int64_t)sizeof(float), 64);
}

static size_t rf_dbuffer_scratch_offset(const struct rf_dbuffer *db, enum rf_dtype reduce_dtype) {
  size_t off = rf_dbuffer_staging_offset(db);
  if (rf_dbuffer_needs_staging(db, reduce_dtype))
    off += (size_t)rf_round_up(db->staging_elems * (int64_t)rf_dtype_size(reduce_dtype), 64);
  return off;
}

size_t rf_dbuffer_grad_slot_bytes(const struct rf_dbuffer *db, enum rf_dtype reduce_dtype) {
  return rf_dbuffer_scratch_offset(db, reduce_dtype) + (size_t)db->shard_elems * sizeof(float);
}

/* A band's tc scales (device memory) set to NaN: copied from the host's NaNs (the copy takes its
 * source at the call). */
static void rf_dbuffer_nan_band(const struct rf_dbuffer *db, float *scales, int64_t tc,
                                struct rf_device_stream *stream) {
  rf_device_copy(db->dev, scales, db->host_nans, (size_t)tc * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE,
                 stream);
}

/* FP8 buffer b: this rank's range of every FP8 tensor in it quantized into the
 * slot (codes at its view, scales at its tiles), one band at a time (128 rows, or
 * what is left of an expert's matrix); a band holding NaN or an infinity gets NaN
 * scales, which the gather takes to every rank. */
static void rf_dbuffer_quantize_own(const struct rf_dbuffer *db, int b, const float *shard, void *slot,
                                    int pow2, struct rf_device_stream *stream) {
  int r = db->rank;
  for (int t = 0; t < db->n_tensors; t++) {
    const struct rf_dbuffer_tensor *x = &db->tensors[t];
    if (x->buffer != b || x->starts[r + 1] == x->starts[r]) continue;
    int64_t tc = rf_ceil_div(x->cols, RF_FP8_TILE), per = x->rows * x->cols;
    float *scales = rf_dbuffer_scales(slot, x);
    for (int64_t e = x->starts[r], k = x->scale_starts[r], rows; e < x->starts[r + 1];
         e += rows * x->cols, k += tc) {
      rows = rf_min_i64(RF_FP8_TILE, x->rows - e % per / x->cols);
      struct rf_fp8_grid g = {rows, x->cols, RF_FP8_TILE, RF_FP8_TILE};
      if (rf_device_fp8_quantize(db->dev, &g, shard + x->shard_off + (e - x->starts[r]), pow2, x->name,
                                 rf_dbuffer_at(slot, x->view_byte + e, 1), scales + k, stream) != 0)
        rf_dbuffer_nan_band(db, scales + k, tc, stream);
    }
    int64_t own = x->starts[r + 1] - x->starts[r], tiles = x->scale_starts[r + 1] - x->scale_starts[r];
    RF_DEVICE_COUNT(db->dev, bytes_own_shard, (uint64_t)(own + tiles * (int64_t)sizeof(float)));
  }
}

void rf_dbuffer_gather_start(const struct rf_dbuffer *db, const struct rf_comm *comm, const float *shard,
                             void *slot, enum rf_dtype param_dtype, int pow2, struct rf_comm_req *reqs,
                             struct rf_device_stream *stream) {
  int r = db->rank;
  for (int b = 0; b < db->n_buffers; b++) {
    const struct rf_dbuffer_buf *buf = &db->bufs[b];
    enum rf_dtype dt = buf->fp8 ? RF_DTYPE_FP8E4M3 : param_dtype;
    size_t ps = rf_dtype_size(dt);
    int64_t own = buf->starts[r + 1] - buf->starts[r];
    void *base = rf_dbuffer_at(slot, buf->slot_byte, 1);
    if (buf->fp8)
      rf_dbuffer_quantize_own(db, b, shard, slot, pow2, stream);
    else
      rf_move_own_shard(db->dev, rf_dbuffer_at(base, buf->starts[r], ps), dt, shard + buf->shard_off,
                        (size_t)own, stream);
    RF_DEVICE_COUNT(db->dev, bytes_padding, (uint64_t)buf->pad_other * ps);
  }
  /* the collectives start after the own-shard writes (MPI reads them from the host), as one launch */
  rf_device_event_record(db->dev, db->written, stream);
  rf_comm_stream_wait(comm, db->dev, db->written); /* the gather's own shard written */
  rf_comm_group_begin(comm);
  for (int b = 0; b < db->n_buffers; b++) {
    const struct rf_dbuffer_buf *buf = &db->bufs[b];
    enum rf_dtype dt = buf->fp8 ? RF_DTYPE_FP8E4M3 : param_dtype;
    void *base = rf_dbuffer_at(slot, buf->slot_byte, 1);
    if (buf->equal > 0)
      rf_comm_iallgather(comm, base, buf->equal, dt, &reqs[b]);
    else
      rf_comm_iallgatherv(comm, base, buf->starts, dt, &reqs[b]);
  }
  for (int t = 0, k = db->n_buffers; t < db->n_tensors && !db->fp8_after; t++)
    if (db->tensors[t].fp8)
      rf_comm_iallgatherv(comm, rf_dbuffer_scales(slot, &db->tensors[t]), db->tensors[t].scale_starts,
                          RF_DTYPE_F32, &reqs[k++]);
  rf_comm_group_end(comm);
}

/* The gathered scales of every FP8 tensor, copied to the host: a NaN (a tile with NaN or an
 * infinity on its owner) fails, naming the tensor, the expert and the tile's rows. */
static int rf_dbuffer_check_scales(const struct rf_dbuffer *db, void *slot, struct rf_device_stream *stream) {
  for (int t = 0; t < db->n_tensors; t++) {
    const struct rf_dbuffer_tensor *x = &db->tensors[t];
    if (!x->fp8) continue;
    /* read back on the stream that waited for the gathers (a copy to the host has landed on return) */
    float *s = db->host_scales;
    rf_device_copy(db->dev, s, rf_dbuffer_scales(slot, x), (size_t)x->tiles * sizeof(float),
                   RF_DEVICE_COPY_DEVICE_TO_HOST, stream);
    int64_t tc = rf_ceil_div(x->cols, RF_FP8_TILE), bands = rf_ceil_div(x->rows, RF_FP8_TILE);
    for (int64_t i = 0; i < x->tiles; i++)
      if (isnan(s[i])) {
        int64_t e = i / tc / bands, row = i / tc % bands * RF_FP8_TILE;
        char expert[48] = "";
        if (x->experts > 1) snprintf(expert, sizeof expert, "expert %lld's ", (long long)e);
        RF_FAIL(
            "fp8: tensor '%s' holds NaN or an infinity in %srows [%lld, %lld): its 128x128 tiles cannot "
            "be quantized to e4m3",
            x->name, expert, (long long)row, (long long)rf_min_i64(row + RF_FP8_TILE, x->rows));
      }
  }
  return 0;
}

/* fp8_after: every FP8 tensor's gathered view (param dtype) quantized whole into
 * its codes and scales, one band at a time (128 rows, or what is left of an
 * expert's matrix: a band of whole tile rows is a tensor of the same grid, so these
 * are the codes and scales of the whole tensor, expert by expert); a bf16 view
 * is widened band by band into the slot's f32 scratch. A band holding NaN or an
 * infinity gets NaN scales, as on the planned layout. */
static void rf_dbuffer_quantize_gathered(const struct rf_dbuffer *db, void *slot, enum rf_dtype param_dtype,
                                         int pow2, struct rf_device_stream *stream) {
  size_t ps = rf_dtype_size(param_dtype);
  float *scratch =
      param_dtype == RF_DTYPE_F32 ? NULL : (float *)(void *)rf_dbuffer_at(slot, db->band_byte, 1);
  for (int t = 0; t < db->n_tensors; t++) {
    const struct rf_dbuffer_tensor *x = &db->tensors[t];
    if (!x->fp8) continue;
    int64_t tc = rf_ceil_div(x->cols, RF_FP8_TILE), per = x->rows * x->cols;
    float *scales = rf_dbuffer_scales(slot, x);
    for (int64_t e = 0, k = 0, rows; e < x->numel; e += rows * x->cols, k += tc) {
      rows = rf_min_i64(RF_FP8_TILE, x->rows - e % per / x->cols); /* 128, or what is left of the expert */
      const void *view = rf_dbuffer_at(slot, x->view_byte + e * (int64_t)ps, 1);
      if (scratch)
        rf_move_convert_back(db->dev, scratch, view, param_dtype, (size_t)(rows * x->cols), 0, stream);
      const float *src = scratch ? scratch : view;
      struct rf_fp8_grid g = {rows, x->cols, RF_FP8_TILE, RF_FP8_TILE};
      if (rf_device_fp8_quantize(db->dev, &g, src, pow2, x->name, rf_dbuffer_at(slot, x->code_byte + e, 1),
                                 scales + k, stream) != 0)
        rf_dbuffer_nan_band(db, scales + k, tc, stream);
    }
    RF_DEVICE_COUNT(db->dev, bytes_cast, (uint64_t)(x->numel + x->tiles * (int64_t)sizeof(float)));
  }
}

int rf_dbuffer_gather_finish(const struct rf_dbuffer *db, void *slot, enum rf_dtype param_dtype, int pow2,
                             struct rf_comm_req *reqs, struct rf_device_stream *stream) {
  /* the stream waited for the gathers' events: no host wait (NCCL); MPI's were waited for then */
  for (int b = 0; b < db->n_gather_reqs; b++) rf_comm_retire(&reqs[b]);
  if (db->layout == RF_LAYOUT_FSDP2) {
    /* FSDP2's copy-out: every rank's rows of every tensor from the staging buffer
     * into the tensor's own storage. */
    size_t ps = rf_dtype_size(param_dtype);
    for (int t = 0; t < db->n_tensors; t++) {
      const struct rf_dbuffer_tensor *x = &db->tensors[t];
      for (int q = 0; q < db->world; q++) {
        int64_t n = x->starts[q + 1] - x->starts[q];
        rf_move_copy(db->dev, rf_dbuffer_at(slot, x->view_off + x->starts[q], ps),
                     rf_dbuffer_at(slot, x->piece[q], ps), (size_t)n * ps, stream);
      }
    }
  }
  if (db->fp8_after) rf_dbuffer_quantize_gathered(db, slot, param_dtype, pow2, stream);
  return rf_dbuffer_check_scales(db, slot, stream);
}

/* FSDP2's copy-in: every tensor's gradient into the rank-major staging buffer,
 * its padding rows zeroed. */
static void rf_dbuffer_copy_in(const struct rf_dbuffer *db, void *gslot, void *staging,
                               enum rf_dtype reduce_dtype, struct rf_device_stream *stream) {
  size_t rs = rf_dtype_size(reduce_dtype);
  int64_t shard = db->bufs[0].equal;
  for (int t = 0; t < db->n_tensors; t++) {
    const struct rf_dbuffer_tensor *x = &db->tensors[t];
    const float *g = (const float *)gslot + x->gview_off;
    int64_t padded = t + 1 < db->n_tensors ? db->tensors[t + 1].piece[0] - x->piece[0] : shard - x->piece[0];
    for (int q = 0; q < db->world; q++) {
      int64_t n = x->starts[q + 1] - x->starts[q];
      uint8_t *dst = rf_dbuffer_at(staging, x->piece[q], rs);
      rf_move_convert(db->dev, dst, reduce_dtype, g + x->starts[q], (size_t)n, stream);
      rf_move_zero(db->dev, dst + (size_t)n * rs, (size_t)(padded - n) * rs, stream);
    }
  }
}

void rf_dbuffer_reduce_start(const struct rf_dbuffer *db, const struct rf_comm *comm, void *gslot,
                             float *grad_shard, enum rf_dtype reduce_dtype, int accumulate,
                             struct rf_comm_req *reqs, struct rf_device_stream *stream) {
  size_t rs = rf_dtype_size(reduce_dtype);
  int direct = reduce_dtype == RF_DTYPE_F32 && !accumulate;
  uint8_t *staging = rf_dbuffer_at(gslot, 0, 1) + rf_dbuffer_staging_offset(db);
  uint8_t *scratch = rf_dbuffer_at(gslot, 0, 1) + rf_dbuffer_scratch_offset(db, reduce_dtype);
  if (db->layout == RF_LAYOUT_FSDP2) {
    rf_dbuffer_copy_in(db, gslot, staging, reduce_dtype, stream);
  } else if (reduce_dtype != RF_DTYPE_F32) { /* each buffer (not the alignment gaps between them) */
    for (int b = 0; b < db->n_buffers; b++) {
      const struct rf_dbuffer_buf *buf = &db->bufs[b];
      rf_move_convert(db->dev, rf_dbuffer_at(staging, buf->slot_off, rs), reduce_dtype,
                      (const float *)gslot + buf->slot_off, (size_t)buf->total, stream);
    }
  }
  const void *send_base = rf_dbuffer_needs_staging(db, reduce_dtype) ? (const void *)staging : gslot;
  /* the collectives start after the backward's writes and the staging, as one launch */
  rf_device_event_record(db->dev, db->written, stream);
  rf_comm_stream_wait(comm, db->dev, db->written);
  rf_comm_group_begin(comm);
  for (int b = 0; b < db->n_buffers; b++) {
    const struct rf_dbuffer_buf *buf = &db->bufs[b];
    const void *send = rf_dbuffer_at((void *)send_base, buf->slot_off, rs);
    void *recv = direct ? (void *)(grad_shard + buf->shard_off) : rf_dbuffer_at(scratch, buf->shard_off, rs);
    RF_DEVICE_COUNT(db->dev, bytes_padding, (uint64_t)buf->pad_other * rs);
    if (buf->equal > 0)
      rf_comm_ireduce_scatter_block(comm, send, recv, buf->equal, reduce_dtype, &reqs[b]);
    else
      rf_comm_ireduce_scatter(comm, send, recv, buf->starts, reduce_dtype, &reqs[b]);
  }
  rf_comm_group_end(comm);
}

void rf_dbuffer_reduce_finish(const struct rf_dbuffer *db, void *gslot, float *grad_shard,
                              enum rf_dtype reduce_dtype, int accumulate, struct rf_comm_req *reqs,
                              struct rf_device_stream *stream) {
  for (int b = 0; b < db->n_buffers; b++) rf_comm_retire(&reqs[b]); /* as the gathers' */
  if (reduce_dtype == RF_DTYPE_F32 && !accumulate) return;
  size_t rs = rf_dtype_size(reduce_dtype);
  uint8_t *scratch = rf_dbuffer_at(gslot, 0, 1) + rf_dbuffer_scratch_offset(db, reduce_dtype);
  for (int b = 0; b < db->n_buffers; b++) {
    const struct rf_dbuffer_buf *buf = &db->bufs[b];
    int64_t own = buf->starts[db->rank + 1] - buf->starts[db->rank];
    rf_move_convert_back(db->dev, grad_shard + buf->shard_off, rf_dbuffer_at(scratch, buf->shard_off, rs),
                         reduce_dtype, (size_t)own, accumulate, stream);
  }
}
