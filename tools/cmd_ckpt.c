/* rfsdp ckpt: inspect a checkpoint directory, export its parameters to safetensors
 * (with --fp8, the model's linear weights in DeepSeek-V3's FP8 format). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "commands.h"
#include "model/model.h"
#include "options.h"

static const char *rf_ckpt_usage =
    "usage: rfsdp ckpt info DIR [--verify]\n"
    "       rfsdp ckpt export DIR --out FILE.safetensors [--dtype f32|bf16]\n"
    "                         [--fp8 [--fp8-pow2-scales] [--model CONFIG]]";

static void rf_ckpt_print_shape(char *out, size_t cap, const struct rf_ckpt_tensor *t) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < t->ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, d ? ", %" PRId64 : "%" PRId64, t->shape[d]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/* The states recorded by rf_ckpt_save_views, or "none". */
static void rf_ckpt_print_states(const char *extra_json) {
  cJSON *extra = cJSON_Parse(extra_json ? extra_json : "{}");
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(extra, RF_CKPT_STATES_KEY);
  printf("states: ");
  int n = 0;
  for (const cJSON *o = cJSON_IsArray(list) ? list->child : NULL; o; o = o->next, n++) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "suffix"),
                *d = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    printf("%s%s (%s)", n ? ", " : "", cJSON_IsString(s) ? s->valuestring : "?",
           cJSON_IsString(d) ? d->valuestring : "?");
  }
  printf("%s\n", n ? "" : cJSON_IsArray(list) ? "none" : "(not saved from tensor views)");
  cJSON_Delete(extra);
}

/* When DIR is not a checkpoint but holds complete ones (a --ckpt-dir), names them. */
static void rf_ckpt_print_children(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  int n = 0;
  const struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char marker[RF_FILE_PATH_MAX + 300];
    snprintf(marker, sizeof marker, "%s/%s/%s", dir, e->d_name, RF_CKPT_MARKER);
    if (access(marker, F_OK) != 0) continue;
    fprintf(stderr, "%s %s/%s\n", n++ ? "   " : "complete checkpoints inside:", dir, e->d_name);
  }
  closedir(d);
}

static int rf_ckpt_info(const char *dir, int verify) {
  struct rf_ckpt ck;
  if (rf_ckpt_open(&ck, dir) != 0) {
    fprintf(stderr, "rfsdp ckpt info: %s\n", rf_error_msg());
    rf_ckpt_print_children(dir);
    return 1;
  }
  printf("checkpoint %s: format version %d, step %" PRId64 ", world %d, checksum chunk %" PRId64 " bytes\n",
         dir, ck.version, ck.step, ck.world, ck.chunk_bytes);
  printf("extra: %s\n", ck.extra_json ? ck.extra_json : "{}");
  rf_ckpt_print_states(ck.extra_json);
  int64_t total = 0, param_bytes = 0, param_elems = 0;
  int n_params = 0;
  printf("%-48s %-8s %-20s %14s %6s  %s\n", "tensor", "dtype", "shape", "bytes", "ranges", "kind");
  for (int i = 0; i < ck.n_tensors; i++) {
    const struct rf_ckpt_tensor *t = &ck.tensors[i];
    char shape[160];
    rf_ckpt_print_shape(shape, sizeof shape, t);
    int64_t bytes = t->numel * (int64_t)rf_dtype_size(t->dtype);
    int param = rf_ckpt_is_param(&ck, t);
    printf("%-48s %-8s %-20s %14" PRId64 " %6d  %s\n", t->name, rf_dtype_name(t->dtype), shape, bytes,
           t->n_ranges, param ? "param" : "state");
    total += bytes;
    if (param) {
      n_params++;
      param_bytes += bytes;
      param_elems += t->numel;
    }
  }
  printf("total: %d tensors, %" PRId64 " bytes; parameters: %d tensors, %" PRId64 " elements, %" PRId64
         " bytes\n",
         ck.n_tensors, total, n_params, param_elems, param_bytes);
  int rc = 0;
  if (verify) {
    if (rf_ckpt_verify(&ck) != 0) {
      fprintf(stderr, "rfsdp ckpt info: %s\n", rf_error_msg());
      rc = 1;
    } else {
      printf("verified: every checksum of %" PRIu64 " data bytes matches\n", ck.bytes_read);
    }
  }
  rf_ckpt_close(&ck);
  return rc;
}

/* Fails when --out is one of the checkpoint's own files: the export would destroy
 * what it reads. */
static int rf_ckpt_check_out(const char *dir, const char *out) {
  DIR *d = opendir(dir);
  if (!d) return 0; /* the export names the missing directory */
  const struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[RF_FILE_PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    rc = rf_option_check_distinct("out", out, "the checkpoint's", path);
  }
  closedir(d);
  return rc;
}

/* The model config a checkpoint was trained with: the "model" its program recorded
 * (rfsdp train), or NULL with a message. */
static char *rf_ckpt_model_of(const char *dir) {
  struct rf_ckpt ck;
  if (rf_ckpt_open(&ck, dir) != 0) return NULL;
  cJSON *extra = cJSON_Parse(ck.extra_json ? ck.extra_json : "{}");
  const cJSON *program = cJSON_GetObjectItemCaseSensitive(extra, "program");
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(program ? program : extra, "model");
  char *path = cJSON_IsString(model) ? strdup(model->valuestring) : NULL;
  if (!path)
    rf_error_set(__FILE__, __LINE__,
                 "%s: the checkpoint records no model config: name it with --model CONFIG", dir);
  cJSON_Delete(extra);
  rf_ckpt_close(&ck);
  return path;
}

/* The export with the tensors the model's description marks fp8 (linear weights:
 * attention, MLP, experts) quantized. */
static int rf_ckpt_export_fp8_cmd(const char *dir, const char *out, enum rf_dtype dt, const char *model,
                                  int pow2) {
  char *path = model ? strdup(model) : rf_ckpt_model_of(dir);
  if (!path) return -1;
  struct rf_model_desc desc;
  if (rf_model_desc_load(path, &desc) != 0) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rf_error_msg());
    rf_error_set(__FILE__, __LINE__, "%s (the model config of --fp8%s)", msg,
                 model ? "" : ", recorded in the checkpoint: --model CONFIG names another");
    free(path);
    return -1;
  }
  const char **names = rf_xcalloc((size_t)desc.n_tensors + 1, sizeof *names);
  int n = 0;
  for (int u = 0; u < desc.n_units; u++)
    for (int i = 0; i < desc.units[u].n_tensors; i++)
      if (desc.units[u].tensors[i].fp8) names[n++] = desc.units[u].tensors[i].name;
  int rc = 0;
  if (n == 0)
    rc = rf_error_set(__FILE__, __LINE__, "%s: the model has no linear weights to export in FP8", path);
  struct rf_ckpt_export_fp8 fp8 = {.n = n, .names = names, .pow2 = pow2};
  if (rc == 0) rc = rf_ckpt_export_safetensors_fp8(dir, out, dt, &fp8);
  if (rc == 0)
    printf(
        "fp8: %d tensors as F8_E4M3 + _scale_inv (128x128 blocks, model %s); their config.json: "
        "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
        "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}\n",
        n, path);
  free(names);
  rf_model_desc_free(&desc);
  free(path);
  return rc;
}

int rf_cmd_ckpt(int argc, char **argv) {
  if (argc >= 2 &&
      (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0)) {
    printf("%s\n", rf_ckpt_usage);
    return 0;
  }
  if (argc < 2 || (strcmp(argv[1], "info") != 0 && strcmp(argv[1], "export") != 0)) {
    fprintf(stderr, "rfsdp ckpt: expected 'info DIR' or 'export DIR'\n%s\n", rf_ckpt_usage);
    return 2;
  }
  const char *sub = argv[1], *dir = argc >= 3 && strncmp(argv[2], "-", 1) != 0 ? argv[2] : NULL;
  char name[32];
  snprintf(name, sizeof name, "ckpt %s", sub);
  int first = dir ? 3 : 2; /* the options follow DIR */
  char **rest = rf_xcalloc((size_t)argc + 1, sizeof *rest);
  rest[0] = name;
  for (int i = first; i < argc; i++) rest[i - first + 1] = argv[i];
  int n_rest = argc - first + 1, verify = 0, fp8 = 0, pow2 = 0, rc;
  const char *out = NULL, *dtype = "f32", *model = NULL;
  if (strcmp(sub, "info") == 0) {
    const struct rf_option options[] = {
        {"verify", RF_OPTION_KIND_FLAG, &verify, "also read every byte and check every checksum", NULL, 0},
    };
    rc = rf_options_parse(n_rest, rest, options, 1, rf_ckpt_usage);
  } else {
    const struct rf_option options[] = {
        {"out", RF_OPTION_KIND_STRING, &out, "the safetensors file to write (atomically)", NULL, 1},
        {"dtype", RF_OPTION_KIND_CHOICE, &dtype, "the dtype of the exported tensors", "f32|bf16", 0},
        {"fp8", RF_OPTION_KIND_FLAG, &fp8,
         "the linear weights as FP8 e4m3 + f32 weight_scale_inv per 128x128 block (DeepSeek-V3's format); "
         "the other tensors in --dtype",
         NULL, 0},
        {"fp8-pow2-scales", RF_OPTION_KIND_FLAG, &pow2, "with --fp8: scales rounded up to powers of two",
         NULL, 0},
        {"model", RF_OPTION_KIND_STRING, &model,
         "with --fp8: the model config naming the linear weights (default: the one the checkpoint records)",
         NULL, 0},
    };
    rc = rf_options_parse(n_rest, rest, options, 5, rf_ckpt_usage);
  }
  free(rest);
  if (rc == 1) return 0;
  if (rc != 0) {
    fprintf(stderr, "rfsdp ckpt: %s\n", rf_error_msg());
    return 2;
  }
  if (!dir) {
    fprintf(stderr, "rfsdp ckpt %s: the checkpoint directory is missing\n%s\n", sub, rf_ckpt_usage);
    return 2;
  }
  if (strcmp(sub, "info") == 0) return rf_ckpt_info(dir, verify);
  if (!fp8 && (pow2 || model)) {
    fprintf(stderr, "rfsdp ckpt export: --%s applies only with --fp8\n", pow2 ? "fp8-pow2-scales" : "model");
    return 2;
  }
  if (rf_ckpt_check_out(dir, out) != 0) {
    fprintf(stderr, "rfsdp ckpt export: %s\n", rf_error_msg());
    return 2;
  }
  enum rf_dtype dt = strcmp(dtype, "bf16") == 0 ? RF_DTYPE_BF16 : RF_DTYPE_F32;
  uint64_t t0 = rf_time_ns();
  if ((fp8 ? rf_ckpt_export_fp8_cmd(dir, out, dt, model, pow2) : rf_ckpt_export_safetensors(dir, out, dt)) !=
      0) {
    fprintf(stderr, "rfsdp ckpt export: %s\n", rf_error_msg());
    return 1;
  }
  FILE *f = fopen(out, "rb");
  long bytes = -1;
  if (f && fseek(f, 0, SEEK_END) == 0) bytes = ftell(f);
  if (f) fclose(f);
  printf("export: %s -> %s (%s%s, %ld bytes, %.2f s)\n", dir, out, fp8 ? "fp8 + " : "", dtype, bytes,
         (double)(rf_time_ns() - t0) / 1e9);
  return 0;
}
