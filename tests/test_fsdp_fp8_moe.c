/* rf-test: np=1,2,3,5,7 timeout=120 */
/* FP8 block mode of the runtime on fused experts [E, rows, cols] (docs/fp8.md): each
 * expert's matrix is tiled on its own (its last band partial when rows is not a
 * multiple of 128), the scales expert-major. The gathered e4m3 codes and f32 scales
 * are bit for bit those of rf_fp8_quantize on each expert's matrix on one rank (the
 * reference: a context on MPI_COMM_SELF without FP8 gathers the f32 tensor, each
 * expert quantized here). Experts of 200 rows (whole experts per rank: a 128-row
 * band and a 72-row one each, partial tiles along the columns too), of 128 rows (one
 * band) and of 384 rows (three bands, so ranks may split an expert between bands),
 * next to a matrix, a router and a vector in the param dtype; equal and ragged
 * shards, amax/448 and power-of-two scales. Every rank's range of an FP8 tensor
 * starts on a band of an expert. The model's slice of each expert (rf_model_moe_expert_weight,
 * what src/model/moe.c multiplies with) is exactly that expert's codes and scales. A NaN in expert 1's second
 * band on the rank that owns it: every rank's gather fails naming the tensor, the expert and the rows. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/model.h"
#include "rf_test.h"
#include "rfsdp_mpi.h"

struct spec {
  const char *name;
  int ndim;
  int64_t shape[3];
  int fp8;
};
static const struct spec unit_a[] = {{"a.norm", 1, {136}, 0},
                                     {"a.router", 2, {4, 136}, 0},
                                     {"a.gate_up", 3, {3, 200, 136}, 1},
                                     {"a.down", 3, {3, 128, 100}, 1}};
static const struct spec unit_b[] = {{"b.q", 2, {200, 64}, 1}, {"b.experts", 3, {2, 384, 64}, 1}};
static const struct {
  const struct spec *t;
  int n;
} units[] = {{unit_a, 4}, {unit_b, 2}};
#define N_UNITS 2

static int64_t numel(const struct spec *s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
  return n;
}

static struct rf_fsdp *make(MPI_Comm comm, const struct rf_fsdp_options *opt) {
  struct rf_fsdp *f = NULL;
  RF_ASSERT(rf_fsdp_create(&f, comm, opt) == 0);
  for (int u = 0; u < N_UNITS; u++) {
    int unit = rf_fsdp_add_unit(f, u == 0 ? "a" : "b");
    for (int i = 0; i < units[u].n; i++) {
      const struct spec *s = &units[u].t[i];
      /* normal values of varied size per tensor, so that the tiles' scales differ */
      int t = rf_fsdp_add_tensor(f, unit, s->name, s->ndim, s->shape, 0,
                                 (struct rf_init){RF_INIT_NORMAL, 0.01f * (float)(i + 1)});
      RF_ASSERT(t >= 0);
      if (s->fp8) RF_ASSERT(rf_fsdp_set_fp8(f, t) == 0);
    }
  }
  if (rf_fsdp_finalize(f) != 0) RF_DIE("%s", rf_fsdp_error());
  return f;
}

/* Every rank's range of an FP8 tensor begins on a band of one expert's matrix. */
static void check_ranges(struct rf_fsdp *f, const struct spec *s, int world, const char *what) {
  struct rf_tensor_view v;
  rf_fsdp_tensor(f, rf_fsdp_find_tensor(f, s->name), &v);
  int64_t cols = s->shape[s->ndim - 1], per = s->shape[s->ndim - 2] * cols, begin = v.begin;
  int on_band = begin == numel(s) || begin % per % (128 * cols) == 0, all = 0;
  MPI_Allreduce(&on_band, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  RF_CHECK(all, "%s: W=%d: a rank's range of %s starts inside a band (here: element %lld)", what, world,
           s->name, (long long)begin);
}

/* tensor s quantized expert by expert from its f32 values: codes and expert-major scales. */
static int64_t quantize_experts(const struct spec *s, const float *full, int pow2, uint8_t *codes,
                                float *scales) {
  int64_t experts = s->ndim == 3 ? s->shape[0] : 1, tiles = 0;
  struct rf_fp8_grid g = {s->shape[s->ndim - 2], s->shape[s->ndim - 1], RF_FP8_TILE, RF_FP8_TILE};
  int64_t per = g.rows * g.cols;
  for (int64_t e = 0; e < experts; e++) {
    RF_ASSERT(rf_fp8_quantize(&g, full + e * per, pow2, s->name, codes + e * per, scales + tiles) == 0);
    tiles += rf_fp8_grid_tiles(&g);
  }
  return tiles;
}

/* The model's slice of each expert (rf_model_moe_expert_weight, what src/model/moe.c
 * multiplies with) out of the gathered codes and scales: exactly the codes and scales
 * of that expert quantized on its own. */
static void check_expert_slices(const struct spec *s, const float *full, int pow2, const uint8_t *got,
                                const float *got_scales, const char *what) {
  int64_t experts = s->ndim == 3 ? s->shape[0] : 1;
  struct rf_fp8_grid g = {s->shape[s->ndim - 2], s->shape[s->ndim - 1], RF_FP8_TILE, RF_FP8_TILE};
  int64_t per = g.rows * g.cols, tiles = rf_fp8_grid_tiles(&g);
  uint8_t *codes = malloc((size_t)per);
  float *scales = malloc((size_t)tiles * sizeof(float));
  RF_ASSERT(codes && scales);
  struct rf_model_weight w = {.fp8 = got, .fp8_scales = got_scales};
  for (int64_t e = 0; e < experts; e++) {
    RF_ASSERT(rf_fp8_quantize(&g, full + e * per, pow2, s->name, codes, scales) == 0);
    struct rf_model_weight x = rf_model_moe_expert_weight(&w, (int)e, (int)g.rows, (int)g.cols);
    RF_CHECK(x.fp8 && memcmp(x.fp8, codes, (size_t)per) == 0 &&
                 memcmp(x.fp8_scales, scales, (size_t)tiles * sizeof(float)) == 0,
             "%s: %s: the model's slice of expert %lld is not that expert's codes and scales", what, s->name,
             (long long)e);
  }
  free(codes);
  free(scales);
}

static void check_variant(enum rf_shard_mode shard, int pow2, enum rf_dtype pdt, int world) {
  char what[96];
  snprintf(what, sizeof what, "%s pow2=%d param %s", shard == RF_SHARD_MODE_EQUAL ? "equal" : "ragged", pow2,
           rf_dtype_name(pdt));
  struct rf_fsdp_options opt, ref_opt;
  rf_fsdp_options_default(&opt);
  opt.shard = shard;
  opt.param_dtype = pdt;
  opt.fp8 = 1;
  opt.fp8_pow2 = pow2;
  rf_fsdp_options_default(&ref_opt);
  struct rf_fsdp *f = make(MPI_COMM_WORLD, &opt), *ref = make(MPI_COMM_SELF, &ref_opt);
  for (int u = 0; u < N_UNITS; u++) {
    rf_fsdp_forward_begin(f, u);
    rf_fsdp_forward_begin(ref, u);
    RF_CHECK(rf_fsdp_status(f) == 0, "%s: gather failed: %s", what, rf_fsdp_error());
    for (int i = 0; i < units[u].n; i++) {
      const struct spec *s = &units[u].t[i];
      int t = rf_fsdp_find_tensor(f, s->name);
      const float *full = rf_fsdp_param(ref, t);
      int64_t n = numel(s);
      if (!s->fp8) {
        const float *p32 = rf_fsdp_param(f, t);
        const uint16_t *p16 = rf_fsdp_param_bf16(f, t);
        int same = 1;
        for (int64_t e = 0; e < n; e++)
          same &=
              pdt == RF_DTYPE_F32 ? memcmp(&p32[e], &full[e], 4) == 0 : p16[e] == rf_bf16_from_f32(full[e]);
        RF_CHECK(same, "%s: %s gathered in %s differs from the reference", what, s->name, rf_dtype_name(pdt));
        continue;
      }
      check_ranges(f, s, world, what);
      uint8_t *codes = malloc((size_t)n);
      float *scales = malloc((size_t)n * sizeof(float)); /* more than enough */
      RF_ASSERT(codes && scales);
      int64_t tiles = quantize_experts(s, full, pow2, codes, scales);
      const float *got_scales = NULL;
      const uint8_t *got = rf_fsdp_param_fp8(f, t, &got_scales);
      RF_CHECK(got && got_scales && !rf_fsdp_param(f, t) && !rf_fsdp_param_bf16(f, t),
               "%s: %s has an FP8 view only", what, s->name);
      if (got) {
        RF_CHECK(memcmp(got, codes, (size_t)n) == 0, "%s: %s codes differ", what, s->name);
        RF_CHECK(memcmp(got_scales, scales, (size_t)tiles * sizeof(float)) == 0, "%s: %s scales differ", what,
                 s->name);
        check_expert_slices(s, full, pow2, got, got_scales, what);
      }
      int varied = 0; /* the data makes distinct scales (a check of the check) */
      for (int64_t k = 1; k < tiles; k++) varied |= scales[k] != scales[0];
      RF_CHECK(varied || pow2, "%s: %s: all %lld scales equal", what, s->name, (long long)tiles);
      free(codes);
      free(scales);
    }
    rf_fsdp_forward_end(f, u);
    rf_fsdp_forward_end(ref, u);
  }
  rf_fsdp_reshard_all(f);
  rf_fsdp_reshard_all(ref);
  rf_fsdp_free(f);
  rf_fsdp_free(ref);
}

/* A NaN (or an infinity) in a.gate_up's master, expert 1, row 150, on the rank that owns it. */
static void check_nan(int rank, int world, enum rf_shard_mode shard, float bad) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.shard = shard;
  opt.fp8 = 1;
  struct rf_fsdp *f = make(MPI_COMM_WORLD, &opt);
  int t = rf_fsdp_find_tensor(f, "a.gate_up");
  struct rf_tensor_view v;
  rf_fsdp_tensor(f, t, &v);
  int64_t e = (200 + 150) * 136 + 7;
  if (e >= v.begin && e < v.end) v.master[e - v.begin] = bad;
  rf_fsdp_forward_begin(f, 0);
  int rc = rf_fsdp_status(f);
  const char *msg = rf_fsdp_error();
  RF_CHECK(rc != 0 && strstr(msg, "'a.gate_up'") && strstr(msg, "expert 1's rows [128, 200)"),
           "W=%d rank %d: a NaN in a.gate_up: rc %d, %s", world, rank, rc, rc ? msg : "");
  int all = rc != 0, every = 0;
  MPI_Allreduce(&all, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  RF_CHECK(every == 1, "W=%d: not every rank refused the NaN", world);
  rf_fsdp_forward_end(f, 0);
  rf_fsdp_reshard_all(f);
  rf_fsdp_free(f);
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  check_variant(RF_SHARD_MODE_RAGGED, 0, RF_DTYPE_F32, world);
  check_variant(RF_SHARD_MODE_EQUAL, 0, RF_DTYPE_F32, world);
  check_variant(RF_SHARD_MODE_RAGGED, 1, RF_DTYPE_BF16, world);
  check_variant(RF_SHARD_MODE_EQUAL, 1, RF_DTYPE_BF16, world);
  check_nan(rank, world, RF_SHARD_MODE_RAGGED, NAN);
  check_nan(rank, world, RF_SHARD_MODE_EQUAL, INFINITY);
  /* a tensor of 4 dimensions is not a matrix nor fused experts */
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.fp8 = 1;
  struct rf_fsdp *f = NULL;
  RF_ASSERT(rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) == 0);
  int64_t shape[4] = {2, 2, 128, 128};
  int t = rf_fsdp_add_tensor(f, rf_fsdp_add_unit(f, "c"), "c.conv", 4, shape, 0,
                             (struct rf_init){RF_INIT_ZEROS, 0});
  RF_CHECK(
      rf_fsdp_set_fp8(f, t) != 0 && strstr(rf_fsdp_error(), "c.conv") && strstr(rf_fsdp_error(), "ndim 4"),
      "a 4-D tensor marked FP8: %s", rf_fsdp_error());
  rf_fsdp_free(f);
  return rf_test_finish("test_fsdp_fp8_moe");
}
