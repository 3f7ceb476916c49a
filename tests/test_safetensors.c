/* rf-test: timeout=30
 * src/safetensors against outside references: the file written by the Python
 * `safetensors` library (tests/ref_safetensors.py; values as f32 bit patterns
 * computed by PyTorch) reads back exactly, whole and by random ranges; the
 * writer's output, streamed in random pieces, is parsed by an independent reader
 * below (cJSON + raw bytes, following the format's description) and by ours; f16
 * conversion against exhaustive and nearest-value checks; broken files are
 * refused with a message naming the file and the problem.
 * RF_SAFETENSORS_KEEP=1 keeps the written file and prints its path (for a check with the
 * Python library: tests/ref_safetensors.py --check FILE). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rf_test.h"
#include "safetensors/safetensors.h"

#ifndef RF_TEST_DATA
#define RF_TEST_DATA "tests/data"
#endif

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

/* ---- the file written by the Python library ---------------------------------- */

static void test_reference(void) {
  struct rf_safetensors_file f;
  const char *path = RF_TEST_DATA "/safetensors_ref.safetensors";
  if (rf_safetensors_open(&f, path) != 0) {
    RF_CHECK(0, "open %s: %s", path, rf_error_msg());
    return;
  }
  char *text;
  size_t n;
  RF_ASSERT(rf_file_read_all(RF_TEST_DATA "/safetensors_ref.json", &text, &n) == 0);
  cJSON *want = cJSON_Parse(text);
  free(text);
  RF_ASSERT(want);
  RF_CHECK(f.n_tensors == cJSON_GetArraySize(want), "%d tensors, expected %d", f.n_tensors,
           cJSON_GetArraySize(want));
  RF_CHECK(f.metadata_json && strstr(f.metadata_json, "\"source\":\"tests/ref_safetensors.py\""),
           "metadata %s", f.metadata_json ? f.metadata_json : "(none)");
  static const struct {
    const char *torch, *st;
  } names[] = {
      {"float32", "F32"}, {"bfloat16", "BF16"}, {"float16", "F16"}, {"uint8", "U8"}, {"int64", "I64"}};
  uint64_t rng = 5;
  int n_checked = 0;
  for (const cJSON *e = want->child; e; e = e->next) {
    const struct rf_safetensors_tensor *t = rf_safetensors_find(&f, e->string);
    RF_CHECK(t, "tensor %s missing", e->string);
    if (!t) continue;
    const char *dt = cJSON_GetObjectItem(e, "dtype")->valuestring, *st = "?";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
      if (strcmp(names[i].torch, dt) == 0) st = names[i].st;
    RF_CHECK(strcmp(rf_safetensors_dtype_name(t->dtype), st) == 0, "%s: dtype %s, expected %s", t->name,
             rf_safetensors_dtype_name(t->dtype), st);
    const cJSON *shape = cJSON_GetObjectItem(e, "shape");
    RF_CHECK(t->ndim == cJSON_GetArraySize(shape), "%s: ndim %d", t->name, t->ndim);
    for (int d = 0; d < t->ndim; d++)
      RF_CHECK(t->shape[d] == (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble, "%s: dim %d", t->name, d);
    const cJSON *fb = cJSON_GetObjectItem(e, "f32_bits");
    if (fb) {
      RF_CHECK(cJSON_GetArraySize(fb) == t->numel, "%s: numel", t->name);
      float *x = malloc((size_t)(t->numel + 1) * 4);
      RF_CHECK(rf_safetensors_read_f32(&f, t->name, 0, t->numel, x) == 0, "%s", rf_error_msg());
      int64_t i = 0, bad = 0;
      for (const cJSON *v = fb->child; v; v = v->next, i++) bad += bits_of(x[i]) != (uint32_t)v->valuedouble;
      RF_CHECK(bad == 0, "%s: %lld of %lld values differ from PyTorch's", t->name, (long long)bad,
               (long long)t->numel);
      for (int k = 0; k < 20 && t->numel > 0; k++) { /* random ranges */
        int64_t b = (int64_t)(rf_test_rand_u64(&rng) % (uint64_t)t->numel);
        int64_t en = b + (int64_t)(rf_test_rand_u64(&rng) % (uint64_t)(t->numel - b + 1));
        float *y = malloc((size_t)(en - b + 1) * 4);
        RF_CHECK(rf_safetensors_read_f32(&f, t->name, b, en, y) == 0, "%s", rf_error_msg());
        RF_CHECK(en == b || memcmp(y, x + b, (size_t)(en - b) * 4) == 0, "%s [%lld, %lld)", t->name,
                 (long long)b, (long long)en);
        free(y);
      }
      free(x);
      n_checked++;
    } else {
      const cJSON *vals = cJSON_GetObjectItem(e, "values");
      size_t es = rf_safetensors_dtype_size(t->dtype);
      uint8_t *raw = malloc((size_t)t->numel * es);
      RF_CHECK(rf_safetensors_read_raw(&f, t->name, 0, t->numel, raw) == 0, "%s", rf_error_msg());
      int64_t i = 0, bad = 0;
      for (const cJSON *v = vals->child; v; v = v->next, i++) {
        int64_t got = 0;
        if (es == 1)
          got = raw[i];
        else
          memcpy(&got, raw + 8 * i, 8);
        bad += got != (int64_t)v->valuedouble;
      }
      RF_CHECK(bad == 0, "%s: %lld values differ", t->name, (long long)bad);
      float dummy[64];
      RF_CHECK(rf_safetensors_read_f32(&f, t->name, 0, 1, dummy) != 0 &&
                   strstr(rf_error_msg(), "only F32, BF16 and F16"),
               "%s read as f32: %s", t->name, rf_error_msg());
      free(raw);
      n_checked++;
    }
  }
  RF_CHECK(n_checked == 11, "%d tensors checked", n_checked);
  float x[4];
  RF_CHECK(
      rf_safetensors_read_f32(&f, "model.norm.weight", 10, 17, x) != 0 && strstr(rf_error_msg(), "outside"),
      "range outside: %s", rf_error_msg());
  RF_CHECK(rf_safetensors_read_f32(&f, "nope", 0, 1, x) != 0 && strstr(rf_error_msg(), "no tensor 'nope'"),
           "%s", rf_error_msg());
  cJSON_Delete(want);
  rf_safetensors_close(&f);
}

/* ---- f16 --------------------------------------------------------------------- */

static void test_f16(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) { /* every half survives a round trip */
    float x = rf_f32_from_f16((uint16_t)h);
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double want = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    if (h & 0x8000) want = -want;
    if (!(e == 31 && m) && (double)x != want) bad++;
    if (e == 31 && m && !isnan(x)) bad++;
    if (rf_f16_from_f32(x) != (e == 31 && m ? h | 0x200 : h)) bad++; /* NaNs come back quiet */
  }
  RF_CHECK(bad == 0, "%d f16 values wrong", bad);
  /* f32 -> f16: the nearest half, ties to even (checked against the neighbours) */
  uint64_t rng = 9;
  bad = 0;
  for (int i = 0; i < 200000; i++) {
    uint32_t u = (uint32_t)rf_test_rand_u64(&rng);
    float x;
    memcpy(&x, &u, 4);
    if (isnan(x)) continue;
    if (i % 2) x = ldexpf(rf_test_rand_f32(&rng), (int)(rf_test_rand_u64(&rng) % 44) - 28);
    uint16_t h = rf_f16_from_f32(x);
    double ax = fabs((double)x), got = fabs((double)rf_f32_from_f16(h));
    uint16_t hm = h & 0x7fff;
    double lo = hm > 0 ? fabs((double)rf_f32_from_f16((uint16_t)(hm - 1))) : -1;
    double hi = hm < 0x7c00 ? fabs((double)rf_f32_from_f16((uint16_t)(hm + 1))) : INFINITY;
    if (hm == 0x7c00) { /* inf: x at least halfway between 65504 and 65536 */
      if (ax < 65520) bad++;
      continue;
    }
    if (hm == 0x7bff && ax >= 65520) bad++;
    double d = fabs(got - ax);
    if (!(d <= fabs(lo - ax)) || (hi != INFINITY && !(d <= fabs(hi - ax)))) bad++; /* a NaN is bad */
    if ((d == fabs(lo - ax) || d == fabs(hi - ax)) && d > 0 && (hm & 1)) bad++;
    if (signbit(x) != signbit(rf_f32_from_f16(h))) bad++;
  }
  RF_CHECK(bad == 0, "%d f32->f16 roundings wrong", bad);
}

/* ---- the writer, read by an independent parser ------------------------------- */

#define N_W 7

static void test_writer(const char *dir) {
  char path[256];
  snprintf(path, sizeof path, "%s/w.safetensors", dir);
  const struct rf_safetensors_decl decls[N_W] = {
      {"model.embed_tokens.weight", RF_SAFETENSORS_DTYPE_F32, 2, {301, 17}},
      {"empty", RF_SAFETENSORS_DTYPE_F32, 2, {0, 4}},
      {"model.layers.0.self_attn.q_proj.weight", RF_SAFETENSORS_DTYPE_BF16, 2, {33, 29}},
      {"scalar", RF_SAFETENSORS_DTYPE_F32, 0, {0}},
      {"half", RF_SAFETENSORS_DTYPE_F16, 3, {3, 5, 7}},
      {"codes", RF_SAFETENSORS_DTYPE_U8, 1, {1001}},
      {"model.norm.weight", RF_SAFETENSORS_DTYPE_F32, 1, {17}},
  };
  /* the values, as f32 (converted on the way for bf16/f16) or raw bytes (u8) */
  float *vals[N_W];
  int64_t numel[N_W];
  uint64_t rng = 77;
  for (int i = 0; i < N_W; i++) {
    numel[i] = 1;
    for (int d = 0; d < decls[i].ndim; d++) numel[i] *= decls[i].shape[d];
    vals[i] = malloc((size_t)(numel[i] + 1) * 4);
    for (int64_t k = 0; k < numel[i]; k++)
      vals[i][k] = decls[i].dtype == RF_SAFETENSORS_DTYPE_U8 ? (float)(rf_test_rand_u64(&rng) % 256)
                                                             : rf_test_rand_f32(&rng) * 3.0f;
  }
  struct rf_safetensors_writer w;
  RF_ASSERT(rf_safetensors_writer_open(&w, path, N_W, decls, "{\"format\":\"pt\",\"by\":\"rfsdp\"}") == 0);
  RF_CHECK(access(path, F_OK) != 0, "the file appears only at commit");
  for (int i = 0; i < N_W; i++) {
    for (int64_t at = 0; at < numel[i];) { /* random pieces */
      int64_t k = rf_min_i64(numel[i] - at, 1 + (int64_t)(rf_test_rand_u64(&rng) % 300));
      if (decls[i].dtype == RF_SAFETENSORS_DTYPE_U8) {
        uint8_t b[300];
        for (int64_t j = 0; j < k; j++) b[j] = (uint8_t)vals[i][at + j];
        RF_CHECK(rf_safetensors_writer_write(&w, b, (size_t)k) == 0, "%s", rf_error_msg());
      } else {
        RF_CHECK(rf_safetensors_writer_write_f32(&w, vals[i] + at, k) == 0, "%s", rf_error_msg());
      }
      at += k;
    }
  }
  uint8_t extra = 1;
  RF_CHECK(
      rf_safetensors_writer_write(&w, &extra, 1) != 0 && strstr(rf_error_msg(), "more than the declared"),
      "extra byte refused: %s", rf_error_msg());
  RF_CHECK(rf_safetensors_writer_commit(&w) == 0, "%s", rf_error_msg());

  /* independent parse: length, JSON, offsets, then raw bytes compared */
  char *file;
  size_t bytes;
  RF_ASSERT(rf_file_read_all(path, &file, &bytes) == 0);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (uint8_t)file[i];
  RF_CHECK(hlen % 8 == 0 && 8 + hlen <= bytes, "header length %llu", (unsigned long long)hlen);
  char *htext = malloc(hlen + 1);
  memcpy(htext, file + 8, hlen);
  htext[hlen] = '\0';
  cJSON *head = cJSON_Parse(htext);
  RF_ASSERT(head);
  const cJSON *meta = cJSON_GetObjectItem(head, "__metadata__");
  RF_CHECK(meta && strcmp(cJSON_GetObjectItem(meta, "by")->valuestring, "rfsdp") == 0, "metadata");
  uint64_t total = 0;
  for (int i = 0; i < N_W; i++) {
    const cJSON *o = cJSON_GetObjectItem(head, decls[i].name);
    RF_CHECK(o, "%s missing from the header", decls[i].name);
    if (!o) continue;
    RF_CHECK(
        strcmp(cJSON_GetObjectItem(o, "dtype")->valuestring, rf_safetensors_dtype_name(decls[i].dtype)) == 0,
        "%s dtype", decls[i].name);
    const cJSON *shape = cJSON_GetObjectItem(o, "shape"), *offs = cJSON_GetObjectItem(o, "data_offsets");
    RF_CHECK(cJSON_GetArraySize(shape) == decls[i].ndim, "%s ndim", decls[i].name);
    for (int d = 0; d < decls[i].ndim; d++)
      RF_CHECK((int64_t)cJSON_GetArrayItem(shape, d)->valuedouble == decls[i].shape[d], "%s shape",
               decls[i].name);
    uint64_t b = (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble,
             e = (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
    size_t es = rf_safetensors_dtype_size(decls[i].dtype);
    RF_CHECK(e - b == (uint64_t)numel[i] * es && 8 + hlen + e <= bytes, "%s offsets", decls[i].name);
    total += e - b;
    const uint8_t *p = (const uint8_t *)file + 8 + hlen + b;
    int64_t bad = 0;
    for (int64_t k = 0; k < numel[i]; k++) {
      uint16_t h;
      uint32_t u;
      switch (decls[i].dtype) {
        case RF_SAFETENSORS_DTYPE_F32:
          memcpy(&u, p + 4 * k, 4);
          bad += u != bits_of(vals[i][k]);
          break;
        case RF_SAFETENSORS_DTYPE_BF16:
          memcpy(&h, p + 2 * k, 2);
          bad += h != rf_bf16_from_f32(vals[i][k]);
          break;
        case RF_SAFETENSORS_DTYPE_F16:
          memcpy(&h, p + 2 * k, 2);
          bad += h != rf_f16_from_f32(vals[i][k]);
          break;
        default:
          bad += p[k] != (uint8_t)vals[i][k];
      }
    }
    RF_CHECK(bad == 0, "%s: %lld bytes differ", decls[i].name, (long long)bad);
  }
  RF_CHECK(8 + hlen + total == bytes, "data %llu + header %llu != %zu bytes", (unsigned long long)total,
           (unsigned long long)hlen, bytes);
  cJSON_Delete(head);
  free(htext);
  free(file);

  /* and our reader */
  struct rf_safetensors_file f;
  RF_CHECK(rf_safetensors_open(&f, path) == 0, "%s", rf_error_msg());
  const struct rf_safetensors_tensor *t = rf_safetensors_find(&f, "half");
  float y[105];
  RF_CHECK(t && rf_safetensors_read_f32(&f, "half", 0, 105, y) == 0, "%s", rf_error_msg());
  int bad = 0;
  for (int k = 0; k < 105; k++) bad += bits_of(y[k]) != bits_of(rf_f32_from_f16(rf_f16_from_f32(vals[4][k])));
  RF_CHECK(bad == 0, "half read back: %d differ", bad);
  rf_safetensors_close(&f);

  /* an incomplete file is refused at commit and leaves nothing */
  char path2[300];
  snprintf(path2, sizeof path2, "%s/incomplete.safetensors", dir);
  RF_ASSERT(rf_safetensors_writer_open(&w, path2, N_W, decls, NULL) == 0);
  RF_CHECK(rf_safetensors_writer_write_f32(&w, vals[0], 100) == 0, "%s", rf_error_msg());
  RF_CHECK(rf_safetensors_writer_commit(&w) != 0 &&
               strstr(rf_error_msg(), "incomplete: tensor 'model.embed_tokens.weight'"),
           "incomplete: %s", rf_error_msg());
  RF_CHECK(access(path2, F_OK) != 0, "no file after a refused commit");
  struct rf_safetensors_decl dup[2] = {decls[0], decls[0]};
  RF_CHECK(rf_safetensors_writer_open(&w, path2, 2, dup, NULL) != 0 && strstr(rf_error_msg(), "repeated"),
           "dup: %s", rf_error_msg());
  RF_CHECK(rf_safetensors_writer_open(&w, path2, 1, decls, "{\"a\":1}") != 0 &&
               strstr(rf_error_msg(), "object of strings"),
           "metadata: %s", rf_error_msg());

  if (getenv("RF_SAFETENSORS_KEEP")) {
    char keep[300];
    snprintf(keep, sizeof keep, "/tmp/rf_safetensors_writer_output.safetensors");
    RF_ASSERT(rename(path, keep) == 0);
    printf("kept %s\n", keep);
  }
  for (int i = 0; i < N_W; i++) free(vals[i]);
}

/* ---- broken files ------------------------------------------------------------ */

static void write_st(const char *path, const char *header, size_t data_bytes, int64_t len_override) {
  size_t hl = strlen(header);
  uint64_t len = len_override >= 0 ? (uint64_t)len_override : hl;
  uint8_t *buf = calloc(8 + hl + data_bytes + 1, 1);
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(len >> (8 * i));
  memcpy(buf + 8, header, hl);
  RF_ASSERT(rf_file_write_all(path, buf, 8 + hl + data_bytes) == 0);
  free(buf);
}

static void expect_bad(const char *dir, const char *header, size_t data_bytes, int64_t len_override,
                       const char *problem) {
  char path[256];
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  write_st(path, header, data_bytes, len_override);
  struct rf_safetensors_file f;
  int rc = rf_safetensors_open(&f, path);
  RF_CHECK(rc != 0 && strstr(rf_error_msg(), path) && strstr(rf_error_msg(), problem),
           "%s: expected '%s', got rc %d '%s'", header, problem, rc, rc ? rf_error_msg() : "");
  if (rc == 0) rf_safetensors_close(&f);
}

static void test_bad(const char *dir) {
  const char *ok =
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]}}";
  char path[256];
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  write_st(path, ok, 14, -1);
  struct rf_safetensors_file f;
  RF_CHECK(rf_safetensors_open(&f, path) == 0, "the good file: %s", rf_error_msg());
  rf_safetensors_close(&f);
  expect_bad(dir, ok, 13, -1, "truncated: 13 data bytes, the tensors need 14");
  expect_bad(dir, ok, 15, -1, "trailing bytes");
  expect_bad(dir, ok, 14, 1000, "truncated: the header length says 1000 bytes");
  expect_bad(dir, "", 0, 0, "too short");
  expect_bad(dir, ok, 14, 1u << 30, "larger than");
  expect_bad(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8, -1, "not valid JSON");
  expect_bad(dir, "[1,2]", 0, -1, "not valid JSON");
  expect_bad(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, -1, "bytes after");
  expect_bad(dir,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12, -1, "offsets overlap");
  expect_bad(dir,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
             20, -1, "not contiguous");
  expect_bad(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, -1,
             "hold 8 bytes, its dtype F32 and shape need 12 (wrong size)");
  expect_bad(dir, "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1,
             "unknown dtype 'F33'");
  expect_bad(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, -1, "dimension 0");
  expect_bad(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, -1, "end before");
  expect_bad(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, -1, "data_offsets is not a pair");
  expect_bad(dir,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
             16, -1, "appears twice");
  expect_bad(dir,
             "{\"__metadata__\":{\"k\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
             -1, "is not a string");
  /* metadata allowed, padding spaces allowed, an empty tensor sharing an offset allowed */
  write_st(path,
           "{\"__metadata__\":{\"k\":\"v\"},\"e\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[8,8]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}      ",
           8, -1);
  RF_CHECK(rf_safetensors_open(&f, path) == 0 && f.n_tensors == 2, "metadata, empty tensor, padding: %s",
           rf_error_msg());
  rf_safetensors_close(&f);
  RF_CHECK(rf_safetensors_open(&f, "/nonexistent/x.safetensors") != 0 &&
               strstr(rf_error_msg(), "/nonexistent/x.safetensors"),
           "missing: %s", rf_error_msg());
  /* the reference file cut short */
  char *ref;
  size_t n;
  RF_ASSERT(rf_file_read_all(RF_TEST_DATA "/safetensors_ref.safetensors", &ref, &n) == 0);
  RF_ASSERT(rf_file_write_all(path, ref, n - 3) == 0);
  RF_CHECK(rf_safetensors_open(&f, path) != 0 && strstr(rf_error_msg(), "truncated"), "cut: %s",
           rf_error_msg());
  RF_ASSERT(rf_file_write_all(path, ref, 100) == 0);
  RF_CHECK(rf_safetensors_open(&f, path) != 0 && strstr(rf_error_msg(), "truncated: the header length"),
           "cut header: %s", rf_error_msg());
  free(ref);
}

int main(void) {
  char dir[64] = "/tmp/rf_test_safetensors.XXXXXX";
  RF_ASSERT(mkdtemp(dir));
  test_reference();
  test_f16();
  test_writer(dir);
  test_bad(dir);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_safetensors");
}
