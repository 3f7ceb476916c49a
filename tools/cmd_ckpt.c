/* rfsdp ckpt: inspect a checkpoint directory, export its parameters to safetensors
 * (with --fp8, the model's linear weights in DeepSeek-V3's FP8 format). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <time.h>

#include "commands.h"
#include "options.h"
#include "porch.h"
#include "rfsdp_ckpt.h"
#include "rfsdp_model.h"

static const char *rf_ckpt_usage =
    "usage: rfsdp ckpt info DIR [--verify]\n"
    "       rfsdp ckpt export DIR --out FILE.safetensors [--dtype f32|bf16]\n"
    "                         [--fp8 [--fp8-pow2-scales] [--model CONFIG]]";

static void rf_ckpt_print_shape(char *out, size_t cap, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/* The monotonic clock in nanoseconds. */
static uint64_t rf_ckpt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The states a run saved from tensor views recorded, or "none". */
static void rf_ckpt_print_states(const char *extra_json) {
  cJSON *extra = cJSON_Parse(extra_json ? extra_json : "{}");
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(extra, RF_CHECKPOINT_STATES_KEY);
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
    snprintf(marker, sizeof marker, "%s/%s/%s", dir, e->d_name, RF_CHECKPOINT_MARKER);
    if (access(marker, F_OK) != 0) continue;
    fprintf(stderr, "%s %s/%s\n", n++ ? "   " : "complete checkpoints inside:", dir, e->d_name);
  }
  closedir(d);
}

static int rf_ckpt_info(const char *dir, int verify) {
  struct rf_checkpoint *ck;
  if (rf_checkpoint_open(&ck, dir) != 0) {
    fprintf(stderr, "rfsdp ckpt info: %s\n", rf_checkpoint_error());
    rf_ckpt_print_children(dir);
    return 1;
  }
  const char *extra = rf_checkpoint_extra_json(ck);
  printf("checkpoint %s: format version %d, step %" PRId64 ", world %d, checksum chunk %" PRId64 " bytes\n",
         dir, rf_checkpoint_format_version(ck), rf_checkpoint_step(ck), rf_checkpoint_world(ck),
         rf_checkpoint_chunk_bytes(ck));
  printf("extra: %s\n", extra);
  rf_ckpt_print_states(extra);
  int64_t total = 0, param_bytes = 0, param_elems = 0;
  int n_params = 0, n_tensors = rf_checkpoint_tensor_count(ck);
  printf("%-48s %-8s %-20s %14s %6s  %s\n", "tensor", "dtype", "shape", "bytes", "ranges", "kind");
  for (int i = 0; i < n_tensors; i++) {
    const char *name = rf_checkpoint_tensor_name(ck, i);
    enum rf_dtype dtype;
    int ndim;
    int64_t dims[RF_CHECKPOINT_MAX_DIMS], numel = 1;
    RF_TOOL_ASSERT(rf_checkpoint_tensor_info(ck, name, &dtype, &ndim, dims) == 0);
    for (int d = 0; d < ndim; d++) numel *= dims[d];
    char shape[160];
    rf_ckpt_print_shape(shape, sizeof shape, ndim, dims);
    int64_t bytes = numel * (int64_t)rf_dtype_size(dtype);
    int param = rf_checkpoint_tensor_is_param(ck, name);
    printf("%-48s %-8s %-20s %14" PRId64 " %6d  %s\n", name, rf_dtype_name(dtype), shape, bytes,
           rf_checkpoint_tensor_ranges(ck, name), param ? "param" : "state");
    total += bytes;
    if (param) {
      n_params++;
      param_bytes += bytes;
      param_elems += numel;
    }
  }
  printf("total: %d tensors, %" PRId64 " bytes; parameters: %d tensors, %" PRId64 " elements, %" PRId64
         " bytes\n",
         n_tensors, total, n_params, param_elems, param_bytes);
  int rc = 0;
  if (verify) {
    uint64_t read = 0;
    if (rf_checkpoint_verify(ck, &read) != 0) {
      fprintf(stderr, "rfsdp ckpt info: %s\n", rf_checkpoint_error());
      rc = 1;
    } else {
      printf("verified: every checksum of %" PRIu64 " data bytes matches\n", read);
    }
  }
  rf_checkpoint_close(ck);
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
  struct rf_checkpoint *ck;
  if (rf_checkpoint_open(&ck, dir) != 0) return NULL;
  cJSON *extra = cJSON_Parse(rf_checkpoint_extra_json(ck));
  const cJSON *program = cJSON_GetObjectItemCaseSensitive(extra, "program");
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(program ? program : extra, "model");
  char *path = cJSON_IsString(model) ? strdup(model->valuestring) : NULL;
  if (!path)
    rf_fsdp_error_set(__FILE__, __LINE__,
                      "%s: the checkpoint records no model config: name it with --model CONFIG", dir);
  cJSON_Delete(extra);
  rf_checkpoint_close(ck);
  return path;
}

/* The export with the tensors the model's description marks fp8 (linear weights:
 * attention, MLP, experts) quantized. */
static int rf_ckpt_export_fp8_cmd(const char *dir, const char *out, enum rf_dtype dt, const char *model,
                                  int pow2) {
  char *path = model ? strdup(model) : rf_ckpt_model_of(dir);
  if (!path) return -1;
  char **names = NULL;
  int n = 0;
  if (rf_train_model_fp8_names(path, &names, &n) != 0) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rf_fsdp_error());
    rf_fsdp_error_set(__FILE__, __LINE__, "%s (the model config of --fp8%s)", msg,
                      model ? "" : ", recorded in the checkpoint: --model CONFIG names another");
    free(path);
    return -1;
  }
  int rc = 0;
  if (n == 0)
    rc = rf_fsdp_error_set(__FILE__, __LINE__, "%s: the model has no linear weights to export in FP8", path);
  if (rc == 0) rc = rf_checkpoint_export(dir, out, dt, (const char *const *)names, n, pow2);
  if (rc == 0)
    printf(
        "fp8: %d tensors as F8_E4M3 + _scale_inv (128x128 blocks, model %s); their config.json: "
        "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
        "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}\n",
        n, path);
  free(names);
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
  char **rest = rf_tool_calloc((size_t)argc + 1, sizeof *rest);
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
    fprintf(stderr, "rfsdp ckpt: %s\n", rf_fsdp_error());
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
    fprintf(stderr, "rfsdp ckpt export: %s\n", rf_fsdp_error());
    return 2;
  }
  enum rf_dtype dt = strcmp(dtype, "bf16") == 0 ? RF_DTYPE_BF16 : RF_DTYPE_F32;
  uint64_t t0 = rf_ckpt_now_ns();
  if ((fp8 ? rf_ckpt_export_fp8_cmd(dir, out, dt, model, pow2)
           : rf_checkpoint_export(dir, out, dt, NULL, 0, 0)) != 0) {
    fprintf(stderr, "rfsdp ckpt export: %s\n", rf_fsdp_error());
    return 1;
  }
  FILE *f = fopen(out, "rb");
  long bytes = -1;
  if (f && fseek(f, 0, SEEK_END) == 0) bytes = ftell(f);
  if (f) fclose(f);
  printf("export: %s -> %s (%s%s, %ld bytes, %.2f s)\n", dir, out, fp8 ? "fp8 + " : "", dtype, bytes,
         (double)(rf_ckpt_now_ns() - t0) / 1e9);
  return 0;
}
