/* rf-test: timeout=60
 * `rfsdp plan` run as a user would: the JSON fields the issue lists, a layout
 * (--buffers) verified here independently of the planner (tensors inside their
 * buffer, no overlap, no block cut by a rank boundary, equal shards or W+1
 * ascending starts), the table, --max-padding's suggestion (checked by
 * planning at the suggested size), and errors on bad input. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char out[1 << 20];

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  RF_CHECK(cJSON_IsNumber(v), "field '%s' missing or not a number", key);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* The fields of one --json line. */
static void check_fields(const cJSON *o) {
  static const char *keys[] = {
      "world",     "elems",        "padded_elems", "padding_ratio", "lower_bound_ratio",
      "imbalance", "buffer_count", "split_blocks", "plan_ms",       "max_shard_elems"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) (void)num(o, keys[i]);
  RF_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "shard")), "no 'shard'");
  const cJSON *peers = cJSON_GetObjectItemCaseSensitive(o, "peers");
  static const char *names[] = {"fsdp1", "fsdp2", "deepspeed", "megatron"};
  for (int k = 0; k < 4; k++) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(peers, names[k]);
    RF_CHECK(cJSON_IsObject(p), "peer %s missing", names[k]);
    if (!p) continue;
    (void)num(p, "padding_ratio");
    (void)num(p, "split_blocks");
    (void)num(p, "copy_bytes_per_step");
  }
}

/* Independent check of a --buffers line: every tensor of `n_expect` appears,
 * inside its buffer, without overlap, and no block holds a rank boundary. */
static void check_layout(const cJSON *o, int world, int n_expect) {
  const cJSON *bufs = cJSON_GetObjectItemCaseSensitive(o, "buffers");
  RF_CHECK(cJSON_IsArray(bufs), "no buffers");
  int n_tensors = 0;
  const cJSON *b;
  cJSON_ArrayForEach(b, bufs) {
    int64_t starts[65];
    const cJSON *se = cJSON_GetObjectItemCaseSensitive(b, "shard_elems");
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(b, "shard_starts");
    if (se) {
      for (int r = 0; r <= world; r++) starts[r] = (int64_t)se->valuedouble * r;
      RF_CHECK((int64_t)se->valuedouble % 16 == 0, "shard %g not aligned to 64 bytes of f32",
               se->valuedouble);
    } else {
      RF_CHECK(cJSON_GetArraySize(ss) == world + 1, "shard_starts has %d entries", cJSON_GetArraySize(ss));
      for (int r = 0; r <= world; r++) starts[r] = (int64_t)cJSON_GetArrayItem(ss, r)->valuedouble;
      for (int r = 0; r < world; r++)
        RF_CHECK(starts[r] <= starts[r + 1] && (starts[r] % 16 == 0 || starts[r] == starts[world]),
                 "starts out of order or unaligned at %d", r);
    }
    int64_t end = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(b, "tensors")) {
      int64_t off = (int64_t)num(t, "offset"), g = (int64_t)num(t, "block_elems"), numel = 1;
      const cJSON *d;
      cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(t, "shape")) numel *= (int64_t)d->valuedouble;
      RF_CHECK(off >= end && off + numel <= starts[world], "tensor at %lld overlaps or leaves the buffer",
               (long long)off);
      for (int r = 1; r < world; r++)
        RF_CHECK(starts[r] <= off || starts[r] >= off + numel || (starts[r] - off) % g == 0,
                 "rank %d boundary %lld cuts a block of the tensor at %lld", r, (long long)starts[r],
                 (long long)off);
      end = off + numel;
      n_tensors++;
    }
  }
  RF_CHECK(n_tensors == n_expect, "layout lists %d tensors, the model has %d", n_tensors, n_expect);
}

int main(void) {
  /* the shipped 8B model at two sizes: one JSON object per world size */
  int rc = rf_cli_run(out, sizeof out,
                      "plan --model configs/llama-3-8b.json --world 8,1000 --block-rows 32 --json");
  RF_CHECK(rc == 0, "json: rc %d '%.300s'", rc, out);
  char *save = NULL;
  int lines = 0;
  for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save), lines++) {
    cJSON *o = cJSON_Parse(line);
    RF_CHECK(o != NULL, "line %d is not JSON: '%.200s'", lines, line);
    if (!o) continue;
    check_fields(o);
    RF_CHECK(num(o, "world") == (lines == 0 ? 8 : 1000), "line %d: world %g", lines, num(o, "world"));
    RF_CHECK(num(o, "elems") == 8030261248.0 && num(o, "split_blocks") == 0, "elems %g, split %g",
             num(o, "elems"), num(o, "split_blocks"));
    RF_CHECK(num(o, "padding_ratio") >= 0 && num(o, "padded_elems") >= num(o, "elems"), "padding below zero");
    const cJSON *f2 = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "peers"), "fsdp2");
    if (lines == 1 && f2) /* FSDP2's published rule: ~13.5% at W = 1000 */
      RF_CHECK(num(f2, "padding_ratio") > 0.134 && num(f2, "padding_ratio") < 0.136, "fsdp2 %g",
               num(f2, "padding_ratio"));
    cJSON_Delete(o);
  }
  RF_CHECK(lines == 2, "%d JSON lines for 2 world sizes", lines);

  /* a generic model, laid out and verified here, both modes */
  char dir[64] = "/tmp/rf_test_plan_cli.XXXXXX", path[128], bad[128];
  RF_ASSERT(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/m.json", dir);
  const char *model =
      "{\"units\": [{\"name\": \"a\", \"tensors\": ["
      "{\"name\": \"w\", \"shape\": [50, 24]}, {\"name\": \"b\", \"shape\": [24]},"
      "{\"name\": \"e\", \"shape\": [4, 8, 16], \"sub_count\": 4}, {\"name\": \"v\", \"shape\": [33, 16], "
      "\"block_rows\": 3}]}, {\"name\": \"z\", \"tensors\": [{\"name\": \"h\", \"shape\": [7, 40]}]}]}";
  RF_ASSERT(rf_file_write_all(path, model, strlen(model)) == 0);
  for (int mode = 0; mode < 2; mode++) {
    for (int w = 1; w <= 7; w += 3) {
      rc = rf_cli_run(
          out, sizeof out,
          "plan --model %s --world %d --block-rows 4 --param-dtype f32 --shard %s --json --buffers", path, w,
          mode ? "ragged" : "equal");
      cJSON *o = cJSON_Parse(out);
      RF_CHECK(rc == 0 && o, "layout W=%d: rc %d '%.300s'", w, rc, out);
      if (!o) continue;
      check_fields(o);
      check_layout(o, w, 5);
      if (mode) RF_CHECK(num(o, "padding_ratio") == 0, "ragged mode pads %g", num(o, "padding_ratio"));
      cJSON_Delete(o);
    }
  }

  /* the table */
  rc = rf_cli_run(out, sizeof out, "plan --model configs/gpt-oss-120b.json --world 256 --block-rows 32");
  RF_CHECK(rc == 0 && strstr(out, "world 256, equal shards") && strstr(out, "rfsdp") &&
               strstr(out, "fsdp1") && strstr(out, "fsdp2") && strstr(out, "deepspeed") &&
               strstr(out, "megatron"),
           "table: rc %d '%.500s'", rc, out);

  /* --max-padding: the unit to blame, and a group size that does meet the limit */
  rc = rf_cli_run(out, sizeof out,
                  "plan --model configs/llama-3-8b.json --world 1000 --block-rows 32 --max-padding 2");
  const char *sug = strstr(out, "suggestion: FSDP groups of ");
  RF_CHECK(rc == 0 && strstr(out, "unit layers.0: padding") && strstr(out, "largest block") && sug,
           "max-padding: rc %d '%.800s'", rc, out);
  int group = sug ? atoi(sug + strlen("suggestion: FSDP groups of ")) : 0;
  RF_CHECK(group > 0 && 1000 % group == 0, "suggested group %d", group);
  if (group > 0) {
    rc = rf_cli_run(out, sizeof out,
                    "plan --model configs/llama-3-8b.json --world %d --block-rows 32 --max-padding 2 --json",
                    group);
    RF_CHECK(rc == 0 && strstr(out, "\"max_padding_met\":true"), "at the suggested %d: '%.300s'", group, out);
    /* and the next larger divisor of 1000 does not */
    int next = group + 1;
    while (1000 % next) next++;
    rc = rf_cli_run(out, sizeof out,
                    "plan --model configs/llama-3-8b.json --world %d --block-rows 32 --max-padding 2 --json",
                    next);
    RF_CHECK(rc == 0 && (next == 1000 || strstr(out, "\"max_padding_met\":false")), "at %d: '%.300s'", next,
             out);
  }

  /* errors */
  snprintf(bad, sizeof bad, "%s/bad.json", dir);
  RF_ASSERT(rf_file_write_all(bad, "{\"model_type\": \"bert\"}", 22) == 0);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 8", bad);
  RF_CHECK(rc == 1 && strstr(out, "bad.json") && strstr(out, "model_type"), "unknown type: rc %d '%s'", rc,
           out);
  const char *neg = "{\"units\": [{\"name\": \"a\", \"tensors\": [{\"name\": \"w\", \"shape\": [3, -1]}]}]}";
  RF_ASSERT(rf_file_write_all(bad, neg, strlen(neg)) == 0);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 8", bad);
  RF_CHECK(rc == 1 && strstr(out, "bad.json") && strstr(out, "shape[1]"), "bad shape: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --model %s/none.json --world 8", dir);
  RF_CHECK(rc == 1 && strstr(out, "none.json"), "missing file: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 0", path);
  RF_CHECK(rc == 2 && strstr(out, "--world"), "world 0: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 8,", path);
  RF_CHECK(rc == 2 && strstr(out, "--world"), "world 8,: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 8 --param-dtype f16", path);
  RF_CHECK(rc == 2 && strstr(out, "dtype"), "dtype: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 8 --align-bytes 3", path);
  RF_CHECK(rc == 2 && strstr(out, "--align-bytes"), "align: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world 8 --block-rows 0", path);
  RF_CHECK(rc == 2 && strstr(out, "--block-rows"), "block rows: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --world 8");
  RF_CHECK(rc == 2 && strstr(out, "--model is required"), "no model: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "plan --help");
  RF_CHECK(rc == 0 && strstr(out, "--max-padding"), "help: rc %d '%s'", rc, out);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_plan_cli");
}
