/* src/optim: the optimizers' internal header. The public API is rfsdp_optim.h;
 * here are what the module's files share (the ops table every optimizer
 * implements, the optimizer's common part, AdamW's arithmetic, the matrix-owner
 * transport) and the building blocks tests use. See docs/optim.md.
 *
 * Files: optim.c (the kinds, the common create/step/state entry points),
 * adamw.c, adamw8bit.c, muon.c, shampoo.c (one optimizer each, behind struct
 * rf_optim_ops), owners.c (the matrix-owner transport: Muon and Shampoo),
 * quant.c (8-bit maps and quantizer), newton_schulz.c (Muon's orthogonalization,
 * its GEMMs in one place), fsdp.c (create over a runtime context). */
#ifndef RF_OPTIM_H
#define RF_OPTIM_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/core.h"
#include "device/device.h"
#include "rfsdp.h"
#include "rfsdp_optim.h"

/* ---- one optimizer: the ops table ------------------------------------------------ */

/* What every optimizer implements. `create` allocates its state (o->impl) and
 * every workspace, or returns -1 with a message (the caller then calls `free`,
 * which must accept a half-built state); `step` allocates nothing. */
struct rf_optim_ops {
  const char *name;   /* as --optim spells it */
  int64_t block_rows; /* rf_optim_layout_needs */
  int64_t vector_block;
  int n_states;       /* state slabs, for checkpoints */
  int takes_matrices; /* 1: updates the views flagged MATRIX whole (else the flag is cleared) */
  /* 1: its step is host code on device memory (launched, or on the host thread after
   * rf_optim_host_sync), reaching it through rf_device_view: refused at create on a device that
   * cannot run host code (CUDA) */
  int host_code;
  /* 1: its step takes the clip factor from the device (rf_optim_hyper.gscale): rf_optim_step_fsdp_launch
   * leaves the norm on the device */
  int device_clip;
  /* optional: 1 when dev's backend has this kind's kernels (its step launches them instead of host
   * code, so a device that cannot run host code takes it) */
  int (*on_device)(const struct rf_device *dev);
  /* what a step costs (rf_optim_stats.step_stream_bytes, the simulator's price):
   * bytes of memory one step reads and writes per shard element of the
   * element-wise pass, and per element of this rank's pieces of MATRIX views
   * (their owners' matrix work: rf_optim_stats.step_flops from `stats`) */
  double elem_bytes, matrix_elem_bytes;
  int (*create)(struct rf_optim *o);
  int (*step)(struct rf_optim *o, float lr); /* 0, or -1 with a message on every rank */
  void (*state)(const struct rf_optim *o, int i, struct rf_optim_state_slab *out);
  void (*free)(struct rf_optim *o);
  /* optional (NULL: none) */
  void (*scales)(const struct rf_optim *o, int view, int64_t *offset, int64_t *count, int64_t *first);
  int64_t (*tensor_blocks)(const struct rf_optim *o, int view);
  int (*owner)(const struct rf_optim *o, int view);
  int64_t (*owner_count)(const struct rf_optim *o, int view);
  void (*stats)(const struct rf_optim *o, struct rf_optim_stats *out); /* adds its counters */
};

extern const struct rf_optim_ops rf_optim_adamw_ops, rf_optim_adamw8bit_ops, rf_optim_muon_ops,
    rf_optim_shampoo_ops;

/* One view as the optimizers see it. */
struct rf_optim_view {
  struct rf_tensor_view v; /* copy; starts/master/grad borrowed */
  int flags;               /* RF_OPTIM_FLAG_*; MATRIX cleared for the element-wise kinds */
  int64_t rows, cols;      /* as 2-D: cols = the last dimension; cols 0: a vector */
};

/* The common part; `impl` is the optimizer's own state (owned, freed by ops->free). */
struct rf_optim {
  struct rf_optim_options opt;
  const struct rf_optim_ops *ops;
  const struct rf_comm *comm;  /* borrowed; NULL allowed for the element-wise kinds */
  struct rf_device *dev;       /* borrowed: the runtime context's device, or own_device; state lives there */
  struct rf_device own_device; /* the host device when created without a runtime context */
  struct rf_device_stream
      *stream; /* borrowed (the runtime's compute stream) or own_stream: the step's work */
  struct rf_device_stream *own_stream; /* owned: own_device's stream, NULL with a runtime context */
  int rank, world;
  int n;
  struct rf_optim_view *views; /* owned */
  int64_t shard_elems;
  int64_t step;
  int measure; /* 1: sizes only (rf_optim_measure): the create allocates no state or staging */
  struct rf_optim_stats stats;
  void (*before_step)(void *ctx); /* rf_optim_set_before_step; NULL: none */
  void *before_step_ctx;
  void *impl;
  const float *gscale; /* the step's clip factor on the device (rf_optim_hyper.gscale), NULL: none */
  /* rf_optim_create_fsdp's context (borrowed) and its rf_fsdp_grads_unfinished (a
   * pointer: programs of views alone do not link the runtime); NULL without one */
  const struct rf_fsdp *fsdp;
  const char *(*grads_unfinished)(const struct rf_fsdp *f);
  int holders;      /* async savers that borrow the optimizer (rf_optim_hold) */
  int free_pending; /* rf_optim_free came while held: the last rf_optim_unhold frees */
};

/* Before host code of the step on the host thread (Muon's and Shampoo's stages, between which MPI
 * moves their staging): waits for the work queued on the optimizer's stream (the gradients'
 * finish), after which rf_device_view(o->dev, ptr) reaches device memory. On the host: nothing. */
void rf_optim_host_sync(struct rf_optim *o);

/* rf_optim_step_fsdp without a wait, where the optimizer's kernels take the clip factor from the
 * device (ops->device_clip: AdamW): the norm's sum of squares and the clip factor stay on the device
 * (rf_fsdp_grad_norm_on_device), the update is launched reading the factor (a non-finite norm: the
 * kernels change nothing), and *sumsq is the device's f64 sum for the caller to read once, after
 * the launches, and hand to rf_optim_step_fsdp_settle. Other optimizers: rf_optim_step_fsdp
 * itself, *sumsq NULL. Returns as rf_optim_step_fsdp (0 while the norm is pending). */
int rf_optim_step_fsdp_launch(struct rf_optim *o, struct rf_fsdp *f, float lr, double clip, double *norm,
                              const double **sumsq);
/* The norm of rf_optim_step_fsdp_launch's sum (read by the caller): sqrt(sumsq) into *norm; 1 when
 * it is not finite (the step the kernels skipped is not counted: the step counter is put back),
 * else 0. */
int rf_optim_step_fsdp_settle(struct rf_optim *o, double sumsq, double *norm);

/* An async saver holds the optimizer it borrows, as rf_fsdp_hold the context. */
void rf_optim_hold(struct rf_optim *o);
void rf_optim_unhold(struct rf_optim *o);

/* rf_optim_create on a device (opened by rf_backend_open: the runtime context's, rf_optim_create_fsdp),
 * its step queued on `stream` (the context's compute stream). */
int rf_optim_create_on(struct rf_optim **out, const struct rf_optim_options *opt,
                       const struct rf_tensor_view *views, const int *flags, int n, int64_t shard_elems,
                       const struct rf_comm *comm, struct rf_device *dev, struct rf_device_stream *stream);

/* ---- AdamW's arithmetic, shared by adamw, adamw8bit and muon's other views ------------ */

struct rf_optim_hyper {
  float lr, b1, b2, eps;
  float step_size; /* lr / (1 - b1^t) */
  float bc2_sqrt;  /* sqrt(1 - b2^t) */
  float decay;     /* 1 - lr * wd */
  float one_m_b1, one_m_b2;
  /* device memory or NULL (1): the clip factor every gradient is multiplied by before the update
   * (rf_fsdp_grad_norm_on_device); NaN: the update changes nothing (a non-finite norm) */
  const float *gscale;
};

void rf_optim_hyper_init(const struct rf_optim *o, float lr, struct rf_optim_hyper *h);

/* torch.optim.AdamW's arithmetic on floats or on vectors of them (GCC vector
 * types such as __m512): one expression text, so the scalar and the vector paths
 * round alike and a compiler that contracts a * b + c into an FMA does so in
 * both (pass variables: an expression argument may be contracted with the
 * macro's own operations). m.lerp_(g, 1 - b1); v = b2 v + (1 - b2) g^2; p (1 - lr wd) - step_size *
 * m / (sqrt(v) / sqrt(1 - b2^t) + eps), `sqrt_v` = sqrt(v). */
#define RF_OPTIM_ADAMW_M(m, g, one_m_b1) ((m) + (one_m_b1) * ((g) - (m)))
#define RF_OPTIM_ADAMW_V(v, g, b2, one_m_b2) ((b2) * (v) + (one_m_b2) * ((g) * (g)))
#define RF_OPTIM_ADAMW_P(p, dec, step_size, m, sqrt_v, bc2_sqrt, eps) \
  ((p) * (dec) - (step_size) * ((m) / ((sqrt_v) / (bc2_sqrt) + (eps))))

/* The AVX-512 kernels of 8-bit AdamW and the quantizer: built when the compiler
 * targets AVX-512 (F, BW, VL, VBMI), used unless switched off. 0 switches to the
 * portable kernels (the reference the AVX-512 ones are tested against bit for
 * bit), 1 back; returns the previous setting (always 0 without AVX-512). */
int rf_optim_simd_set(int on);
int rf_optim_simd_get(void);

/* The update over one piece on host memory (adamw.c; the cpu backend's adamw_piece): chunks on the
 * threads, simd loops; `stream` unused (the host runs it at once). */
void rf_optim_adamw_host_piece(const struct rf_optim_hyper *h, int decay, float *p, const float *g, float *m,
                               float *v, int64_t len, struct rf_device_stream *stream);
/* The host loop launched on `stream` (rf_device_launch: in stream order; the checked backend's
 * adamw_piece): on the stream's worker it runs rf_optim_adamw_host_piece on the device's views of
 * the four pieces, so the host's bits. Dies on a device that cannot run host code (CUDA). */
void rf_optim_adamw_launch_piece(const struct rf_optim_hyper *h, int decay, float *p, const float *g,
                                 float *m, float *v, int64_t len, struct rf_device_stream *stream);
/* The same update as one fused CUDA kernel over a piece in device memory (adamw_cuda.cu,
 * BACKEND=cuda builds only), queued on stream (NULL: the default stream): the macros'
 * operations in their order without FMA contraction, so the host's bits. */
void rf_optim_adamw_cuda_piece(const struct rf_optim_hyper *h, int decay, float *p, const float *g, float *m,
                               float *v, int64_t len, struct rf_device_stream *stream);
/* 8-bit AdamW on a device that runs kernels, not host code (CUDA: adamw8bit_cuda.cu, the backend's
 * adamw8bit_step): adamw8bit.c's step as one launch, a thread block per 8-bit block (a 32 x 32 tile of
 * a matrix or a run of 256 of a vector, intersected with this rank's piece), from a plan made at create.
 * Every pointer is device memory; the tables are quant.c's (maps and the quantizer's entries). The
 * descriptors in device memory hold offsets, no pointers (the kernel takes its pointers as arguments). */
struct rf_optim_8bit_cuda_view {
  int64_t begin, end; /* the piece, in the tensor's elements */
  int64_t shard_offset;
  int32_t decay; /* RF_OPTIM_FLAG_DECAY set */
  int32_t pad_;
};
struct rf_optim_8bit_cuda_block { /* one per scale, in scale order */
  int64_t first;                  /* the tensor element of its top-left corner */
  int64_t row;                    /* elements from one of its rows to the next */
  int32_t view, rows, cols;       /* rows x cols <= 1024 */
  int32_t pad_;
};
struct rf_optim_8bit_plan {
  /* the shard's slabs: every view's piece at its shard offset (the runtime's layout, required) */
  float *p;
  const float *g;
  const struct rf_optim_8bit_cuda_view *views;
  const struct rf_optim_8bit_cuda_block *blocks;
  int64_t n_blocks;
  const float *map_s, *map_u;    /* rf_optim_qmap(1), (0): 256 each */
  const uint32_t *ent_s, *ent_u; /* rf_optim_qentries(1), (0): 2 * buckets each */
  int32_t key_lo, buckets;       /* RF_OPTIM_QKEY_LO, RF_OPTIM_QBUCKETS */
  uint8_t *mq, *vq;              /* codes over the shard */
  float *ms, *vs;                /* absmax per block */
};
/* The launch (BACKEND=cuda builds only): the host step's bits (round-to-nearest intrinsics, no
 * contraction); nothing when plan->n_blocks is 0. */
void rf_optim_adamw8bit_cuda_step(const struct rf_optim_8bit_plan *plan, const struct rf_optim_hyper *h,
                                  struct rf_device_stream *stream);

/* Muon's element-wise stages on CUDA (muon_cuda.cu, BACKEND=cuda builds only; the backend's
 * muon_momentum and muon_apply), muon.c's arithmetic with round-to-nearest intrinsics: the host's
 * bits. momentum: buf = buf + (1 - mu) (g - buf), u = Nesterov ? buf - (buf - g) (1 - mu) : buf;
 * apply: p = p dec - alr u. Every pointer device memory; len 0 queues nothing. */
void rf_optim_muon_cuda_momentum(float *buf, const float *g, float *u, int64_t len, float momentum,
                                 int nesterov, struct rf_device_stream *stream);
void rf_optim_muon_cuda_apply(float *p, const float *u, int64_t len, float dec, float alr,
                              struct rf_device_stream *stream);

/* A run of views of one unit that the backend's shard_adamw updates in one launch: the pieces'
 * offsets are from view `base` (the run's smallest shard offset; its master, grad, m and v are the
 * kernel's pointers). */
struct rf_optim_adamw_group {
  int base;
  struct rf_shard_plan *plan; /* owned */
};

/* f32 AdamW state over the shard (m, v at the views' shard offsets). */
struct rf_optim_adamw_state {
  float *m, *v;
  /* where the backend has shard kernels (CUDA) and the views lie in one slab at their shard
   * offsets: a launch per unit; else none (a launch per piece, the backend's adamw_piece) */
  int n_groups;
  struct rf_optim_adamw_group *groups; /* owned */
};

void rf_optim_adamw_state_init(struct rf_optim *o, struct rf_optim_adamw_state *a);
void rf_optim_adamw_state_free(struct rf_optim *o, struct rf_optim_adamw_state *a);
/* AdamW on every view not flagged MATRIX. */
void rf_optim_adamw_state_step(struct rf_optim *o, struct rf_optim_adamw_state *a, float lr);
/* Slab i (0: "m", 1: "v"). */
void rf_optim_adamw_state_slab(const struct rf_optim *o, const struct rf_optim_adamw_state *a, int i,
                               struct rf_optim_state_slab *out);

/* ---- the matrix-owner transport (owners.c) --------------------------------------------- */

/* Whole matrices for an optimizer that needs each one on one rank (Muon's
 * orthogonalization; Shampoo's preconditioners). Each matrix has one owner,
 * chosen by cost; the matrices are batched in groups (e.g. a unit): per group
 * one all-to-all-v carries every rank's pieces to the owners ("out") and one
 * carries the owners' results back ("back"); with overlap, group g+1 travels out
 * and group g-1 back while group g is computed. Every rank describes the same
 * matrices in the same order and runs the same calls. Allocates everything at
 * create; rf_optim_owners_run allocates nothing. */
struct rf_optim_owners;

struct rf_optim_owners_matrix {
  int64_t rows, cols;    /* the whole matrix, row-major */
  const int64_t *starts; /* every rank's range (world + 1 entries), borrowed */
  int group;             /* matrices of one group travel together; groups run in order of first appearance */
  double cost;           /* the owner's compute cost (e.g. FLOPs), for balancing */
  int64_t work;          /* scratch elements the owner's compute needs beside the matrix */
};

/* What the user of the transport does at each stage of rf_optim_owners_run. */
struct rf_optim_owners_fns {
  /* this rank's piece of matrix k (its starts range) into `out`, before it travels out */
  void (*pack)(void *ctx, int k, float *out);
  /* the owner's computation on the whole matrix k (rows x cols, in place) with
   * `work` elements of scratch; `poll(poll_arg)` progresses transfers in flight */
  void (*compute)(void *ctx, int k, float *matrix, float *work, void (*poll)(void *), void *poll_arg);
  /* this rank's piece of matrix k's result, after it came back */
  void (*unpack)(void *ctx, int k, const float *in);
};

struct rf_optim_owners_stats {
  uint64_t bytes_sent, bytes_recv;           /* cumulative, to / from other ranks, both trips */
  uint64_t step_bytes_sent, step_bytes_recv; /* planned per run */
  uint64_t wait_ns;                          /* time waiting for the all-to-all-v */
  double owned_cost;                         /* the cost of the matrices this rank owns */
  int64_t workspace_bytes;                   /* staging and the owner's matrix + scratch */
};

/* Owners: matrices by decreasing cost (ties: order); each goes to the rank
 * holding most of it among those whose load is within half the matrix's cost of
 * the least loaded rank (ties: lower load, lower rank): max load <= mean + 1.5 *
 * the largest cost. `overlap` 1: three staging slots (overlapped), 0: one.
 * `measure` 1: the stats only (rf_optim_measure), no staging allocated (not runnable).
 * The staging is host memory (MPI moves it from the host thread; the stages are host code, run
 * after rf_optim_host_sync), its copies counted into dev's counters; `stream` is unused. */
void rf_optim_owners_create(struct rf_optim_owners **out, const struct rf_comm *comm, struct rf_device *dev,
                            struct rf_device_stream *stream, const struct rf_optim_owners_matrix *mats, int n,
                            int overlap, int measure);
void rf_optim_owners_free(struct rf_optim_owners *t);
/* The owner rank of matrix k. */
int rf_optim_owners_owner(const struct rf_optim_owners *t, int k);
/* pack every matrix, move the pieces to the owners, compute, move the results
 * back, unpack; collective. */
void rf_optim_owners_run(struct rf_optim_owners *t, const struct rf_optim_owners_fns *fns, void *ctx);
void rf_optim_owners_get_stats(const struct rf_optim_owners *t, struct rf_optim_owners_stats *out);

/* ---- building blocks (exposed for tests) -------------------------------------- */

/* bitsandbytes' create_dynamic_map(signed, 7, 8): 256 sorted values in [-1, 1]. */
const float *rf_optim_qmap(int is_signed);
/* The code of the map value nearest to x (x normalized to [-1, 1]; a tie goes to
 * the lower code; NaN and x below the map: 0): a direct lookup. */
uint8_t rf_optim_quantize(int is_signed, float x);
/* The same by binary search over the map: the reference the lookup is built
 * from and tested against. */
uint8_t rf_optim_quantize_search(int is_signed, float x);
/* codes[i] = rf_optim_quantize(is_signed, x[i] * scale) (AVX-512 where on). */
void rf_optim_quantize_scaled(int is_signed, const float *x, int64_t n, float scale, uint8_t *codes);
/* Quantizes n floats with their absmax: codes[i] = nearest(x[i] / absmax). */
void rf_optim_quantize_block(int is_signed, const float *x, int64_t n, uint8_t *codes, float *absmax);
void rf_optim_dequantize_block(int is_signed, const uint8_t *codes, int64_t n, float absmax, float *x);

/* Orthogonalizes the A x B row-major matrix x in place with `steps` quintic
 * Newton-Schulz iterations (a, b, c) = (3.4445, -4.7750, 2.0315), after dividing
 * by max(Frobenius norm, eps); transposes when A > B. `work` holds at least
 * rf_optim_newton_schulz_work(A, B) floats. `poll(poll_arg)` (may be NULL) runs
 * after every gemm (to progress communication in flight). Returns the FLOPs. */
double rf_optim_newton_schulz(float *x, int64_t rows, int64_t cols, int steps, float eps, float *work,
                              void (*poll)(void *), void *poll_arg);
/* 2*A*B + 2*min(A,B)^2. */
int64_t rf_optim_newton_schulz_work(int64_t rows, int64_t cols);
/* The floats of device work rf_optim_newton_schulz_cuda needs: the same four buffers, each
 * rounded up to 4 floats (cuBLASLt's operands 16-byte aligned). */
int64_t rf_optim_newton_schulz_device_work(int64_t rows, int64_t cols);

/* rf_optim_newton_schulz on the device (newton_schulz_cuda.c, BACKEND=cuda builds only; the
 * backend's muon_newton_schulz): x (rows x cols, row-major), work
 * (rf_optim_newton_schulz_device_work floats, 16-byte aligned) and ss (one f64) in device memory,
 * queued on stream, no host wait. The same steps: the transpose when rows > cols, the division by
 * max(Frobenius norm, eps) (the norm's f64 sum of squares the device table's, in another order
 * than the host's serial sum), the three products of each iteration on cuBLASLt in f32 (another
 * order of summation than oneDNN's): the host's result within f32 roundoff, not its bits
 * (tests/gpu/test_optim_cuda.c states the bound). Its cuBLASLt context is the GPU's, made at the
 * first call and kept. */
void rf_optim_newton_schulz_cuda(float *x, int64_t rows, int64_t cols, int steps, float eps, float *work,
                                 double *ss, struct rf_device_stream *stream);
/* Its element-wise kernels (muon_cuda.cu): dst (cols x rows) = src (rows x cols)^T; y[i] /=
 * max((float)sqrt(*ss), eps), the host's f32 division. */
void rf_optim_muon_cuda_transpose(float *dst, const float *src, int64_t rows, int64_t cols,
                                  struct rf_device_stream *stream);
void rf_optim_muon_cuda_normalize(float *y, int64_t len, const double *ss, float eps,
                                  struct rf_device_stream *stream);

#endif
