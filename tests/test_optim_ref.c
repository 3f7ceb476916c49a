/* rf-test: timeout=60
 * The optimizers against the peers, on identical inputs, from reference values
 * written by tests/ref_optim.py (tests/data/optim_ref.bin; no Python needed here):
 *   - AdamW vs torch.optim.AdamW, 5 steps, a 33 x 40 matrix with weight decay and
 *     a 40-vector without, tiny gradients so eps matters: parameters and moments
 *     within 1e-5 relative (of max(|x|, 0.01) for w and m: values are O(0.1-1));
 *   - Muon vs torch.optim.Muon (match_rms_adamw, Nesterov), 2 steps on a 64 x 96
 *     and a 96 x 64 matrix: against its Newton-Schulz patched to f32 the parameter
 *     change agrees within 1e-4 of its size; against the shipped bf16
 *     Newton-Schulz within 5% (bf16 rounding), both differences printed;
 *   - 8-bit AdamW vs bitsandbytes' AdamW8bit (CPU), each kernel built here (the
 *     portable one always, the AVX-512 one where compiled for it), 3 steps on 8192 elements
 *     (blocks of 256 as bitsandbytes, then 32 x 32 tiles): the maps agree to
 *     1e-6; step 1 parameters within 1e-5 relative; step 1 absmax equal; where
 *     step 1 codes differ ours decodes at least as close (their CPU search is
 *     approximate); after 3 steps our distance to f32 AdamW is at most 1.25x
 *     theirs and our distance to theirs at most 2x theirs to f32 AdamW;
 *   - the same 3 steps each started from bitsandbytes' own parameters, codes and
 *     absmax of the step before, compared scale for scale (absmax within 1e-6),
 *     code for code (ours the nearest to bitsandbytes' moment; its own code, where
 *     it differs, within its search's 2^-15) and per element (every parameter within
 *     2.5e-7 of its size plus 1e-5 of its change of bitsandbytes'). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "model/model.h"
#include "optim/optim.h"
#include "rf_test.h"

#define REF_PATH "tests/data/optim_ref.bin"
#define MAX_REC 64

struct rec {
  char name[128];
  uint32_t dtype, ndim;
  int64_t shape[4], numel;
  void *data; /* owned copy, aligned */
};

static struct rec recs[MAX_REC];
static int n_recs;
static char *blob;

static int ref_load(void) {
  size_t bytes;
  RF_TRY(rf_file_read_all(REF_PATH, &blob, &bytes));
  size_t pos = 16;
  RF_REQUIRE(bytes >= 16 && memcmp(blob, "RFOPTREF", 8) == 0, "%s: not an optimizer reference file",
             REF_PATH);
  uint32_t version, n;
  memcpy(&version, blob + 8, 4);
  memcpy(&n, blob + 12, 4);
  RF_REQUIRE(version == 1 && n <= MAX_REC, "%s: version %u, %u records", REF_PATH, version, n);
  for (uint32_t i = 0; i < n; i++) {
    struct rec *r = &recs[n_recs++];
    uint32_t len;
    RF_REQUIRE(pos + 4 <= bytes, "%s: truncated", REF_PATH);
    memcpy(&len, blob + pos, 4);
    RF_REQUIRE(len < sizeof r->name && pos + 12 + len <= bytes, "%s: truncated record %u", REF_PATH, i);
    memcpy(r->name, blob + pos + 4, len);
    r->name[len] = 0;
    pos += 4 + len;
    memcpy(&r->dtype, blob + pos, 4);
    memcpy(&r->ndim, blob + pos + 4, 4);
    pos += 8;
    RF_REQUIRE(r->ndim <= 4 && pos + 8 * r->ndim <= bytes, "%s: %s: bad shape", REF_PATH, r->name);
    r->numel = 1;
    for (uint32_t d = 0; d < r->ndim; d++) {
      memcpy(&r->shape[d], blob + pos, 8);
      r->numel *= r->shape[d];
      pos += 8;
    }
    size_t sz = (size_t)r->numel * (r->dtype == 3 ? 1 : 4);
    RF_REQUIRE(pos + sz <= bytes, "%s: %s: truncated data", REF_PATH, r->name);
    r->data = rf_xmalloc(sz + 1); /* the file's records are not aligned */
    memcpy(r->data, blob + pos, sz);
    pos += sz;
  }
  return 0;
}

static const struct rec *ref_find(const char *name, int64_t numel) {
  for (int i = 0; i < n_recs; i++)
    if (strcmp(recs[i].name, name) == 0) {
      RF_ASSERT(numel < 0 || recs[i].numel == numel);
      return &recs[i];
    }
  return NULL;
}

static const float *ref_f32(const char *name, int64_t numel) {
  const struct rec *r = ref_find(name, numel);
  if (r && r->dtype == 0) return r->data;
  RF_DIE("%s: no f32 record %s (rerun tests/ref_optim.py)", REF_PATH, name);
}

static const uint8_t *ref_u8(const char *name, int64_t numel) {
  const struct rec *r = ref_find(name, numel);
  if (r && r->dtype == 3) return r->data;
  RF_DIE("%s: no u8 record %s (rerun tests/ref_optim.py)", REF_PATH, name);
}

/* A single-rank view of a whole tensor at `off` of the slabs. */
static void view_whole(struct rf_tensor_view *v, const char *name, int ndim, int64_t d0, int64_t d1,
                       float *master, float *grad, int64_t off, int64_t *starts) {
  memset(v, 0, sizeof *v);
  v->name = name;
  v->ndim = ndim;
  v->shape[0] = d0;
  v->shape[1] = d1;
  v->numel = ndim == 1 ? d0 : d0 * d1;
  v->block_elems = 1;
  starts[0] = 0;
  starts[1] = v->numel;
  v->starts = starts;
  v->begin = 0;
  v->end = v->numel;
  v->shard_offset = off;
  v->master = master + off;
  v->grad = grad + off;
}

static void test_adamw(void) {
  float master[33 * 40 + 40], grad[33 * 40 + 40];
  struct rf_tensor_view v[2];
  int64_t st[2][2];
  view_whole(&v[0], "w", 2, 33, 40, master, grad, 0, st[0]);
  view_whole(&v[1], "b", 1, 40, 0, master, grad, 33 * 40, st[1]);
  memcpy(master, ref_f32("adamw.w.p0", 1320), 1320 * sizeof(float));
  memcpy(master + 1320, ref_f32("adamw.b.p0", 40), 40 * sizeof(float));
  const float *gw = ref_f32("adamw.w.g", 5 * 1320), *gb = ref_f32("adamw.b.g", 5 * 40);
  struct rf_optim_options opt;
  rf_optim_options_default(&opt);
  int flags[2] = {RF_OPTIM_FLAG_DECAY, 0};
  struct rf_optim *o;
  RF_ASSERT(rf_optim_create(&o, &opt, v, flags, 2, 1360, NULL) == 0);
  for (int s = 0; s < 5; s++) {
    memcpy(grad, gw + s * 1320, 1320 * sizeof(float));
    memcpy(grad + 1320, gb + s * 40, 40 * sizeof(float));
    rf_optim_step(o, 1e-2f);
  }
  struct rf_optim_state_slab m, vv;
  rf_optim_state(o, 0, &m);
  rf_optim_state(o, 1, &vv);
  double dw = rf_test_max_rel_diff(master, ref_f32("adamw.w.p", 1320), 1320, 1e-2);
  double db = rf_test_max_rel_diff(master + 1320, ref_f32("adamw.b.p", 40), 40, 1e-3);
  double dm = rf_test_max_rel_diff(m.data, ref_f32("adamw.w.m", 1320), 1320, 1e-2);
  double dv = rf_test_max_rel_diff(vv.data, ref_f32("adamw.w.v", 1320), 1320, 1e-4);
  printf("adamw vs torch.optim.AdamW, 5 steps: max rel diff w %.3g, b %.3g, m %.3g, v %.3g\n", dw, db, dm,
         dv);
  RF_CHECK(dw <= 1e-5 && db <= 1e-5 && dm <= 1e-5 && dv <= 1e-5, "AdamW differs from PyTorch");
  RF_CHECK(strcmp(m.name, "m") == 0 && m.count == 1360 && m.shard_layout == 1, "state slab m");
  rf_optim_free(o);
}

/* max |a - b| over max |b - p0|: the difference relative to the size of the change. */
static double change_diff(const float *a, const float *b, const float *p0, int64_t n) {
  double d = 0, c = 0;
  for (int64_t i = 0; i < n; i++) {
    d = rf_test_max(d, fabs((double)a[i] - b[i]));
    c = rf_test_max(c, fabs((double)b[i] - p0[i]));
  }
  return d / c;
}

/* The groups the trainer gives the optimizer come from the model's description
 * (decay, matrix); for LLaMA they are the groups the optimizer used to derive from
 * the names itself: no decay for vectors and names with "norm", "embed" or
 * "bias"; Muon for 2-D tensors whose name has none of "embed", "head", "norm". */
static void test_model_groups(void) {
  const char *json =
      "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 40, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 64, \"max_position_embeddings\": 64}";
  struct rf_model_config cfg;
  RF_ASSERT(rf_model_config_parse(&cfg, json, strlen(json), "test") == 0);
  struct rf_model_desc d;
  rf_model_desc_make(&cfg, &d);
  int n = 0, bad = 0;
  for (int u = 0; u < d.n_units; u++)
    for (int i = 0; i < d.units[u].n_tensors; i++, n++) {
      const struct rf_model_tensor *t = &d.units[u].tensors[i];
      int special = strstr(t->name, "norm") || strstr(t->name, "embed");
      int decay = t->ndim >= 2 && !special && !strstr(t->name, "bias");
      int matrix = t->ndim == 2 && !special && !strstr(t->name, "head");
      if (!!t->decay != decay || !!t->matrix != matrix) {
        printf("  %s: decay %d matrix %d, expected %d %d\n", t->name, t->decay, t->matrix, decay, matrix);
        bad++;
      }
    }
  RF_CHECK(n == 2 + 9 * 2 + 1 && bad == 0, "LLaMA groups: %d of %d tensors differ", bad, n);
  rf_model_desc_free(&d);
}

static void test_muon(const struct rf_comm *self) {
  const char *names[2] = {"wide", "tall"};
  int64_t shapes[2][2] = {{64, 96}, {96, 64}};
  for (int k = 0; k < 2; k++) {
    char key[64];
    int64_t n = shapes[k][0] * shapes[k][1];
    float *master = rf_xmalloc((size_t)n * sizeof(float)), *grad = rf_xmalloc((size_t)n * sizeof(float));
    struct rf_tensor_view v;
    int64_t st[2];
    view_whole(&v, "layers.0.w", 2, shapes[k][0], shapes[k][1], master, grad, 0, st);
    snprintf(key, sizeof key, "muon.%s.p0", names[k]);
    const float *p0 = ref_f32(key, n);
    memcpy(master, p0, (size_t)n * sizeof(float));
    snprintf(key, sizeof key, "muon.%s.g", names[k]);
    const float *g = ref_f32(key, 2 * n);
    struct rf_optim_options opt;
    rf_optim_options_default(&opt);
    opt.kind = RF_OPTIM_KIND_MUON;
    int flags = RF_OPTIM_FLAG_MATRIX | RF_OPTIM_FLAG_DECAY;
    struct rf_optim *o;
    RF_ASSERT(rf_optim_create(&o, &opt, &v, &flags, 1, n, self) == 0);
    for (int s = 0; s < 2; s++) {
      memcpy(grad, g + s * n, (size_t)n * sizeof(float));
      rf_optim_step(o, 2e-2f);
    }
    snprintf(key, sizeof key, "muon.%s.p_f32", names[k]);
    double d32 = change_diff(master, ref_f32(key, n), p0, n);
    snprintf(key, sizeof key, "muon.%s.p_bf16", names[k]);
    double d16 = change_diff(master, ref_f32(key, n), p0, n);
    printf(
        "muon %s %lldx%lld vs torch.optim.Muon, 2 steps: max diff / max change: f32 Newton-Schulz %.3g, "
        "bf16 (as shipped) %.3g\n",
        names[k], (long long)shapes[k][0], (long long)shapes[k][1], d32, d16);
    RF_CHECK(d32 <= 1e-4, "Muon %s differs from torch.optim.Muon with f32 Newton-Schulz: %.3g", names[k],
             d32);
    RF_CHECK(d16 <= 5e-2, "Muon %s differs from torch.optim.Muon (bf16): %.3g", names[k], d16);
    RF_CHECK(rf_optim_muon_count(o, 0) == 2, "orthogonalized %lld times",
             (long long)rf_optim_muon_count(o, 0));
    rf_optim_free(o);
    free(master);
    free(grad);
  }
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; i++) d = rf_test_max(d, fabs((double)a[i] - b[i]));
  return d;
}

/* Step 1's codes against bitsandbytes': equal absmax; where a code differs, ours
 * decodes at least as close to the f32 moment as theirs (ours is the exact
 * nearest; their CPU search is approximate). Returns the number of differing codes. */
static long check_step1_codes(const struct rf_optim *o, const float *grad) {
  enum { N = 64 * 128 };
  struct rf_optim_state_slab s[4];
  for (int i = 0; i < 4; i++) rf_optim_state(o, i, &s[i]);
  double da = rf_test_max(rf_test_max_rel_diff(s[2].data, ref_f32("bnb.absmax1_1", N / 256), N / 256, 1e-30),
                          rf_test_max_rel_diff(s[3].data, ref_f32("bnb.absmax2_1", N / 256), N / 256, 1e-30));
  RF_CHECK(da <= 1e-6, "step 1 absmax differs from bitsandbytes: %.3g", da);
  long differ = 0, worse = 0;
  for (int k = 0; k < 2; k++) {
    const uint8_t *mine = s[k].data, *theirs = ref_u8(k ? "bnb.state2_1" : "bnb.state1_1", N);
    const float *map = rf_optim_qmap(!k), *absmax = s[2 + k].data;
    for (int i = 0; i < N; i++) {
      if (mine[i] == theirs[i]) continue;
      differ++;
      float g = grad[i], x = k ? 0.05f * g * g : 0.1f * g; /* the f32 moment after step 1 */
      double em = fabs(map[mine[i]] * absmax[i / 256] - x), et = fabs(map[theirs[i]] * absmax[i / 256] - x);
      worse += em > et * (1 + 1e-6);
    }
  }
  RF_CHECK(worse == 0, "%ld of our codes decode farther from the moment than bitsandbytes'", worse);
  return differ;
}

/* The nearest code to x on map (a tie goes to the lower code). */
static int nearest_code(const float *map, double x) {
  int best = 0;
  for (int c = 1; c < 256; c++)
    if (fabs(map[c] - x) < fabs(map[best] - x)) best = c;
  return best;
}

/* bitsandbytes' CPU quantizer searches a grid of about 2^-16 of the block absmax rather than for
 * the nearest code: its code may decode this much farther from the value than the nearest one
 * (at most 2.0e-5 on these records). */
#define BNB_SEARCH_SLACK 0x1p-15

/* Compares one moment (k 0: m, signed; 1: v, unsigned) after a step, scale for scale and code for
 * code: our absmax equals bitsandbytes' (1e-6 relative), each of our codes is the nearest to the
 * moment bitsandbytes holds (`mom`, normalized by its absmax; up to f32 rounding; a positive v
 * takes code 1 rather than 0), and where bitsandbytes' code differs, it is within its search's
 * slack. Returns the number of codes equal to bitsandbytes'. */
static long check_codes(const struct rf_optim_state_slab *code, const struct rf_optim_state_slab *scale,
                        int k, int step, const double *mom, int64_t n) {
  char name[64];
  snprintf(name, sizeof name, "bnb.absmax%d_%d", k + 1, step);
  const float *theirs_scale = ref_f32(name, n / 256), *map = rf_optim_qmap(!k);
  snprintf(name, sizeof name, "bnb.state%d_%d", k + 1, step);
  const uint8_t *theirs = ref_u8(name, n), *mine = code->data;
  double ds = rf_test_max_rel_diff(scale->data, theirs_scale, (size_t)(n / 256), 1e-30);
  RF_CHECK(ds <= 1e-6, "step %d: %s absmax differs from bitsandbytes' by %.3g", step, k ? "v" : "m", ds);
  long equal = 0, far = 0, bnb_far = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = mom[i] / theirs_scale[i / 256];
    int near = nearest_code(map, x);
    if (k == 1 && near == 0 && mom[i] > 0) near = 1;
    double em = fabs(map[mine[i]] - x), en = fabs(map[near] - x), et = fabs(map[theirs[i]] - x);
    far += !(mine[i] == near || em <= en + 1e-6 * fabs(x) + 1e-12);
    bnb_far += !(mine[i] == theirs[i] || et <= em + BNB_SEARCH_SLACK);
    equal += mine[i] == theirs[i];
  }
  RF_CHECK(far == 0, "step %d: %ld %s codes are not the nearest to bitsandbytes' moment", step, far,
           k ? "v" : "m");
  RF_CHECK(bnb_far == 0, "step %d: %ld %s codes differ from bitsandbytes' beyond its search's slack", step,
           bnb_far, k ? "v" : "m");
  return equal;
}

/* Each of the 3 steps alone, started from bitsandbytes' own parameters, codes and absmax of the
 * step before (blocks of 256, as it has): the codes and scales as check_codes says, and every
 * parameter within 2.5e-7 of its size plus 1e-5 of its own change of bitsandbytes'. */
static void run_bnb_stepwise(void) {
  enum { N = 64 * 128, NB = N / 256 };
  static float master[N], grad[N];
  static double mom[2][N]; /* bitsandbytes' moments after the step, from its state before */
  struct rf_tensor_view v;
  int64_t st[2];
  view_whole(&v, "w", 1, N, 0, master, grad, 0, st);
  struct rf_optim_options opt;
  rf_optim_options_default(&opt);
  opt.kind = RF_OPTIM_KIND_ADAMW8BIT;
  int flags = RF_OPTIM_FLAG_DECAY;
  struct rf_optim *o;
  RF_ASSERT(rf_optim_create(&o, &opt, &v, &flags, 1, N, NULL) == 0);
  struct rf_optim_state_slab s[4];
  for (int i = 0; i < 4; i++) rf_optim_state(o, i, &s[i]);
  RF_ASSERT(s[0].count == N && s[1].count == N && s[2].count == NB && s[3].count == NB);
  const float *p = ref_f32("bnb.p0", N), *g = ref_f32("bnb.g", 3 * N);
  const double beta[2] = {opt.beta1, opt.beta2};
  char name[64];
  for (int step = 1; step <= 3; step++) {
    memcpy(master, p, sizeof master);
    memcpy(grad, g + (step - 1) * N, sizeof grad);
    for (int k = 0; k < 2; k++) {
      const float *map = rf_optim_qmap(!k), *scale = NULL;
      const uint8_t *code = NULL;
      if (step > 1) { /* step 1 starts from our own zero state */
        snprintf(name, sizeof name, "bnb.state%d_%d", k + 1, step - 1);
        code = ref_u8(name, N);
        snprintf(name, sizeof name, "bnb.absmax%d_%d", k + 1, step - 1);
        scale = ref_f32(name, NB);
        memcpy(s[k].data, code, N);
        memcpy(s[2 + k].data, scale, NB * sizeof(float));
      }
      for (int64_t i = 0; i < N; i++) {
        double old = code ? (double)map[code[i]] * scale[i / 256] : 0.0, gi = grad[i];
        mom[k][i] = beta[k] * old + (1 - beta[k]) * (k ? gi * gi : gi);
      }
    }
    rf_optim_step(o, 1e-2f);
    long equal =
        check_codes(&s[0], &s[2], 0, step, mom[0], N) + check_codes(&s[1], &s[3], 1, step, mom[1], N);
    snprintf(name, sizeof name, "bnb.p%d", step);
    const float *want = ref_f32(name, N);
    long bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < N; i++) {
      double d = fabs((double)master[i] - want[i]), change = fabs((double)want[i] - p[i]);
      double bound = 2.5e-7 * fabs(want[i]) + 1e-5 * change;
      bad += !(d <= bound);
      worst = rf_test_max(worst, d / bound);
    }
    printf(
        "adamw8bit step %d from bitsandbytes' state: codes equal %ld of %d (the rest within its search's "
        "2^-15), parameters within %.2g of the bound\n",
        step, equal, 2 * N, worst);
    RF_CHECK(bad == 0, "step %d: %ld parameters differ from bitsandbytes' beyond 2.5e-7 |p| + 1e-5 |change|",
             step, bad);
    p = want;
  }
  rf_optim_free(o);
}

/* 3 8-bit steps on the bitsandbytes problem as a vector (blocks of 256, as
 * bitsandbytes) or a 64 x 128 matrix (32 x 32 tiles). */
static void run_bnb(int as_matrix) {
  enum { N = 64 * 128 };
  static float master[N], grad[N];
  struct rf_tensor_view v;
  int64_t st[2];
  view_whole(&v, "w", as_matrix ? 2 : 1, as_matrix ? 64 : N, 128, master, grad, 0, st);
  const float *p0 = ref_f32("bnb.p0", N), *g = ref_f32("bnb.g", 3 * N);
  memcpy(master, p0, sizeof master);
  struct rf_optim_options opt;
  rf_optim_options_default(&opt);
  opt.kind = RF_OPTIM_KIND_ADAMW8BIT;
  int flags = RF_OPTIM_FLAG_DECAY;
  struct rf_optim *o;
  RF_ASSERT(rf_optim_create(&o, &opt, &v, &flags, 1, N, NULL) == 0);
  long differ = -1;
  for (int s = 0; s < 3; s++) {
    memcpy(grad, g + s * N, sizeof grad);
    rf_optim_step(o, 1e-2f);
    if (s == 0) {
      double d1 = rf_test_max_rel_diff(master, ref_f32("bnb.p1", N), N, 1e-3);
      RF_CHECK(d1 <= 1e-5, "8-bit step 1 differs from bitsandbytes: %.3g", d1);
      if (!as_matrix) differ = check_step1_codes(o, grad);
    }
  }
  const float *p3 = ref_f32("bnb.p3", N), *f32 = ref_f32("bnb.p3_f32", N);
  double change = max_abs_diff(f32, p0, N);
  double d_bnb = max_abs_diff(master, p3, N) / change, noise_bnb = max_abs_diff(p3, f32, N) / change,
         noise_mine = max_abs_diff(master, f32, N) / change;
  printf(
      "adamw8bit (%s) vs bitsandbytes AdamW8bit, 3 steps: max |ours - bnb| %.3g, |ours - f32 AdamW| %.3g, "
      "|bnb - f32 AdamW| %.3g (of the largest change)",
      as_matrix ? "32x32 tiles" : "blocks of 256", d_bnb, noise_mine, noise_bnb);
  if (differ >= 0) printf("; step-1 codes differing: %ld of %d", differ, 2 * N);
  printf("\n");
  RF_CHECK(noise_mine <= 1.25 * noise_bnb,
           "8-bit (%d) farther from f32 AdamW than bitsandbytes: %.3g vs %.3g", as_matrix, noise_mine,
           noise_bnb);
  RF_CHECK(d_bnb <= 2 * noise_bnb, "8-bit (%d) vs bitsandbytes: %.3g", as_matrix, d_bnb);
  rf_optim_free(o);
}

static void test_bnb_kernel(void) {
  double dmap[2] = {0, 0};
  for (int sgn = 0; sgn < 2; sgn++)
    dmap[sgn] =
        max_abs_diff(rf_optim_qmap(sgn), ref_f32(sgn ? "bnb.qmap_signed" : "bnb.qmap_unsigned", 256), 256);
  printf("dynamic maps vs bitsandbytes: max abs diff signed %.3g, unsigned %.3g\n", dmap[1], dmap[0]);
  RF_CHECK(dmap[0] <= 1e-6 && dmap[1] <= 1e-6, "quantization maps differ from bitsandbytes'");
  run_bnb(0);
  run_bnb(1);
  run_bnb_stepwise();
}

/* Every 8-bit kernel built here against bitsandbytes: the portable one on every
 * CPU, the AVX-512 one where the compiler targeted it (rf_optim_simd_set). */
static void test_bnb(void) {
  if (!ref_find("bnb.p0", -1)) {
    RF_CHECK(0, "%s: no bitsandbytes records (tests/ref_optim.py writes them)", REF_PATH);
    return;
  }
  int was = rf_optim_simd_set(1), avx512 = rf_optim_simd_get();
  for (int simd = 0; simd <= avx512; simd++) {
    rf_optim_simd_set(simd);
    printf("8-bit AdamW, the %s kernel:\n", simd ? "AVX-512" : "portable");
    test_bnb_kernel();
  }
  rf_optim_simd_set(was);
  if (!avx512)
    rf_test_not_run("no AVX-512 8-bit kernel in this build: the portable one alone against bitsandbytes");
}

int main(void) {
  if (ref_load() != 0) {
    RF_CHECK(0, "%s", rf_error_msg());
    return rf_test_finish("test_optim_ref");
  }
  test_adamw();
  test_model_groups();
  test_bnb();
  MPI_Init(NULL, NULL);
  struct rf_comm self;
  rf_comm_init(&self, MPI_COMM_SELF);
  test_muon(&self);
  rf_comm_free(&self);
  MPI_Finalize();
  free(blob);
  for (int i = 0; i < n_recs; i++) free(recs[i].data);
  return rf_test_finish("test_optim_ref");
}
