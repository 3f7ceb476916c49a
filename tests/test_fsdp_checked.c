/* rf-test: np=1,2,3,4 timeout=240
 * The runtime on the checked device (src/device/device_checked.c: device memory the host
 * cannot read, streams that run late on worker threads, real events) against the same
 * runtime on the cpu device, bit for bit: two contexts of the same options and tensors
 * (an embedding, two layers of a norm, a 130 x 40 and a 40 x 136 matrix and a 3-vector, a
 * head) side by side in lockstep, steps of 2 micro-batches. At every forward and backward
 * the gathered parameters (f32, bf16, or FP8 codes and tile scales) are read back through an
 * explicit copy and must hold the same bytes on both; every rank writes gradients that
 * depend on its rank, the step, the micro-batch and the element; after each step the grad
 * norm (clipped at 0.5, so clipping scales the gradients) must be the same double, and at
 * the end every rank's master shard and every optimizer state slab the same bytes.
 * Variants: AdamW in the planned layout (equal shards, f32), fsdp2 with bf16 parameters and
 * reduce-scatters, 8-bit AdamW (ragged shards, whole 8-bit blocks), Muon in the flat
 * layout, Shampoo (roots refreshed every 2 steps), FP8 planned (own tiles quantized before
 * the gather, scales gathered) and FP8 flat with bf16 parameters (quantized after the
 * gather), and at W = 4 HSDP 2 x 2 with a bf16 reduce. Then an FP8 tensor holding NaN on its
 * owner fails the gather on both, with the same message (the NaN scales written through the
 * device, read back by a copy). Each rule the checked device enforces makes a dropped event
 * wait or a host read of device memory show here: scripts/mutations plants them. And on a device
 * that cannot run host code (a host table without launch, named cuda: what the CUDA backend is to
 * the optimizers) 8-bit AdamW, Muon and Shampoo are refused at creation naming the option, while
 * AdamW (the backend's adamw_piece) is made. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"
#include "fsdp/fsdp.h"
#include "optim/optim.h"
#include "rf_test.h"
#include "rfsdp_mpi.h"

#define LAYERS 2
#define STEPS 3
#define MICRO 2

struct variant {
  const char *name;
  enum rf_layout layout;
  enum rf_shard_mode shard;
  enum rf_dtype param, reduce;
  enum rf_optim_kind optim;
  int fp8;
  int replicas; /* HSDP: W must be 2 * replicas... run only at W = 4 with 2 */
};

static const struct variant variants[] = {
    {"adamw planned f32", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_F32,
     RF_OPTIM_KIND_ADAMW, 0, 1},
    {"adamw fsdp2 bf16", RF_LAYOUT_FSDP2, RF_SHARD_MODE_EQUAL, RF_DTYPE_BF16, RF_DTYPE_BF16,
     RF_OPTIM_KIND_ADAMW, 0, 1},
    {"adamw8bit planned ragged", RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, RF_DTYPE_F32, RF_DTYPE_F32,
     RF_OPTIM_KIND_ADAMW8BIT, 0, 1},
    {"muon flat", RF_LAYOUT_FLAT, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_F32, RF_OPTIM_KIND_MUON, 0, 1},
    {"shampoo planned", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_F32,
     RF_OPTIM_KIND_SHAMPOO, 0, 1},
    {"fp8 planned", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_F32, RF_OPTIM_KIND_ADAMW,
     1, 1},
    {"fp8 flat bf16", RF_LAYOUT_FLAT, RF_SHARD_MODE_EQUAL, RF_DTYPE_BF16, RF_DTYPE_F32, RF_OPTIM_KIND_ADAMW,
     1, 1},
    {"hsdp 2x2 bf16 reduce", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_BF16,
     RF_OPTIM_KIND_ADAMW, 0, 2},
};
#define N_VARIANTS ((int)(sizeof variants / sizeof variants[0]))

static int g_rank, g_world;

static struct rf_fsdp *build(const struct variant *va, const char *device, MPI_Comm shard,
                             MPI_Comm replicate) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = va->layout;
  opt.shard = va->shard;
  opt.param_dtype = va->param;
  opt.reduce_dtype = va->reduce;
  opt.fp8 = va->fp8;
  opt.seed = 11;
  opt.device = device;
  struct rf_optim_layout_needs needs;
  rf_optim_layout_needs(va->optim, &needs);
  opt.block_rows = needs.block_rows;
  opt.vector_block = needs.vector_block;
  struct rf_fsdp *f = NULL;
  if (rf_fsdp_create_mesh(&f, shard, replicate, &opt) != 0)
    RF_DIE("create (%s): %s", device, rf_fsdp_error());
  int u = rf_fsdp_add_unit(f, "embed");
  int64_t es[2] = {50, 24};
  rf_fsdp_add_tensor(f, u, "embed.weight", 2, es, 0, (struct rf_init){RF_INIT_NORMAL, 0.5f});
  for (int l = 0; l < LAYERS; l++) {
    char nm[64];
    snprintf(nm, sizeof nm, "layer%d", l);
    u = rf_fsdp_add_unit(f, nm);
    int64_t ns[1] = {24}, a[2] = {130, 40}, b[2] = {40, 136}, c[1] = {3};
    snprintf(nm, sizeof nm, "layers.%d.norm", l);
    rf_fsdp_add_tensor(f, u, nm, 1, ns, 0, (struct rf_init){RF_INIT_CONST, 1.0f});
    snprintf(nm, sizeof nm, "layers.%d.up", l);
    int t = rf_fsdp_add_tensor(f, u, nm, 2, a, 0, (struct rf_init){RF_INIT_NORMAL, 0.3f});
    if (va->fp8) RF_ASSERT(rf_fsdp_set_fp8(f, t) == 0);
    snprintf(nm, sizeof nm, "layers.%d.down", l);
    t = rf_fsdp_add_tensor(f, u, nm, 2, b, 0, (struct rf_init){RF_INIT_UNIFORM, 0.2f});
    if (va->fp8) RF_ASSERT(rf_fsdp_set_fp8(f, t) == 0);
    snprintf(nm, sizeof nm, "layers.%d.bias", l);
    rf_fsdp_add_tensor(f, u, nm, 1, c, 0, (struct rf_init){RF_INIT_UNIFORM, 0.2f});
  }
  u = rf_fsdp_add_unit(f, "head");
  int64_t hs[2] = {24, 50};
  rf_fsdp_add_tensor(f, u, "head.weight", 2, hs, 0, (struct rf_init){RF_INIT_NORMAL, 0.2f});
  if (rf_fsdp_finalize(f) != 0) RF_DIE("finalize (%s): %s", device, rf_fsdp_error());
  return f;
}

static struct rf_optim *make_optim(const struct variant *va, struct rf_fsdp *f) {
  struct rf_optim_options oo;
  rf_optim_options_default(&oo);
  oo.kind = va->optim;
  oo.shampoo_every = 2;
  int n = rf_fsdp_n_tensors(f);
  int *flags = rf_xcalloc((size_t)n, sizeof(int));
  const struct rf_tensor_view *v = rf_fsdp_views(f);
  for (int t = 0; t < n; t++)
    if (v[t].ndim == 2)
      flags[t] = RF_OPTIM_FLAG_DECAY | (strstr(v[t].name, "layers.") ? RF_OPTIM_FLAG_MATRIX : 0);
  struct rf_optim *o = NULL;
  if (rf_optim_create_fsdp(&o, &oo, f, flags, NULL) != 0) RF_DIE("optim: %s", rf_error_msg());
  free(flags);
  return o;
}

/* The bytes of what the context gathered for unit u, read back by copies on the compute stream. */
struct bytes {
  uint8_t *p;
  size_t n, cap;
};

static void take(struct rf_fsdp *f, struct bytes *b, const void *dev_ptr, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = 2 * (b->n + n);
    b->p = realloc(b->p, b->cap);
    RF_ASSERT(b->p);
  }
  rf_device_copy(f->device, b->p + b->n, dev_ptr, n, RF_DEVICE_COPY_DEVICE_TO_HOST,
                 f->stream[RF_FSDP_STREAM_COMPUTE]);
  b->n += n;
}

static void gathered(struct rf_fsdp *f, int u, struct bytes *b) {
  b->n = 0;
  const struct rf_tensor_view *v = rf_fsdp_views(f);
  for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
    if (v[t].unit != u) continue;
    const float *scales = NULL;
    const uint8_t *codes = rf_fsdp_param_fp8(f, t, &scales);
    if (codes) {
      int64_t tiles = rf_ceil_div(v[t].shape[0], RF_FP8_TILE) * rf_ceil_div(v[t].shape[1], RF_FP8_TILE);
      take(f, b, codes, (size_t)v[t].numel);
      take(f, b, scales, (size_t)tiles * sizeof(float));
    } else if (rf_fsdp_param(f, t)) {
      take(f, b, rf_fsdp_param(f, t), (size_t)v[t].numel * sizeof(float));
    } else {
      take(f, b, rf_fsdp_param_bf16(f, t), (size_t)v[t].numel * sizeof(uint16_t));
    }
  }
}

static float hash_f32(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = a * 0x9E3779B97F4A7C15ull ^ b * 0xC2B2AE3D27D4EB4Full ^ c * 0x165667B19E3779F9ull;
  return rf_test_rand_f32(&s);
}

/* Unit u's gradients, written through copies: a function of the rank, the step, the micro-batch,
 * the tensor and the element (the same on both contexts). */
static void write_grads(struct rf_fsdp *f, int u, int step, int micro, float *host) {
  const struct rf_tensor_view *v = rf_fsdp_views(f);
  int who = rf_fsdp_replicate_rank(f) * rf_fsdp_world(f) + rf_fsdp_rank(f);
  for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
    if (v[t].unit != u) continue;
    for (int64_t i = 0; i < v[t].numel; i++)
      host[i] = hash_f32((uint64_t)t, (uint64_t)i,
                         (uint64_t)1 + (uint64_t)who + 8 * (uint64_t)(micro + MICRO * step));
    rf_device_copy(f->device, rf_fsdp_grad(f, t), host, (size_t)v[t].numel * sizeof(float),
                   RF_DEVICE_COPY_HOST_TO_DEVICE, f->stream[RF_FSDP_STREAM_COMPUTE]);
  }
}

static int same(const struct bytes *a, const struct bytes *b) {
  return a->n == b->n && memcmp(a->p, b->p, a->n) == 0;
}

/* The bytes of device memory [ptr, +n) of f's device. */
static void read_back(struct rf_fsdp *f, const void *ptr, size_t n, struct bytes *b) {
  b->n = 0;
  take(f, b, ptr, n);
}

static void run(const struct variant *va, MPI_Comm shard, MPI_Comm replicate) {
  struct rf_fsdp *f[2] = {build(va, "cpu", shard, replicate), build(va, "checked", shard, replicate)};
  RF_CHECK(f[0]->device->ops->host_memory && !f[1]->device->ops->host_memory, "%s: cpu and checked",
           va->name);
  struct rf_optim *o[2] = {make_optim(va, f[0]), make_optim(va, f[1])};
  struct bytes b[2] = {{0}, {0}};
  float *host = rf_xmalloc(50 * 136 * sizeof(float));
  int n_units = rf_fsdp_n_units(f[0]), bad_gathers = 0, gathers = 0;
  for (int step = 0; step < STEPS; step++) {
    for (int k = 0; k < 2; k++) rf_fsdp_zero_grad(f[k]);
    for (int micro = 0; micro < MICRO; micro++) {
      if (micro == MICRO - 1)
        for (int k = 0; k < 2; k++) rf_fsdp_set_last_micro_batch(f[k]);
      for (int u = 0; u < n_units; u++) {
        for (int k = 0; k < 2; k++) {
          rf_fsdp_forward_begin(f[k], u);
          gathered(f[k], u, &b[k]);
        }
        gathers++;
        bad_gathers += !same(&b[0], &b[1]);
        for (int k = 0; k < 2; k++) rf_fsdp_forward_end(f[k], u);
      }
      for (int u = n_units - 1; u >= 0; u--) {
        for (int k = 0; k < 2; k++) {
          rf_fsdp_backward_begin(f[k], u);
          gathered(f[k], u, &b[k]);
          write_grads(f[k], u, step, micro, host);
          rf_fsdp_backward_end(f[k], u);
        }
        gathers++;
        bad_gathers += !same(&b[0], &b[1]);
      }
    }
    double norm[2];
    int rc[2];
    for (int k = 0; k < 2; k++) rc[k] = rf_optim_step_fsdp(o[k], f[k], 0.01f, 0.5, &norm[k]);
    RF_CHECK(rc[0] == 0 && rc[1] == 0, "%s step %d: the steps pass (%d, %d): %s", va->name, step, rc[0],
             rc[1], rf_error_msg());
    RF_CHECK(norm[0] == norm[1] && norm[0] > 0.5,
             "%s step %d: grad norm %.17g on cpu, %.17g on checked (clipped at 0.5)", va->name, step, norm[0],
             norm[1]);
    for (int k = 0; k < 2; k++) rf_fsdp_reshard_all(f[k]);
  }
  RF_CHECK(bad_gathers == 0, "%s: %d of %d gathers hold other bytes on checked than on cpu", va->name,
           bad_gathers, gathers);
  for (int k = 0; k < 2; k++) read_back(f[k], f[k]->master, (size_t)f[k]->shard_elems * sizeof(float), &b[k]);
  RF_CHECK(same(&b[0], &b[1]), "%s: the master shard after %d steps differs on checked", va->name, STEPS);
  for (int i = 0; i < rf_optim_n_states(o[0]); i++) {
    struct rf_optim_state_slab s[2];
    for (int k = 0; k < 2; k++) {
      rf_optim_state(o[k], i, &s[k]);
      read_back(f[k], s[k].data, (size_t)s[k].count * rf_dtype_size(s[k].dtype), &b[k]);
    }
    RF_CHECK(same(&b[0], &b[1]), "%s: optimizer state %s differs on checked", va->name, s[0].name);
  }
  if (va->fp8) { /* a NaN in an FP8 tensor's master on its owner: every rank's gather fails, alike */
    int t = rf_fsdp_find_tensor(f[0], "layers.1.down");
    const struct rf_tensor_view *v = &rf_fsdp_views(f[0])[t];
    const float nan = NAN;
    char msg[2][512];
    for (int k = 0; k < 2; k++) {
      if (v->end > v->begin)
        rf_device_copy(f[k]->device, rf_fsdp_views(f[k])[t].master, &nan, sizeof nan,
                       RF_DEVICE_COPY_HOST_TO_DEVICE, f[k]->stream[RF_FSDP_STREAM_COMPUTE]);
      for (int u = 0; u < n_units; u++) {
        rf_fsdp_forward_begin(f[k], u);
        rf_fsdp_forward_end(f[k], u);
      }
      rf_fsdp_reshard_all(f[k]);
      int st = rf_fsdp_status(f[k]);
      snprintf(msg[k], sizeof msg[k], "%s", st ? rf_error_msg() : "(passed)");
    }
    RF_CHECK(strstr(msg[1], "layers.1.down") && strstr(msg[1], "rows [0, 40)") && strcmp(msg[0], msg[1]) == 0,
             "%s: a NaN fails the gather alike: cpu '%s', checked '%s'", va->name, msg[0], msg[1]);
  }
  for (int k = 0; k < 2; k++) {
    rf_optim_free(o[k]);
    rf_fsdp_free(f[k]);
    free(b[k].p);
  }
  free(host);
}

static void check_refusals(void) {
  struct rf_device host;
  rf_device_host_init(&host, NULL);
  struct rf_device_ops ops = *host.ops;
  ops.launch = NULL; /* as the CUDA table: its kernels, not host code */
  ops.view = NULL;
  struct rf_backend cuda = rf_backend_cpu;
  cuda.name = "cuda";
  struct rf_device dev = host;
  dev.ops = &ops;
  dev.backend = &cuda;
  struct rf_device_stream *stream = rf_device_stream_create(&dev);
  for (int k = 0; k < 4; k++) {
    struct rf_optim_options oo;
    rf_optim_options_default(&oo);
    oo.kind = (enum rf_optim_kind)k;
    struct rf_optim *o = NULL;
    int rc = rf_optim_create_on(&o, &oo, NULL, NULL, 0, 0, NULL, &dev, stream);
    char want[96];
    snprintf(want, sizeof want, "--optim %s: not on device cuda yet", rf_optim_kind_name(oo.kind));
    if (oo.kind == RF_OPTIM_KIND_ADAMW)
      RF_CHECK(rc == 0 && o, "adamw made on a device without host code: %s", rc ? rf_error_msg() : "");
    else
      RF_CHECK(rc != 0 && !o && strstr(rf_error_msg(), want), "%s refused: %s", want,
               rc ? rf_error_msg() : "(made)");
    rf_optim_free(o);
  }
  rf_device_stream_free(&dev, stream);
}

int main(int argc, char **argv) {
  g_rank = rf_test_mpi_init(&argc, &argv, &g_world);
  check_refusals();
  for (int i = 0; i < N_VARIANTS; i++) {
    const struct variant *va = &variants[i];
    MPI_Comm shard = MPI_COMM_WORLD, replicate = MPI_COMM_SELF;
    if (va->replicas > 1) {
      if (g_world != 4) continue; /* 2 x 2 */
      MPI_Comm_split(MPI_COMM_WORLD, g_rank / 2, g_rank, &shard);
      MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &replicate);
    }
    run(va, shard, replicate);
    if (va->replicas > 1) {
      MPI_Comm_free(&shard);
      MPI_Comm_free(&replicate);
    }
    if (g_rank == 0) printf("  %s: checked = cpu at W = %d\n", va->name, g_world);
  }
  return rf_test_finish("test_fsdp_checked");
}
