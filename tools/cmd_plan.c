/* rfsdp plan: the planner's layout of a model at one or more world sizes, next
 * to the layouts of FSDP1, FSDP2, DeepSpeed ZeRO-3 and Megatron-FSDP (padding,
 * blocks cut across ranks, bytes copied per step). Every plan printed has
 * passed the independent checker (rf_plan_unit_check). docs/planner.md. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/core.h"
#include "fsdp/fsdp.h"
#include "model/model.h"
#include "options.h"
#include "plan/plan.h"
#include "plan_args.h"
#include "plan_check.h"
#include "plan_sim.h"
#include "rfsdp_model.h"

#define RF_PLAN_CMD_MAX_WORLDS 64
#define RF_PLAN_CMD_MAX_WORLD (1 << 24)

struct rf_plan_cmd {
  const char *model_path;
  struct rf_model_desc model;
  struct rf_plan_unit_in *units; /* the planner's tensor list (rf_model_desc_plan_units) */
  struct rf_plan_args args;      /* spelled as in rfsdp train */
  int64_t align_bytes;
  size_t elem_bytes; /* the peers' copies are counted in the parameter dtype */
  int max_buffers;
  double max_padding; /* percent; < 0: off */
  int json, buffers;
  struct rf_plan_policy policy; /* what rfsdp train would run with these options */
  struct rf_plan_sim_args sim;  /* --batch > 0: simulate a step (plan_sim.c) */
  struct rf_plan_sim_model sim_model;
  enum rf_optim_kind optim;
};

static int rf_plan_cmd_worlds(const char *text, int *worlds, int *n) {
  *n = 0;
  const char *p = text;
  while (*p) {
    char *end;
    long w = strtol(p, &end, 10);
    RF_REQUIRE(end != p && w >= 1 && w <= RF_PLAN_CMD_MAX_WORLD && (*end == ',' || *end == 0),
               "--world: '%s' is not a list of world sizes 1..%d separated by commas", text,
               RF_PLAN_CMD_MAX_WORLD);
    RF_REQUIRE(*n < RF_PLAN_CMD_MAX_WORLDS, "--world: at most %d world sizes", RF_PLAN_CMD_MAX_WORLDS);
    worlds[(*n)++] = (int)w;
    p = *end == ',' ? end + 1 : end;
    RF_REQUIRE(*end != ',' || *p, "--world: '%s' ends with a comma", text);
  }
  RF_REQUIRE(*n > 0, "--world: no world size given");
  return 0;
}

static double rf_plan_cmd_ratio(int64_t padded, int64_t elems) {
  return elems > 0 ? (double)(padded - elems) / (double)elems : 0.0;
}

/* Why unit u cannot get under the limit: which constraint of the one-buffer
 * lower bound is to blame. Writes a sentence into why. */
static void rf_plan_cmd_why(const struct rf_plan_cmd *c, int world, int u, const struct rf_plan_unit *p,
                            double limit, char *why, size_t size) {
  const struct rf_model_unit *mu = &c->model.units[u];
  const struct rf_plan_tensor_in *ts = c->units[u].tensors;
  int64_t fair = rf_ceil_div(mu->numel, world);
  int big = 0;
  for (int i = 1; i < mu->n_tensors; i++)
    if (rf_min_i64(ts[i].block_elems, ts[i].numel) > rf_min_i64(ts[big].block_elems, ts[big].numel)) big = i;
  int64_t gmax = rf_min_i64(ts[big].block_elems, ts[big].numel);
  if (p->mode == RF_SHARD_MODE_RAGGED) {
    snprintf(
        why, size,
        "a rank's share is %lld elements but blocks are up to %lld (%s); a shard holds whole blocks, so the "
        "largest is %.2f%% over the mean",
        (long long)fair, (long long)gmax, ts[big].name, 100.0 * (p->imbalance - 1.0));
  } else if ((double)gmax > (double)fair * (1.0 + limit)) {
    snprintf(
        why, size,
        "its largest block (%s, %lld elements) exceeds the fair share of %lld elements per rank, and every "
        "rank's shard must hold a whole block",
        ts[big].name, (long long)gmax, (long long)fair);
  } else {
    /* tensors holding two shard boundaries force S to a multiple of their block */
    int64_t lb = p->bound_padded_elems / world, l = rf_plan_policy_align_elems(&c->policy);
    char names[256] = "";
    size_t k = 0;
    for (int i = 0; i < mu->n_tensors; i++) {
      if (ts[i].numel <= 2 * lb || ts[i].block_elems <= 1) continue;
      l = rf_lcm_i64_capped(l, ts[i].block_elems, (int64_t)1 << 60);
      if (k < sizeof names - 64 && !strstr(names, ts[i].name))
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "", ts[i].name);
    }
    snprintf(
        why, size,
        "tensors that span whole shards (%s) force the shard size to a multiple of the lcm of their blocks "
        "(%lld elements, fair share %lld); the best layout in %d buffer(s) pads %.2f%%",
        names[0] ? names : "none", (long long)l, (long long)fair, p->n_buffers,
        100.0 * rf_plan_cmd_ratio(p->padded_elems, p->elems));
  }
}

static void rf_plan_cmd_bytes(double bytes, char *out, size_t size) {
  if (bytes >= 1e9)
    snprintf(out, size, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    snprintf(out, size, "%.2f MB", bytes / 1e6);
  else
    snprintf(out, size, "%.0f B", bytes);
}

static void rf_plan_cmd_table(const struct rf_plan_cmd *c, const struct rf_plan_model_result *r) {
  int ragged = r->mode == RF_SHARD_MODE_RAGGED;
  int planned = c->policy.layout == RF_LAYOUT_PLANNED;
  printf("\nworld %d, %s shards, %s layout%s\n", r->world, ragged ? "ragged" : "equal", c->args.layout,
         ragged || !planned
             ? ""
             : (c->max_buffers > 1 ? ", up to several buffers per unit" : ", one buffer per unit"));
  printf("  %-10s %10s %12s %12s %16s %8s %9s\n", "layout", "padding", "lower bound", "cut blocks",
         "copy/step/rank", "buffers", "plan ms");
  char lb[32], copy_run[32];
  rf_plan_cmd_bytes((double)r->copy_bytes, copy_run, sizeof copy_run);
  if (ragged || !planned)
    snprintf(lb, sizeof lb, "-");
  else
    snprintf(lb, sizeof lb, "%.3f%%", 100.0 * rf_plan_cmd_ratio(r->bound_padded_elems, r->elems));
  printf("  %-10s %9.3f%% %12s %12lld %16s %8d %9.2f\n", "rfsdp",
         100.0 * rf_plan_cmd_ratio(r->padded_elems, r->elems), lb, (long long)r->split_blocks, copy_run,
         r->n_buffers, r->plan_ms);
  for (int k = 0; k < RF_PLAN_PEER_COUNT; k++) {
    const struct rf_plan_peer_stats *p = &r->peers[k];
    char copy[32];
    rf_plan_cmd_bytes((double)p->copy_elems * (double)c->elem_bytes, copy, sizeof copy);
    printf("  %-10s %9.3f%% %12s %12lld %16s %8s %9s\n", rf_plan_peer_name((enum rf_plan_peer)k),
           100.0 * rf_plan_cmd_ratio(p->padded_elems, p->elems), "", (long long)p->split_blocks, copy, "",
           "");
  }
  double mean = (double)r->elems / r->world;
  printf("  rfsdp: largest shard %lld elements per rank (%.4fx the mean)", (long long)r->max_shard_elems,
         (double)r->max_shard_elems / mean);
  if (ragged) printf(", worst unit imbalance %.4f", r->imbalance);
  if (r->sub_padding_units)
    printf(", padding between fused sub-tensors (experts) in %d unit(s)", r->sub_padding_units);
  printf("\n");
}

/* The FP8 numbers of rfsdp's layout (k = 0) and the peers' (k = 1 + enum rf_plan_peer). */
static int rf_plan_cmd_fp8(const struct rf_plan_cmd *c, int world, struct rf_plan_fp8_stats *s) {
  for (int k = 0; k <= RF_PLAN_PEER_COUNT; k++) {
    s[k] = (struct rf_plan_fp8_stats){0};
    for (int u = 0; u < c->model.n_units; u++)
      RF_TRY(rf_plan_fp8_add(&c->policy, k - 1, &c->units[u], world, &s[k]));
  }
  return 0;
}

/* Bytes a gather of the model moves in the run's own layout: codes and scales
 * (planned), else everything in the param dtype (fsdp2 and flat quantize after the
 * gather). */
static double rf_plan_cmd_fp8_run_bytes(const struct rf_plan_cmd *c, const struct rf_plan_fp8_stats *s) {
  if (c->policy.layout == RF_LAYOUT_PLANNED)
    return (double)rf_plan_fp8_gather_bytes(s, c->policy.param_dtype);
  return (double)s->padded_elems * (double)rf_dtype_size(c->policy.param_dtype);
}

static void rf_plan_cmd_fp8_table(const struct rf_plan_cmd *c, const struct rf_plan_fp8_stats *s) {
  printf(
      "  fp8 (e4m3, 128x128 tiles): %lld of %lld elements quantized in %lld tiles; others gathered in %s\n",
      (long long)s[0].q_elems, (long long)s[0].elems, (long long)s[0].tiles,
      rf_dtype_name(c->policy.param_dtype));
  printf("  %-10s %12s %14s %14s %14s %8s %9s\n", "layout", "tiles cut", "gather fp8", "gather bf16",
         "gather f32", "fp8/f32", "fp8/bf16");
  for (int k = 0; k <= RF_PLAN_PEER_COUNT; k++) {
    double f8 = (double)rf_plan_fp8_gather_bytes(&s[k], c->policy.param_dtype);
    double b16 = 2.0 * (double)s[k].padded_elems, f32 = 4.0 * (double)s[k].padded_elems;
    char a[32], b[32], d[32];
    rf_plan_cmd_bytes(f8, a, sizeof a);
    rf_plan_cmd_bytes(b16, b, sizeof b);
    rf_plan_cmd_bytes(f32, d, sizeof d);
    printf("  %-10s %12lld %14s %14s %14s %8.4f %9.4f\n",
           k == 0 ? "rfsdp" : rf_plan_peer_name((enum rf_plan_peer)(k - 1)), (long long)s[k].cut_tiles, a, b,
           d, f8 / f32, f8 / b16);
  }
  if (c->policy.layout != RF_LAYOUT_PLANNED) {
    char a[32];
    rf_plan_cmd_bytes(rf_plan_cmd_fp8_run_bytes(c, &s[0]), a, sizeof a);
    printf(
        "  the %s layout cuts tiles: rfsdp train gathers its FP8 weights in %s (%s per gather of the model) "
        "and every rank quantizes each whole tensor after the gather\n",
        c->args.layout, rf_dtype_name(c->policy.param_dtype), a);
  }
}

static void rf_plan_cmd_fp8_json(const struct rf_plan_cmd *c, const struct rf_plan_fp8_stats *s, cJSON *o) {
  cJSON *f = cJSON_AddObjectToObject(o, "fp8");
  cJSON_AddNumberToObject(f, "quantized_elems", (double)s[0].q_elems);
  cJSON_AddNumberToObject(f, "tiles", (double)s[0].tiles);
  /* what the run sends: codes (planned), or the param dtype, quantized after the gather */
  cJSON_AddBoolToObject(f, "run_quantizes_after_gather", c->policy.layout != RF_LAYOUT_PLANNED);
  cJSON_AddNumberToObject(f, "run_gather_bytes", rf_plan_cmd_fp8_run_bytes(c, &s[0]));
  for (int k = 0; k <= RF_PLAN_PEER_COUNT; k++) {
    cJSON *x = cJSON_AddObjectToObject(f, k == 0 ? "rfsdp" : rf_plan_peer_name((enum rf_plan_peer)(k - 1)));
    cJSON_AddNumberToObject(x, "tiles_cut", (double)s[k].cut_tiles);
    cJSON_AddNumberToObject(x, "gather_bytes_fp8",
                            (double)rf_plan_fp8_gather_bytes(&s[k], c->policy.param_dtype));
    cJSON_AddNumberToObject(x, "gather_bytes_bf16", 2.0 * (double)s[k].padded_elems);
    cJSON_AddNumberToObject(x, "gather_bytes_f32", 4.0 * (double)s[k].padded_elems);
  }
}

static cJSON *rf_plan_cmd_shape(const int64_t *shape, int ndim) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
  return a;
}

static void rf_plan_cmd_layout_json(const struct rf_plan_cmd *c, const struct rf_plan_model_result *r,
                                    cJSON *obj) {
  cJSON *bufs = cJSON_AddArrayToObject(obj, "buffers");
  for (int u = 0; u < r->n_units; u++) {
    const struct rf_model_unit *mu = &c->model.units[u];
    const struct rf_plan_tensor_in *ts = c->units[u].tensors;
    const struct rf_plan_unit *p = &r->units[u].plan;
    for (int b = 0; b < p->n_buffers; b++) {
      const struct rf_plan_buffer *buf = &p->buffers[b];
      cJSON *jb = cJSON_CreateObject();
      char name[300];
      snprintf(name, sizeof name, "%s/%d", mu->name, b);
      cJSON_AddStringToObject(jb, "unit", mu->name);
      cJSON_AddStringToObject(jb, "name", name);
      cJSON_AddNumberToObject(jb, "total_elems", (double)buf->total_elems);
      if (p->mode == RF_SHARD_MODE_EQUAL) {
        cJSON_AddNumberToObject(jb, "shard_elems", (double)buf->shard_elems);
      } else {
        cJSON *st = cJSON_AddArrayToObject(jb, "shard_starts");
        for (int k = 0; k <= p->world; k++)
          cJSON_AddItemToArray(st, cJSON_CreateNumber((double)buf->starts[k]));
      }
      cJSON *jt = cJSON_AddArrayToObject(jb, "tensors");
      for (int q = 0; q < buf->n_places; q++) {
        const struct rf_plan_place *pl = &buf->places[q];
        const struct rf_plan_tensor_in *t = &ts[pl->tensor];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", t->name);
        cJSON_AddItemToObject(x, "shape", rf_plan_cmd_shape(t->shape, t->ndim));
        cJSON_AddNumberToObject(x, "block_elems", (double)rf_min_i64(t->block_elems, t->numel));
        cJSON_AddNumberToObject(x, "offset", (double)pl->offset);
        if (t->sub_count > 1) {
          cJSON_AddNumberToObject(x, "sub_first", (double)pl->sub_first);
          cJSON_AddNumberToObject(x, "sub_count", (double)pl->sub_n);
          cJSON_AddNumberToObject(x, "sub_stride", (double)pl->sub_stride);
        }
        cJSON_AddItemToArray(jt, x);
      }
      cJSON_AddItemToArray(bufs, jb);
    }
  }
}

static void rf_plan_cmd_json(const struct rf_plan_cmd *c, const struct rf_plan_model_result *r, double limit,
                             int meets, int suggest, const struct rf_sim_result *sim,
                             const struct rf_plan_fp8_stats *fp8) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model", c->model_path);
  cJSON_AddNumberToObject(o, "world", r->world * c->sim.replicate);
  cJSON_AddStringToObject(o, "layout", c->args.layout);
  cJSON_AddStringToObject(o, "shard", r->mode == RF_SHARD_MODE_RAGGED ? "ragged" : "equal");
  cJSON_AddStringToObject(o, "optim", c->args.optim);
  cJSON_AddNumberToObject(o, "block_rows", (double)c->policy.block_rows);
  cJSON_AddNumberToObject(o, "vector_block", (double)c->policy.vector_block);
  cJSON_AddStringToObject(o, "param_dtype", rf_dtype_name(c->policy.param_dtype));
  cJSON_AddStringToObject(o, "reduce_dtype", rf_dtype_name(c->policy.reduce_dtype));
  cJSON_AddNumberToObject(o, "align_bytes", (double)c->align_bytes);
  cJSON_AddNumberToObject(o, "elems", (double)r->elems);
  cJSON_AddNumberToObject(o, "padded_elems", (double)r->padded_elems);
  cJSON_AddNumberToObject(o, "lower_bound_ratio", rf_plan_cmd_ratio(r->bound_padded_elems, r->elems));
  cJSON_AddNumberToObject(o, "imbalance", r->imbalance);
  cJSON_AddNumberToObject(o, "plan_ms", r->plan_ms);
  cJSON_AddNumberToObject(o, "sub_padding_units", r->sub_padding_units);
  struct rf_plan_summary sum = {r->elems,        r->padded_elems, r->max_shard_elems,
                                r->split_blocks, r->copy_bytes,   r->n_buffers};
  rf_plan_summary_json(&sum, o);
  if (limit >= 0) {
    cJSON_AddBoolToObject(o, "max_padding_met", meets);
    if (!meets) cJSON_AddNumberToObject(o, "suggested_group", suggest);
  }
  cJSON *peers = cJSON_AddObjectToObject(o, "peers");
  for (int k = 0; k < RF_PLAN_PEER_COUNT; k++) {
    const struct rf_plan_peer_stats *p = &r->peers[k];
    cJSON *x = cJSON_AddObjectToObject(peers, rf_plan_peer_name((enum rf_plan_peer)k));
    cJSON_AddNumberToObject(x, "padding_ratio", rf_plan_cmd_ratio(p->padded_elems, p->elems));
    cJSON_AddNumberToObject(x, "padded_elems", (double)p->padded_elems);
    cJSON_AddNumberToObject(x, "split_blocks", (double)p->split_blocks);
    cJSON_AddNumberToObject(x, "copy_bytes_per_step", (double)p->copy_elems * (double)c->elem_bytes);
  }
  if (sim) rf_plan_sim_json(&c->sim, &c->sim_model, sim, o);
  if (fp8) rf_plan_cmd_fp8_json(c, fp8, o);
  if (c->buffers) rf_plan_cmd_layout_json(c, r, o);
  char *text = cJSON_PrintUnformatted(o);
  printf("%s\n", text ? text : "{\"error\": \"out of memory\"}");
  free(text);
  cJSON_Delete(o);
}

static void rf_plan_cmd_layout_text(const struct rf_plan_cmd *c, const struct rf_plan_model_result *r) {
  for (int u = 0; u < r->n_units; u++) {
    const struct rf_model_unit *mu = &c->model.units[u];
    const struct rf_plan_tensor_in *ts = c->units[u].tensors;
    const struct rf_plan_unit *p = &r->units[u].plan;
    for (int b = 0; b < p->n_buffers; b++) {
      const struct rf_plan_buffer *buf = &p->buffers[b];
      printf("  buffer %s/%d: %lld elements, %s %lld\n", mu->name, b, (long long)buf->total_elems,
             p->mode == RF_SHARD_MODE_EQUAL ? "shard" : "largest shard", (long long)buf->shard_elems);
      for (int q = 0; q < buf->n_places; q++) {
        const struct rf_plan_place *pl = &buf->places[q];
        const struct rf_plan_tensor_in *t = &ts[pl->tensor];
        printf("    %12lld  %s [", (long long)pl->offset, t->name);
        for (int d = 0; d < t->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
        printf("] block %lld", (long long)rf_min_i64(t->block_elems, t->numel));
        if (t->sub_count > 1 && pl->sub_n != t->sub_count)
          printf(" sub-tensors %lld..%lld stride %lld", (long long)pl->sub_first,
                 (long long)(pl->sub_first + pl->sub_n - 1), (long long)pl->sub_stride);
        printf("\n");
      }
    }
  }
}

static int rf_plan_cmd_world(struct rf_plan_cmd *c, int world) {
  struct rf_plan_model_result r;
  struct rf_sim_result sim;
  RF_TRY(rf_plan_sim_mesh(&c->sim, &c->sim_model, c->units, c->model.n_units, &c->policy, world, c->optim,
                          c->max_padding));
  /* the layout the runtime runs: the shard group's (every replica the same) */
  RF_TRY(rf_plan_model_make(c->units, c->model.n_units, &c->policy, world / c->sim.replicate, 1, &r));
  if (c->sim.batch > 0 &&
      rf_plan_sim_world(&c->sim, &c->sim_model, c->units, &r, &c->policy, world, c->optim, &sim) != 0) {
    rf_plan_model_result_free(&r);
    return -1;
  }
  RF_ASSERT(c->policy.layout != RF_LAYOUT_PLANNED || r.split_blocks == 0); /* the checker passed every unit */
  struct rf_plan_fp8_stats fp8[RF_PLAN_PEER_COUNT + 1];
  if (c->policy.fp8 && rf_plan_cmd_fp8(c, world / c->sim.replicate, fp8) != 0) {
    rf_plan_model_result_free(&r);
    return -1;
  }
  double limit = c->max_padding / 100.0;
  int meets = 1, suggest = 0;
  if (c->max_padding >= 0) {
    meets = rf_plan_model_meets(&r, limit);
    if (!meets) suggest = rf_plan_advise_group(c->units, c->model.n_units, &c->policy, world, 1, limit);
    if (suggest < 0) suggest = 0; /* a smaller group that cannot be laid out ends the search */
  }
  if (c->json) {
    rf_plan_cmd_json(c, &r, c->max_padding >= 0 ? limit : -1, meets, suggest, c->sim.batch > 0 ? &sim : NULL,
                     c->policy.fp8 ? fp8 : NULL);
  } else {
    rf_plan_cmd_table(c, &r);
    if (c->policy.fp8) rf_plan_cmd_fp8_table(c, fp8);
    if (c->sim.batch > 0) rf_plan_sim_print(&c->sim, &c->sim_model, &sim);
    if (c->buffers) rf_plan_cmd_layout_text(c, &r);
    if (c->max_padding >= 0) {
      const char *what = r.mode == RF_SHARD_MODE_RAGGED ? "imbalance" : "padding";
      if (meets) printf("  every unit's %s is at most %.3g%%\n", what, c->max_padding);
      /* one line per kind of unit (same tensor count and padding), then a count of the rest */
      int shown = 0, over = 0, kinds_n[8];
      double kinds_x[8];
      for (int u = 0; u < r.n_units && !meets; u++) {
        double x = rf_plan_unit_excess(&r.units[u].plan);
        if (x <= limit) continue;
        over++;
        int k = 0;
        while (k < shown && !(kinds_n[k] == c->model.units[u].n_tensors && kinds_x[k] == x)) k++;
        if (k < shown || shown == 8) continue;
        kinds_n[shown] = c->model.units[u].n_tensors, kinds_x[shown] = x, shown++;
        char why[640];
        rf_plan_cmd_why(c, world, u, &r.units[u].plan, limit, why, sizeof why);
        printf("  unit %s: %s %.3f%% > %.3g%%: %s\n", c->model.units[u].name, what, 100.0 * x, c->max_padding,
               why);
      }
      if (over > shown) printf("  ... and %d more unit(s) of the same kinds\n", over - shown);
      if (!meets && suggest)
        printf("  suggestion: FSDP groups of %d ranks meet %.3g%%; run HSDP with %d replicas (--world %d)\n",
               suggest, c->max_padding, world / suggest, suggest);
      else if (!meets)
        printf("  no FSDP group size dividing %d meets %.3g%%\n", world, c->max_padding);
    }
  }
  rf_plan_model_result_free(&r);
  return 0;
}

int rf_cmd_plan(int argc, char **argv) {
  struct rf_plan_cmd c = {.args = RF_PLAN_ARGS_DEFAULT, .sim = RF_PLAN_SIM_ARGS_DEFAULT};
  const char *worlds_text = NULL;
  c.align_bytes = 64;
  c.max_buffers = 4;
  c.max_padding = -1;
  char families[256], model_help[400], usage[1024];
  if (rf_train_model_families(families, sizeof families, 0, ", ") != 0) RF_DIE("%s", rf_error_msg());
  snprintf(model_help, sizeof model_help, "a Hugging Face config.json (%s) or a generic units file",
           families);
  snprintf(
      usage, sizeof usage,
      "usage: rfsdp plan --model FILE --world W[,W...] [--optim %s] [--layout planned|fsdp2|flat] [--shard "
      "equal|ragged] [--block-rows R] [--param-dtype f32|bf16] [--reduce-dtype f32|bf16] [--align-bytes "
      "64] [--max-buffers 4] [--max-padding P] [--replicate R|node|auto [--memory-per-rank GB]] [--batch B "
      "--seq T [--accum A] [--rank I] [--compute-dtype f32|bf16] [--network NAME|FILE.json] [--peak-gflops "
      "G] [--efficiency E]] [--fp8 off|block [--fp8-pow2-scales]] [--json] [--buffers]",
      rf_plan_args_optim_choices());
  const struct rf_option options[] = {
      {"model", RF_OPTION_KIND_STRING, &c.model_path, model_help, NULL, 1},
      {"world", RF_OPTION_KIND_STRING, &worlds_text, "world size(s), comma-separated: W[,W...]", NULL, 1},
      RF_PLAN_ARGS_OPTIONS(c.args),
      RF_PLAN_SIM_OPTIONS(c.sim),
      {"align-bytes", RF_OPTION_KIND_I64, &c.align_bytes, "every rank's slice starts on a multiple of this",
       NULL, 0},
      {"max-buffers", RF_OPTION_KIND_INT, &c.max_buffers,
       "equal mode: at most this many buffers per unit (1..8)", NULL, 0},
      {"max-padding", RF_OPTION_KIND_DOUBLE, &c.max_padding,
       "percent: name the units above it (ragged: largest shard over mean) and suggest an FSDP group size "
       "(negative: off)",
       NULL, 0},
      {"json", RF_OPTION_KIND_FLAG, &c.json, "one JSON object per world size", NULL, 0},
      {"buffers", RF_OPTION_KIND_FLAG, &c.buffers,
       "also print every buffer's tensors and offsets (planned and flat layouts)", NULL, 0},
  };
  int rc = rf_options_parse(argc, argv, options, (int)(sizeof options / sizeof options[0]), usage);
  if (rc == 1) return 0;
  int worlds[RF_PLAN_CMD_MAX_WORLDS], n_worlds = 0;
  if (rc == 0) rc = rf_plan_cmd_worlds(worlds_text, worlds, &n_worlds);
  struct rf_fsdp_options fo;
  rf_fsdp_options_default(&fo);
  if (rc == 0) rc = rf_plan_args_fsdp_options(&c.args, &fo);
  if (rc == 0) rc = rf_optim_kind_parse(c.args.optim, &c.optim);
  /* what rfsdp train refuses, refused alike (tools/plan_check.c): the batch at every W */
  for (int i = 0; i < n_worlds && rc == 0 && c.sim.batch > 0; i++)
    rc = rf_plan_check_batch(worlds[i], c.sim.batch, c.sim.accum);
  /* the profile, read before the model: a bad file is an option's mistake */
  int setup = c.sim.batch > 0 || strcmp(c.sim.mesh, "node") == 0;
  struct rf_sim_network net;
  int have_net = 0;
  if (rc == 0 && (setup || strcmp(c.sim.network, "here") != 0)) {
    rc = rf_sim_network_load(c.sim.network, &net);
    have_net = rc == 0;
  }
  /* --replicate at every W, its limits, --rank, --seq: before the model is read */
  if (rc == 0) rc = rf_plan_sim_check(&c.sim, have_net ? &net : NULL, c.max_padding, worlds, n_worlds);
  if (rc == 0 &&
      (c.align_bytes < 4 || (c.align_bytes & (c.align_bytes - 1)) != 0 || c.align_bytes > (1 << 20)))
    rc = rf_error_set(__FILE__, __LINE__, "--align-bytes must be a power of two from 4 to 1 MiB (got %lld)",
                      (long long)c.align_bytes);
  if (rc == 0 && (c.max_buffers < 1 || c.max_buffers > 8))
    rc = rf_error_set(__FILE__, __LINE__, "--max-buffers must be 1..8 (got %d)", c.max_buffers);
  if (rc == 0 && c.buffers && fo.layout == RF_LAYOUT_FSDP2)
    rc =
        rf_error_set(__FILE__, __LINE__,
                     "--buffers lists the buffers of the planned and flat layouts; --layout fsdp2 keeps each "
                     "tensor's own rows per rank");
  if (rc != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", rf_error_msg());
    return 2;
  }
  fo.align_bytes = c.align_bytes;
  fo.max_buffers = c.max_buffers;
  rf_fsdp_plan_policy(&fo, &c.policy);
  c.elem_bytes = rf_dtype_size(c.policy.param_dtype);
  if (rf_model_desc_load(c.model_path, &c.model) != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", rf_error_msg());
    return 1;
  }
  c.units = rf_model_desc_plan_units(&c.model, &c.policy);
  /* the step's numbers, and the network's nodes for --replicate node */
  if (setup && rf_plan_sim_setup(&c.sim, c.model_path, &c.model, &c.sim_model) != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", rf_error_msg());
    rf_plan_sim_model_free(&c.sim_model);
    free(c.units);
    rf_model_desc_free(&c.model);
    return 1;
  }
  if (c.sim.batch > 0 && c.sim_model.have_config &&
      rf_plan_check_seq(c.sim.seq, &c.sim_model.cfg, c.model_path) != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", rf_error_msg());
    rf_plan_sim_model_free(&c.sim_model);
    free(c.units);
    rf_model_desc_free(&c.model);
    return 2;
  }
  if (!c.json)
    printf(
        "rfsdp plan: %s (%s, %lld parameters, %d units, %d tensors), %s layout, optim %s, params %s, reduce "
        "%s, %lld-row blocks, %lld-byte alignment\n",
        c.model_path, c.model.model_type, (long long)c.model.numel, c.model.n_units, c.model.n_tensors,
        c.args.layout, c.args.optim, c.args.param_dtype, c.args.reduce_dtype, (long long)c.policy.block_rows,
        (long long)c.align_bytes);
  int status = 0;
  for (int i = 0; i < n_worlds && status == 0; i++) {
    if (rf_plan_cmd_world(&c, worlds[i]) != 0) {
      fprintf(stderr, "rfsdp plan: %s: world %d: %s\n", c.model_path, worlds[i], rf_error_msg());
      status = 1;
    }
  }
  rf_plan_sim_model_free(&c.sim_model);
  free(c.units);
  rf_model_desc_free(&c.model);
  return status;
}
