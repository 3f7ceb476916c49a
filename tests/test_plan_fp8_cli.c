/* rf-test: timeout=60
 * `rfsdp plan --fp8 block` (`--fp8` before it took a value) run as a user
 * would, on a llama of 2 layers (hidden 384, intermediate 1000, 2 key-value
 * heads: 128-row k and v, 1000-row gate and up) at W = 3: the table (its header
 * and one row per layout) and the JSON "fp8" object (quantized elements, tiles,
 * and per layout the tiles cut and the gather bytes); rfsdp's layout cuts no
 * 128x128 tile (equal and ragged shards) while fsdp2's cuts exactly what a
 * brute force finds (every tile's elements given their owner under FSDP2's
 * dim-0 chunks of ceil(rows / W) rows); the counts and bytes follow from the
 * config, computed here. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char out[1 << 18];

static const char *const model_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 384, \"intermediate_size\": "
    "1000, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 6, \"num_key_value_heads\": 2, \"vocab_size\": "
    "300, "
    "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-05, \"rope_theta\": "
    "10000.0, "
    "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false}";

enum { H = 384, F = 1000, KV = 128, V = 300, LAYERS = 2, WORLD = 3 };

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  RF_CHECK(cJSON_IsNumber(v), "field '%s' missing or not a number", key);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Tiles of a rows x cols matrix holding elements of two FSDP2 ranks (dim-0
 * chunks of ceil(rows / world) rows), element by element. */
static int64_t brute_fsdp2_cut(int64_t rows, int64_t cols, int world) {
  int64_t chunk = rf_ceil_div(rows, world), cut = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += 128)
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      int64_t owner = -1, mixed = 0;
      for (int64_t r = r0; r < rf_min_i64(r0 + 128, rows); r++)
        for (int64_t c = c0; c < rf_min_i64(c0 + 128, cols); c++) {
          int64_t o = (r * cols + c) / (chunk * cols);
          if (owner < 0) owner = o;
          mixed |= o != owner;
        }
      cut += mixed;
    }
  return cut;
}

int main(void) {
  /* rfsdp plan's --fp8 was a flag until `--fp8 off|block` (shared with rfsdp
   * train); either works */
  RF_ASSERT(rf_cli_run(out, sizeof out, "plan --help") == 0);
  const char *fp8 = strstr(out, "--fp8 off|block") ? "--fp8 block" : "--fp8";
  char dir[64] = "/tmp/rf_test_plan_fp8_cli.XXXXXX", path[128];
  RF_ASSERT(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/m.json", dir);
  RF_ASSERT(rf_file_write_all(path, model_json, strlen(model_json)) == 0);
  /* the linear weights: q, k, v, o, gate, up, down per layer */
  const int64_t shapes[7][2] = {{H, H}, {KV, H}, {KV, H}, {H, H}, {F, H}, {F, H}, {H, F}};
  int64_t q_elems = 0, tiles = 0, fsdp2_cut = 0;
  for (int l = 0; l < LAYERS; l++)
    for (int i = 0; i < 7; i++) {
      q_elems += shapes[i][0] * shapes[i][1];
      tiles += rf_ceil_div(shapes[i][0], 128) * rf_ceil_div(shapes[i][1], 128);
      fsdp2_cut += brute_fsdp2_cut(shapes[i][0], shapes[i][1], WORLD);
    }
  int64_t elems = q_elems + LAYERS * 2 * H + H + 2 * (int64_t)V * H;
  RF_CHECK(fsdp2_cut == LAYERS * (2 * 2 * 3 + 2 * 1 * 3), "brute force: %lld tiles cut",
           (long long)fsdp2_cut);

  for (int mode = 0; mode < 2; mode++) {
    const char *shard = mode ? "ragged" : "equal";
    int rc = rf_cli_run(out, sizeof out, "plan --model %s --world %d --shard %s --block-rows 4 %s --json",
                        path, WORLD, shard, fp8);
    cJSON *o = cJSON_Parse(out);
    RF_CHECK(rc == 0 && o, "%s --json: rc %d '%.300s'", shard, rc, out);
    if (!o) continue;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "fp8");
    RF_CHECK(cJSON_IsObject(f), "%s: no \"fp8\" object", shard);
    RF_CHECK(num(f, "quantized_elems") == (double)q_elems && num(f, "tiles") == (double)tiles,
             "%s: quantized %g (want %lld), tiles %g (want %lld)", shard, num(f, "quantized_elems"),
             (long long)q_elems, num(f, "tiles"), (long long)tiles);
    static const char *layouts[] = {"rfsdp", "fsdp1", "fsdp2", "deepspeed", "megatron"};
    for (int k = 0; k < 5; k++) {
      const cJSON *x = cJSON_GetObjectItemCaseSensitive(f, layouts[k]);
      RF_CHECK(cJSON_IsObject(x), "%s: no fp8.%s", shard, layouts[k]);
      if (!x) continue;
      double cut = num(x, "tiles_cut"), b8 = num(x, "gather_bytes_fp8"), b16 = num(x, "gather_bytes_bf16"),
             b32 = num(x, "gather_bytes_f32");
      RF_CHECK(cut >= 0 && cut <= (double)tiles && b32 == 2 * b16 && b16 >= 2.0 * (double)elems && b8 < b16,
               "%s %s: cut %g, bytes fp8 %g bf16 %g f32 %g", shard, layouts[k], cut, b8, b16, b32);
      if (k == 0) {
        RF_CHECK(cut == 0, "%s: rfsdp's layout cuts %g tiles", shard, cut);
        double padded = num(o, "padded_elems");
        /* 1 byte per quantized or padding element, 4 per tile scale, the others
         * in f32 */
        double want = (double)q_elems + (padded - (double)elems) + 4.0 * (double)tiles +
                      4.0 * (double)(elems - q_elems);
        RF_CHECK(b32 == 4 * padded && b8 == want, "%s rfsdp: fp8 bytes %g, want %g (padded %g)", shard, b8,
                 want, padded);
        /* the planned layout's run gathers codes and scales */
        const cJSON *after = cJSON_GetObjectItemCaseSensitive(f, "run_quantizes_after_gather");
        RF_CHECK(cJSON_IsFalse(after) && num(f, "run_gather_bytes") == want, "%s: the run gathers %g bytes",
                 shard, num(f, "run_gather_bytes"));
      }
      if (k == 2)
        RF_CHECK(cut == (double)fsdp2_cut, "%s: fsdp2 cuts %g tiles, the brute force %lld", shard, cut,
                 (long long)fsdp2_cut);
    }
    cJSON_Delete(o);
  }

  /* --layout fsdp2 --param-dtype bf16: the run's own layout is FSDP2's (the brute force's
   * cuts), so it gathers everything in bf16 and quantizes after the gather */
  int rc =
      rf_cli_run(out, sizeof out, "plan --model %s --world %d --layout fsdp2 --param-dtype bf16 %s --json",
                 path, WORLD, fp8);
  cJSON *o = cJSON_Parse(out);
  RF_CHECK(rc == 0 && o, "fsdp2 --json: rc %d '%.300s'", rc, out);
  const cJSON *f = o ? cJSON_GetObjectItemCaseSensitive(o, "fp8") : NULL;
  const cJSON *run = f ? cJSON_GetObjectItemCaseSensitive(f, "rfsdp") : NULL;
  const cJSON *peer = f ? cJSON_GetObjectItemCaseSensitive(f, "fsdp2") : NULL;
  RF_CHECK(run && peer, "fsdp2 --json: no fp8 rows");
  if (run && peer)
    RF_CHECK(num(run, "tiles_cut") == (double)fsdp2_cut &&
                 cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "run_quantizes_after_gather")) &&
                 num(f, "run_gather_bytes") == num(peer, "gather_bytes_bf16") &&
                 num(f, "run_gather_bytes") >= 2.0 * (double)elems,
             "fsdp2: the run cuts %g tiles (brute force %lld) and gathers %g bytes (fsdp2 in bf16: %g)",
             num(run, "tiles_cut"), (long long)fsdp2_cut, num(f, "run_gather_bytes"),
             num(peer, "gather_bytes_bf16"));
  cJSON_Delete(o);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world %d --layout fsdp2 --param-dtype bf16 %s", path,
                  WORLD, fp8);
  RF_CHECK(rc == 0 && strstr(out, "the fsdp2 layout cuts tiles: rfsdp train gathers its FP8 weights in bf16"),
           "fsdp2 table: rc %d '%.900s'", rc, out);

  /* the table */
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world %d --shard ragged --block-rows 4 %s", path, WORLD,
                  fp8);
  char head[160];
  snprintf(head, sizeof head,
           "fp8 (e4m3, 128x128 tiles): %lld of %lld elements quantized in %lld "
           "tiles",
           (long long)q_elems, (long long)elems, (long long)tiles);
  RF_CHECK(rc == 0 && strstr(out, head) && strstr(out, "tiles cut") && strstr(out, "fp8/bf16"),
           "table header: rc %d '%.600s'", rc, out);
  char row0[64], row2[64];
  snprintf(row0, sizeof row0, "%-10s %12d", "rfsdp", 0);
  snprintf(row2, sizeof row2, "%-10s %12lld", "fsdp2", (long long)fsdp2_cut);
  const char *t = strstr(out, "tiles cut");
  RF_CHECK(t && strstr(t, row0) && strstr(t, row2) && strstr(t, "deepspeed") && strstr(t, "megatron") &&
               strstr(t, "fsdp1"),
           "table rows ('%s', '%s'): '%.900s'", row0, row2, t ? t : out);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_plan_fp8_cli");
}
