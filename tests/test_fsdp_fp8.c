/* rf-test: np=1,2,3,5,7 timeout=120 */
/* FP8 block mode of the runtime (docs/fp8.md): in the planned layout every rank
 * quantizes its own 128x128 tiles before the gather; in the fsdp2 and flat layouts
 * (whose boundaries cut tiles) every rank quantizes each whole tensor after a
 * param-dtype gather. Either way the e4m3 codes and f32 scales are bit for bit
 * those of rf_fp8_quantize on the whole tensor on one rank (the reference: a
 * context on MPI_COMM_SELF without FP8 gathers the f32 tensor, quantized here;
 * fsdp2 and flat with a bf16 param dtype quantize the gathered bf16 values, so
 * the reference quantizes the tensor rounded to bf16). Matrices of 256, 64 (one
 * partial band), 200 x 200 (partial tiles along both dimensions) and 384 rows, next
 * to vectors gathered in the param dtype (f32 or bf16, compared with the reference
 * cast), and fused experts [3, 200, 136] (each expert's matrix tiled on its own);
 * equal and ragged shards, scales amax/448 and powers of two. A NaN in a master on
 * the rank that owns it: every rank's gather fails with the tensor and the rows
 * named, in every layout, and no step allocates after the first gather. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"
#include "rfsdp_mpi.h"

struct spec {
  const char *name;
  int ndim;
  int64_t rows, cols;
  int fp8;
  int64_t experts; /* ndim 3: fused experts [experts, rows, cols], each tiled on its own */
};
static const struct spec unit_a[] = {{"a.norm", 1, 200, 1, 0, 1},
                                     {"a.q", 2, 256, 128, 1, 1},
                                     {"a.k", 2, 64, 128, 1, 1},
                                     {"a.odd", 2, 200, 200, 1, 1},
                                     {"a.bias", 1, 37, 1, 0, 1}};
static const struct spec unit_b[] = {{"b.down", 2, 128, 384, 1, 1},
                                     {"b.up", 2, 384, 128, 1, 1},
                                     {"b.norm", 1, 128, 1, 0, 1},
                                     {"b.experts", 3, 200, 136, 1, 3}};
static const struct {
  const struct spec *t;
  int n;
} units[] = {{unit_a, 5}, {unit_b, 4}};

static int64_t n_experts(const struct spec *s) { return s->ndim == 3 ? s->experts : 1; }
#define N_UNITS 2

static struct rf_fsdp *make(MPI_Comm comm, const struct rf_fsdp_options *opt) {
  struct rf_fsdp *f = NULL;
  RF_ASSERT(rf_fsdp_create(&f, comm, opt) == 0);
  for (int u = 0; u < N_UNITS; u++) {
    int unit = rf_fsdp_add_unit(f, u == 0 ? "a" : "b");
    for (int i = 0; i < units[u].n; i++) {
      const struct spec *s = &units[u].t[i];
      int64_t mat[2] = {s->rows, s->cols}, fused[3] = {s->experts, s->rows, s->cols};
      const int64_t *shape = s->ndim == 3 ? fused : mat;
      /* normal values of varied size per tensor, so that the tiles' scales differ */
      int t = rf_fsdp_add_tensor(f, unit, s->name, s->ndim, shape, 0,
                                 (struct rf_init){RF_INIT_NORMAL, 0.01f * (float)(i + 1)});
      RF_ASSERT(t >= 0);
      if (s->fp8) RF_ASSERT(rf_fsdp_set_fp8(f, t) == 0);
    }
  }
  if (rf_fsdp_finalize(f) != 0) RF_DIE("%s", rf_fsdp_error());
  return f;
}

static const char *layout_name(enum rf_layout layout) {
  return layout == RF_LAYOUT_PLANNED ? "planned" : layout == RF_LAYOUT_FSDP2 ? "fsdp2" : "flat";
}

static void check_variant(enum rf_layout layout, enum rf_shard_mode shard, int pow2, enum rf_dtype pdt) {
  char what[96];
  snprintf(what, sizeof what, "%s %s pow2=%d param %s", layout_name(layout),
           shard == RF_SHARD_MODE_EQUAL ? "equal" : "ragged", pow2, rf_dtype_name(pdt));
  struct rf_fsdp_options opt, ref_opt;
  rf_fsdp_options_default(&opt);
  opt.layout = layout;
  opt.shard = shard;
  opt.param_dtype = pdt;
  opt.fp8 = 1;
  opt.fp8_pow2 = pow2;
  rf_fsdp_options_default(&ref_opt);
  struct rf_fsdp *f = make(MPI_COMM_WORLD, &opt), *ref = make(MPI_COMM_SELF, &ref_opt);
  for (int round = 0; round < 2; round++) { /* the second gathers into reused slots */
    struct rf_counters before, after;
    rf_fsdp_get_counters(f, &before, NULL);
    for (int u = 0; u < N_UNITS; u++) {
      rf_fsdp_forward_begin(f, u);
      rf_fsdp_forward_begin(ref, u);
      RF_CHECK(rf_fsdp_status(f) == 0, "%s: gather failed: %s", what, rf_fsdp_error());
      for (int i = 0; i < units[u].n; i++) {
        const struct spec *s = &units[u].t[i];
        int t = rf_fsdp_find_tensor(f, s->name);
        const float *full = rf_fsdp_param(ref, t);
        int64_t n = n_experts(s) * s->rows * s->cols;
        if (!s->fp8) {
          const float *p32 = rf_fsdp_param(f, t);
          const uint16_t *p16 = rf_fsdp_param_bf16(f, t);
          int same = 1;
          for (int64_t e = 0; e < n; e++)
            same &=
                pdt == RF_DTYPE_F32 ? memcmp(&p32[e], &full[e], 4) == 0 : p16[e] == rf_bf16_from_f32(full[e]);
          RF_CHECK(same, "%s: %s gathered in %s differs from the reference", what, s->name,
                   rf_dtype_name(pdt));
          continue;
        }
        struct rf_fp8_grid g = {s->rows, s->cols, RF_FP8_TILE, RF_FP8_TILE};
        int64_t per = s->rows * s->cols, per_tiles = rf_fp8_grid_tiles(&g), tiles = n_experts(s) * per_tiles;
        uint8_t *codes = malloc((size_t)n); /* not counted: the runtime's allocations are */
        float *scales = malloc((size_t)tiles * sizeof(float));
        float *rounded = malloc((size_t)n * sizeof(float)); /* what a bf16 gather delivers */
        RF_ASSERT(codes && scales && rounded);
        for (int64_t e = 0; e < n; e++)
          rounded[e] = layout != RF_LAYOUT_PLANNED && pdt == RF_DTYPE_BF16
                           ? rf_f32_from_bf16(rf_bf16_from_f32(full[e]))
                           : full[e];
        for (int64_t x = 0; x < n_experts(s); x++) /* each expert's matrix on its own */
          RF_ASSERT(rf_fp8_quantize(&g, rounded + x * per, pow2, s->name, codes + x * per,
                                    scales + x * per_tiles) == 0);
        const float *got_scales = NULL;
        const uint8_t *got = rf_fsdp_param_fp8(f, t, &got_scales);
        RF_CHECK(got && got_scales && !rf_fsdp_param(f, t) && !rf_fsdp_param_bf16(f, t),
                 "%s: %s has an FP8 view only", what, s->name);
        if (got) {
          RF_CHECK(memcmp(got, codes, (size_t)n) == 0, "%s round %d: %s codes differ", what, round, s->name);
          RF_CHECK(memcmp(got_scales, scales, (size_t)tiles * sizeof(float)) == 0, "%s: %s scales differ",
                   what, s->name);
        }
        int varied = 0; /* the data makes distinct scales (a check of the check) */
        for (int64_t k = 1; k < tiles; k++) varied |= scales[k] != scales[0];
        RF_CHECK(varied || tiles == 1 || pow2, "%s: %s: all %lld scales equal", what, s->name,
                 (long long)tiles);
        free(codes);
        free(scales);
        free(rounded);
      }
      rf_fsdp_forward_end(f, u);
      rf_fsdp_forward_end(ref, u);
    }
    rf_fsdp_reshard_all(f);
    rf_fsdp_reshard_all(ref);
    rf_fsdp_get_counters(f, &after, NULL);
    struct rf_counters d = rf_counters_diff(&after, &before);
    if (round == 1)
      RF_CHECK(d.allocations == 0, "%s: %llu allocations", what, (unsigned long long)d.allocations);
  }
  rf_fsdp_free(f);
  rf_fsdp_free(ref);
}

/* A NaN in a.odd's master, row 150, on the rank that owns it: every rank fails. */
static void check_nan(enum rf_layout layout, int rank, int world, float bad) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = layout;
  opt.shard = RF_SHARD_MODE_RAGGED;
  opt.fp8 = 1;
  struct rf_fsdp *f = make(MPI_COMM_WORLD, &opt);
  int t = rf_fsdp_find_tensor(f, "a.odd");
  struct rf_tensor_view v;
  rf_fsdp_tensor(f, t, &v);
  int64_t e = 150 * 200 + 7;
  if (e >= v.begin && e < v.end) v.master[e - v.begin] = bad;
  rf_fsdp_forward_begin(f, 0);
  int rc = rf_fsdp_status(f);
  const char *msg = rf_fsdp_error();
  RF_CHECK(rc != 0 && strstr(msg, "'a.odd'") && strstr(msg, "rows [128, 200)"),
           "%s W=%d rank %d: a NaN in a.odd: rc %d, %s", layout_name(layout), world, rank, rc, rc ? msg : "");
  int all = rc != 0, every = 0;
  MPI_Allreduce(&all, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  RF_CHECK(every == 1, "%s W=%d: not every rank refused the NaN", layout_name(layout), world);
  rf_fsdp_forward_end(f, 0);
  rf_fsdp_reshard_all(f);
  rf_fsdp_free(f);
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  check_variant(RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, 0, RF_DTYPE_F32);
  check_variant(RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 0, RF_DTYPE_F32);
  check_variant(RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, 1, RF_DTYPE_BF16);
  check_variant(RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 1, RF_DTYPE_BF16);
  check_nan(RF_LAYOUT_PLANNED, rank, world, NAN);
  check_nan(RF_LAYOUT_PLANNED, rank, world, -INFINITY);
  /* fsdp2 and flat (FSDP1) cut tiles: gathered in the param dtype, quantized after */
  for (int layout = RF_LAYOUT_FSDP2; layout <= RF_LAYOUT_FLAT; layout++) {
    check_variant((enum rf_layout)layout, RF_SHARD_MODE_EQUAL, 0, RF_DTYPE_F32);
    check_variant((enum rf_layout)layout, RF_SHARD_MODE_EQUAL, 1, RF_DTYPE_BF16);
    check_variant((enum rf_layout)layout, RF_SHARD_MODE_EQUAL, 0, RF_DTYPE_BF16);
    check_nan((enum rf_layout)layout, rank, world, NAN);
    check_nan((enum rf_layout)layout, rank, world, INFINITY);
  }
  return rf_test_finish("test_fsdp_fp8");
}
