/* rf-test: timeout=60
 * Model descriptions and the peers' layouts:
 *  - the shipped configs expand to the published parameter totals exactly
 *    (Hugging Face checkpoints of LLaMA-3-8B/70B, GPT-OSS-120B, DeepSeek-V3,
 *    Qwen2-0.5B);
 *  - a tiny gpt_oss config's description holds exactly the tensors, names and
 *    shapes, of transformers' GptOssForCausalLM (tests/ref_family_names.py wrote
 *    them to tests/data/gpt_oss_names.txt), and a tiny deepseek_v3's (a dense layer,
 *    two MoE layers) those of DeepseekV3ForCausalLM's state_dict (the balancing
 *    bias buffer and the fused routed experts included: deepseek_v3_names.txt);
 *  - bad files (malformed JSON, unknown model_type, a missing or non-positive
 *    dimension, bad generic fields) fail with the file and the field named;
 *  - the peers' padding agrees with the numbers computed from their published
 *    rules (../shared/references/peers.md section 8: FSDP2 pads LLaMA-3-8B 13.5%
 *    at W = 1000, GPT-OSS-120B's 128-expert tensors about 98% at W = 256, ...);
 *  - the cut-block counts (closed form and boundary walk) equal a brute force
 *    over every element of small random layouts;
 *  - identical units (decoder layers) planned once and copied get the layout
 *    each would get planned afresh (LLaMA-3-8B, the 1T Kimi-K2-like MoE). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/model.h"
#include "plan/plan.h"
#include "rf_test.h"

static void check_total(const char *path, int64_t total, int n_units) {
  struct rf_model_desc m;
  int rc = rf_model_desc_load(path, &m);
  RF_CHECK(rc == 0, "%s: %s", path, rf_error_msg());
  if (rc != 0) return;
  RF_CHECK(m.numel == total, "%s: %lld parameters, published %lld", path, (long long)m.numel,
           (long long)total);
  RF_CHECK(m.n_units == n_units, "%s: %d units, expected %d", path, m.n_units, n_units);
  int64_t sum = 0;
  for (int u = 0; u < m.n_units; u++)
    for (int t = 0; t < m.units[u].n_tensors; t++) sum += m.units[u].tensors[t].numel;
  RF_CHECK(sum == total, "%s: tensors sum to %lld", path, (long long)sum);
  rf_model_desc_free(&m);
}

static void expect_error(const char *text, const char *needle) {
  struct rf_model_desc m;
  int rc = rf_model_desc_parse(text, "bad.json", &m);
  RF_CHECK(rc == -1, "accepted: %s", text);
  if (rc == 0) {
    rf_model_desc_free(&m);
    return;
  }
  RF_CHECK(strstr(rf_error_msg(), "bad.json") && strstr(rf_error_msg(), needle),
           "message '%s' lacks the file or '%s'", rf_error_msg(), needle);
}

/* Padding ratio (percent) of a peer over the whole model, or over the tensors whose name contains `only`. */
static double peer_padding(const struct rf_model_desc *m, enum rf_plan_peer peer, int world,
                           const char *only) {
  struct rf_plan_peer_stats st = {0};
  const struct rf_plan_policy rows1 = {.block_rows = 1, .vector_block = 1};
  struct rf_plan_unit_in *units = rf_model_desc_plan_units(m, &rows1);
  for (int u = 0; u < m->n_units; u++) {
    struct rf_plan_unit_in in = units[u];
    const struct rf_plan_tensor_in *ts = in.tensors;
    if (only) {
      for (int t = 0; t < in.n_tensors; t++) {
        if (!strstr(ts[t].name, only)) continue;
        struct rf_plan_unit_in one = {in.name, 1, &ts[t]};
        RF_ASSERT(rf_plan_peer_add(peer, &one, world, &st) == 0);
      }
    } else {
      RF_ASSERT(rf_plan_peer_add(peer, &in, world, &st) == 0);
    }
  }
  free(units);
  return 100.0 * (double)(st.padded_elems - st.elems) / (double)st.elems;
}

static void check_peer(const struct rf_model_desc *m, const char *model, enum rf_plan_peer peer, int world,
                       const char *only, double expect, double tol) {
  double got = peer_padding(m, peer, world, only);
  RF_CHECK(got >= expect - tol && got <= expect + tol,
           "%s %s W=%d%s%s: padding %.4f%%, published rule %.3f%%", model, rf_plan_peer_name(peer), world,
           only ? " tensors " : "", only ? only : "", got, expect);
}

/* Brute-force cut blocks: the rank of every element of a flat layout. */
struct brute_tensor {
  int64_t off, numel, g;
};

static int64_t brute_cut(const struct brute_tensor *ts, int n, const int64_t *starts, int world) {
  int64_t cut = 0;
  for (int i = 0; i < n; i++) {
    for (int64_t b0 = 0; b0 < ts[i].numel; b0 += ts[i].g) {
      int64_t b1 = rf_min_i64(b0 + ts[i].g, ts[i].numel);
      int r0 = -1, split = 0;
      for (int64_t x = ts[i].off + b0; x < ts[i].off + b1; x++) {
        int r = 0;
        while (r < world - 1 && starts[r + 1] <= x) r++;
        if (r0 >= 0 && r != r0) split = 1;
        r0 = r;
      }
      cut += split;
    }
  }
  return cut;
}

/* Random small units: each peer's layout rebuilt here from its rule, its cuts counted element by element. */
static void check_cuts_random(void) {
  uint64_t seed = 12345;
  int n_cases = 0;
  for (int iter = 0; iter < 3000; iter++) {
    struct rf_plan_tensor_in ts[5];
    int n = 1 + (int)(rf_test_rand_u64(&seed) % 5), world = 1 + (int)(rf_test_rand_u64(&seed) % 8);
    int64_t R = 1 + (int64_t)(rf_test_rand_u64(&seed) % 4);
    for (int i = 0; i < n; i++) {
      memset(&ts[i], 0, sizeof ts[i]);
      ts[i].name = "t";
      ts[i].ndim = 1 + (int)(rf_test_rand_u64(&seed) % 2);
      ts[i].shape[0] = 1 + (int64_t)(rf_test_rand_u64(&seed) % 9);
      if (ts[i].ndim == 2) ts[i].shape[1] = 1 + (int64_t)(rf_test_rand_u64(&seed) % 5);
      ts[i].numel = ts[i].shape[0] * (ts[i].ndim == 2 ? ts[i].shape[1] : 1);
      /* blocks: R rows of 2-D tensors; vectors get R-element blocks here to exercise the counting */
      ts[i].block_elems = ts[i].ndim == 2 ? rf_min_i64(R, ts[i].shape[0]) * ts[i].shape[1] : R;
      ts[i].sub_count = 1;
    }
    struct rf_plan_unit_in in = {"u", n, ts};
    for (int peer = 0; peer < RF_PLAN_PEER_COUNT; peer++) {
      struct rf_plan_peer_stats st = {0};
      RF_ASSERT(rf_plan_peer_add((enum rf_plan_peer)peer, &in, world, &st) == 0);
      struct brute_tensor bt[5];
      int64_t starts[9], expect = 0, padded = 0;
      if (peer == RF_PLAN_PEER_FSDP1 || peer == RF_PLAN_PEER_MEGATRON) {
        int64_t p = 0, chunk = 1;
        for (int i = 0; i < n; i++) {
          int64_t row = ts[i].numel / ts[i].shape[0];
          if (peer == RF_PLAN_PEER_MEGATRON) {
            while (p % row) p++;
            int64_t c = chunk;
            while (c % row) c += chunk;
            chunk = c;
          }
          bt[i] = (struct brute_tensor){p, ts[i].numel, rf_min_i64(ts[i].block_elems, ts[i].numel)};
          p += ts[i].numel;
        }
        while (p % (world * chunk)) p++;
        for (int r = 0; r <= world; r++) starts[r] = r * (p / world);
        expect = brute_cut(bt, n, starts, world);
        padded = p;
      } else {
        for (int i = 0; i < n; i++) {
          int64_t shard = peer == RF_PLAN_PEER_FSDP2
                              ? (ts[i].shape[0] + world - 1) / world * (ts[i].numel / ts[i].shape[0])
                              : (ts[i].numel + world - 1) / world;
          for (int r = 0; r <= world; r++) starts[r] = r * shard;
          bt[0] = (struct brute_tensor){0, ts[i].numel, rf_min_i64(ts[i].block_elems, ts[i].numel)};
          expect += brute_cut(bt, 1, starts, world);
          padded += shard * world;
        }
      }
      RF_CHECK(st.split_blocks == expect && st.padded_elems == padded,
               "case %d %s W=%d: cut %lld (brute %lld), padded %lld (rule %lld)", iter,
               rf_plan_peer_name((enum rf_plan_peer)peer), world, (long long)st.split_blocks,
               (long long)expect, (long long)st.padded_elems, (long long)padded);
      n_cases++;
    }
    /* rfsdp's counter on its own plans: a valid plan has none, and a plan with shifted
     * rank starts has exactly what brute force finds. */
    struct rf_plan_options opt = {world, RF_SHARD_MODE_RAGGED, 1, 1, 0, 0};
    struct rf_plan_unit plan;
    RF_ASSERT(rf_plan_unit_make(&in, &opt, &plan) == 0);
    RF_CHECK(rf_plan_unit_split_blocks(&in, &plan) == 0, "case %d: valid plan has cut blocks", iter);
    struct rf_plan_buffer *buf = &plan.buffers[0];
    for (int r = 1; r < world; r++) buf->starts[r] = buf->total_elems * r / world;
    struct brute_tensor bt[5];
    for (int p = 0; p < buf->n_places; p++) {
      const struct rf_plan_tensor_in *t = &ts[buf->places[p].tensor];
      bt[p] = (struct brute_tensor){buf->places[p].offset, t->numel, rf_min_i64(t->block_elems, t->numel)};
    }
    int64_t expect = brute_cut(bt, buf->n_places, buf->starts, world);
    RF_CHECK(rf_plan_unit_split_blocks(&in, &plan) == expect, "case %d: shifted plan cut %lld, brute %lld",
             iter, (long long)rf_plan_unit_split_blocks(&in, &plan), (long long)expect);
    rf_plan_unit_free(&plan);
  }
  printf("cut-block counts: %d peer layouts agree with brute force\n", n_cases);
}

/* rf_plan_model_make plans identical units once and copies the layout: every
 * copy equals the layout planned afresh for that unit. */
static void check_memo(const char *path, int world, enum rf_shard_mode mode, int64_t rows) {
  struct rf_model_desc m;
  RF_ASSERT(rf_model_desc_load(path, &m) == 0);
  const struct rf_plan_policy p = {.layout = RF_LAYOUT_PLANNED,
                                   .shard = mode,
                                   .max_buffers = 4,
                                   .align_bytes = 64,
                                   .param_dtype = RF_DTYPE_BF16,
                                   .reduce_dtype = RF_DTYPE_BF16,
                                   .block_rows = rows,
                                   .vector_block = 1};
  struct rf_plan_unit_in *units = rf_model_desc_plan_units(&m, &p);
  struct rf_plan_model_result r;
  RF_ASSERT(rf_plan_model_make(units, m.n_units, &p, world, 0, &r) == 0);
  int differ = 0;
  for (int u = 0; u < m.n_units; u++) {
    struct rf_plan_layout fresh;
    RF_ASSERT(rf_plan_layout_make(&p, world, &units[u], &fresh) == 0);
    const struct rf_plan_unit *a = &r.units[u].plan, *b = &fresh.plan;
    int same = a->n_buffers == b->n_buffers && a->padded_elems == b->padded_elems &&
               a->max_shard_elems == b->max_shard_elems && r.units[u].split_blocks == fresh.split_blocks;
    for (int k = 0; same && k < a->n_buffers; k++) {
      const struct rf_plan_buffer *x = &a->buffers[k], *y = &b->buffers[k];
      same = x->n_places == y->n_places && x->total_elems == y->total_elems &&
             x->shard_elems == y->shard_elems &&
             memcmp(x->starts, y->starts, (size_t)(world + 1) * sizeof *x->starts) == 0;
      for (int q = 0; same && q < x->n_places; q++) {
        const struct rf_plan_place *c = &x->places[q], *d = &y->places[q];
        same = c->tensor == d->tensor && c->offset == d->offset && c->sub_stride == d->sub_stride &&
               c->sub_first == d->sub_first && c->sub_n == d->sub_n;
      }
    }
    for (int i = 0; same && i < fresh.n_tensors; i++) {
      const struct rf_plan_layout_tensor *c = &r.units[u].tensors[i], *d = &fresh.tensors[i];
      same = c->buffer == d->buffer && c->offset == d->offset && c->chunk == d->chunk;
    }
    differ += !same;
    rf_plan_layout_free(&fresh);
  }
  RF_CHECK(differ == 0, "%s W=%d: %d of %d units' shared layouts differ from planning them afresh", path,
           world, differ, m.n_units);
  rf_plan_model_result_free(&r);
  free(units);
  rf_model_desc_free(&m);
}

/* The description of tests/data/NAME_names_config.json against the state_dict names and
 * shapes transformers gave (tests/data/NAME_names.txt, "name dim0 dim1 ..." per line):
 * the same set of lines, in any order. */
static int cmp_lines(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void check_names(const char *name) {
  char path[256];
  snprintf(path, sizeof path, "tests/data/%s_names_config.json", name);
  struct rf_model_desc m;
  RF_ASSERT(rf_model_desc_load(path, &m) == 0);
  char **ours = rf_xcalloc((size_t)m.n_tensors, sizeof *ours);
  int n = 0;
  for (int u = 0; u < m.n_units; u++)
    for (int t = 0; t < m.units[u].n_tensors; t++) {
      const struct rf_model_tensor *x = &m.units[u].tensors[t];
      char line[512];
      int at = snprintf(line, sizeof line, "%s", x->name);
      for (int d = 0; d < x->ndim; d++)
        at += snprintf(line + at, sizeof line - (size_t)at, " %lld", (long long)x->shape[d]);
      ours[n++] = strdup(line);
    }
  snprintf(path, sizeof path, "tests/data/%s_names.txt", name);
  char *text = NULL;
  size_t bytes = 0;
  RF_ASSERT(rf_file_read_all(path, &text, &bytes) == 0);
  char **theirs = rf_xcalloc(bytes + 1, sizeof *theirs);
  int k = 0;
  for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
    theirs[k++] = l;
  qsort(ours, (size_t)n, sizeof *ours, cmp_lines);
  qsort(theirs, (size_t)k, sizeof *theirs, cmp_lines);
  int i = 0, j = 0, bad = 0;
  while (i < n || j < k) {
    int c = i == n ? 1 : j == k ? -1 : strcmp(ours[i], theirs[j]);
    if (c == 0) {
      i++, j++;
      continue;
    }
    RF_CHECK(0, "%s: %s '%s'", name,
             c < 0 ? "rfsdp describes, transformers lacks" : "transformers has, rfsdp lacks",
             c < 0 ? ours[i] : theirs[j]);
    bad++;
    if (c < 0)
      i++;
    else
      j++;
  }
  printf("  %s: %d tensors, %d as transformers names and shapes them\n", name, n, n - bad);
  RF_CHECK(bad == 0 && n == k && n > 0, "%s: %d tensors described, %d in transformers' state_dict", name, n,
           k);
  for (i = 0; i < n; i++) free(ours[i]);
  free(ours), free(theirs), free(text);
  rf_model_desc_free(&m);
}

int main(void) {
  /* published totals (../shared/models/README.md) */
  check_total("configs/llama-3-8b.json", INT64_C(8030261248), 34);
  check_total("configs/llama-3-70b.json", INT64_C(70553706496), 82);
  check_total("configs/gpt-oss-120b.json", INT64_C(116829156672), 38);
  check_total("configs/deepseek-v3.json", INT64_C(671026419200), 63);
  /* tied (no lm_head, no embed unit) with q, k, v biases */
  check_total("configs/qwen2-0.5b.json", INT64_C(494032768), 25);
  /* MoE: Mixtral-8x7B (46.7B, 8 experts fused per layer) and Qwen3-235B-A22B (128 experts,
   * q/k norms): the totals of their Hugging Face checkpoints (safetensors total_size / 2) */
  check_total("configs/mixtral-8x7b.json", INT64_C(46702792704), 34);
  check_total("configs/qwen3-235b-a22b.json", INT64_C(235093634560), 96);
  check_names("gpt_oss");
  check_names("deepseek_v3"); /* the routed experts fused as transformers 5 holds them */

  struct rf_model_desc m;
  int rc = rf_model_desc_load("configs/nonexistent.json", &m);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), "configs/nonexistent.json"), "missing file: '%s'",
           rf_error_msg());
  expect_error("{\"model_type\": \"llama\", ", "not valid JSON");
  expect_error("[1, 2]", "not a JSON object");
  expect_error("{\"hidden_size\": 4}", "model_type");
  expect_error("{\"model_type\": \"bert\"}", "unknown model type 'bert'");
  const char *llama =
      "{\"model_type\": \"llama\", \"hidden_size\": %s, \"intermediate_size\": 64, "
      "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 100}";
  char text[512];
  snprintf(text, sizeof text, llama, "0");
  expect_error(text, "'hidden_size' must be a positive integer");
  snprintf(text, sizeof text, llama, "-32");
  expect_error(text, "'hidden_size' must be a positive integer");
  snprintf(text, sizeof text, llama, "32.5");
  expect_error(text, "'hidden_size' must be a positive integer");
  expect_error("{\"model_type\": \"gpt_oss\", \"hidden_size\": 8}", "'intermediate_size' is missing");
  expect_error(
      "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 8, \"intermediate_size\": 8, "
      "\"moe_intermediate_size\": 4, \"n_routed_experts\": 4, \"n_shared_experts\": 1, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"vocab_size\": 16}",
      "'first_k_dense_replace'");
  expect_error("{\"units\": []}", "'units' must be a non-empty array");
  expect_error("{\"units\": [{\"name\": \"a\", \"tensors\": [{\"name\": \"w\", \"shape\": [4, 0]}]}]}",
               "units[0].tensors[0].shape[1] must be a positive integer");
  expect_error("{\"units\": [{\"name\": \"a\", \"tensors\": [{\"name\": \"w\"}]}]}",
               "units[0].tensors[0].shape");
  expect_error(
      "{\"units\": [{\"name\": \"a\", \"tensors\": [{\"name\": \"w\", \"shape\": [4], "
      "\"block_rows\": -2}]}]}",
      "units[0].tensors[0].block_rows");
  expect_error("{\"units\": [{\"tensors\": []}]}", "units[0].name");

  /* a valid generic file and a small llama: shapes and block sizes */
  snprintf(text, sizeof text, llama, "32");
  RF_CHECK(rf_model_desc_parse(text, "small.json", &m) == 0, "%s", rf_error_msg());
  /* embed 100*32, per layer 2*32 + 4*32*32 + 3*64*32, norm 32 + head 100*32 */
  RF_CHECK(m.numel == 3200 + 2 * (64 + 4096 + 6144) + 32 + 3200 && m.n_units == 4,
           "small llama: %lld in %d units", (long long)m.numel, m.n_units);
  rf_model_desc_free(&m);
  RF_CHECK(rf_model_desc_parse(
               "{\"units\": [{\"name\": \"a\", \"tensors\": [{\"name\": \"w\", \"shape\": "
               "[8, 3, 5], \"block_rows\": 4, \"sub_count\": 8}, {\"name\": \"b\", \"shape\": [7]}]}]}",
               "gen.json", &m) == 0,
           "%s", rf_error_msg());
  const struct rf_plan_policy rows32 = {.block_rows = 32, .vector_block = 1};
  struct rf_plan_unit_in *units = rf_model_desc_plan_units(&m, &rows32);
  const struct rf_plan_tensor_in *ts = units[0].tensors;
  RF_CHECK(
      units[0].n_tensors == 2 && ts[0].block_elems == 20 && ts[0].sub_count == 8 && ts[1].block_elems == 1,
      "generic: blocks %lld %lld", (long long)ts[0].block_elems, (long long)ts[1].block_elems);
  free(units);
  rf_model_desc_free(&m);

  /* the peers against the numbers computed from their published rules */
  RF_ASSERT(rf_model_desc_load("configs/llama-3-8b.json", &m) == 0);
  check_memo("configs/llama-3-8b.json", 1000, RF_SHARD_MODE_EQUAL, 32);
  check_memo("configs/llama-3-8b.json", 96, RF_SHARD_MODE_RAGGED, 1);
  check_memo("configs/kimi-k2.json", 16384, RF_SHARD_MODE_EQUAL, 32);
  check_peer(&m, "llama-3-8b", RF_PLAN_PEER_FSDP2, 1000, NULL, 13.5, 0.05);
  check_peer(&m, "llama-3-8b", RF_PLAN_PEER_FSDP2, 384, NULL, 2.40, 0.01);
  check_peer(&m, "llama-3-8b", RF_PLAN_PEER_FSDP2, 24, NULL, 0.15, 0.01);
  check_peer(&m, "llama-3-8b", RF_PLAN_PEER_FSDP2, 1024, NULL, 0.08, 0.01);
  check_peer(&m, "llama-3-8b", RF_PLAN_PEER_FSDP2, 128, NULL, 0.0, 1e-9);
  check_peer(&m, "llama-3-8b", RF_PLAN_PEER_DEEPSPEED, 1000, NULL, 0.003, 0.001);
  check_peer(&m, "llama-3-8b", RF_PLAN_PEER_FSDP1, 1000, NULL, 0.0, 0.001);
  rf_model_desc_free(&m);
  RF_ASSERT(rf_model_desc_load("configs/llama-3-70b.json", &m) == 0);
  check_peer(&m, "llama-3-70b", RF_PLAN_PEER_FSDP2, 1000, NULL, 6.6, 0.05);
  check_peer(&m, "llama-3-70b", RF_PLAN_PEER_FSDP2, 1024, NULL, 0.02, 0.01);
  rf_model_desc_free(&m);
  RF_ASSERT(rf_model_desc_load("configs/gpt-oss-120b.json", &m) == 0);
  check_peer(&m, "gpt-oss-120b", RF_PLAN_PEER_FSDP2, 256, "mlp.experts", 100.0, 1e-9);
  check_peer(&m, "gpt-oss-120b", RF_PLAN_PEER_FSDP2, 256, NULL, 98.0, 0.5);
  check_peer(&m, "gpt-oss-120b", RF_PLAN_PEER_FSDP2, 96, NULL, 49.0, 0.5);
  rf_model_desc_free(&m);

  check_cuts_random();
  return rf_test_finish("test_plan_models");
}
