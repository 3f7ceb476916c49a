/* rf-bench: np=2,4
 * Checkpoint save and load of the ~100M-parameter LLaMA (configs/llama-100m.json:
 * 16 layers, hidden 768, MLP 2048, 4 KV heads; 101.1M f32 parameters) with two
 * f32 optimizer states (Adam m and v), every tensor split by rows over the ranks,
 * against the raw write speed of the same disk measured in the same run: each
 * rank writes and fsyncs as many bytes as its checkpoint file holds.
 *   save:        rf_ckpt_save_views (every file fsynced, renamed, marker last)
 *   load, cold:  the same split, after the rank files were dropped from the page
 *                cache (posix_fadvise DONTNEED), checksums verified
 *   load, warm:  another split (resharding), page cache warm
 *   export:      rank 0 streams the parameters into a safetensors file (f32)
 * Bytes per rank: written/read by the process (/proc/self/io wchar/rchar).
 * RF_BENCH_DIR: where to write (default /tmp). */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "comm/comm_mpi.h"

#define MAX_T 160

struct model {
  int n;
  char names[MAX_T][64];
  int ndim[MAX_T];
  int64_t shape[MAX_T][2];
  int64_t starts[MAX_T][65];
  struct rf_tensor_view views[MAX_T];
  float *master, *m, *v;
  int64_t slab;
};

static void add(struct model *md, const char *name, int64_t d0, int64_t d1) {
  int t = md->n++;
  snprintf(md->names[t], sizeof md->names[t], "%s", name);
  md->ndim[t] = d1 ? 2 : 1;
  md->shape[t][0] = d0;
  md->shape[t][1] = d1;
}

static void llama_100m(struct model *md) {
  const int64_t h = 768, f = 2048, kv = 256, vocab = 256;
  char name[64];
  add(md, "model.embed_tokens.weight", vocab, h);
  for (int l = 0; l < 16; l++) {
    static const char *const proj[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                        "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                        "mlp.down_proj"};
    const int64_t rows[7] = {h, kv, kv, h, f, f, h}, cols[7] = {h, h, h, h, h, h, f};
    snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
    add(md, name, h, 0);
    for (int p = 0; p < 7; p++) {
      snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, proj[p]);
      add(md, name, rows[p], cols[p]);
    }
    snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
    add(md, name, h, 0);
  }
  add(md, "model.norm.weight", h, 0);
  add(md, "lm_head.weight", vocab, h);
}

/* Splits every tensor by rows over `world` ranks (rank r's share shifted by
 * `shift` rows for a second, different split); allocates and fills the slabs. */
static void model_split(struct model *md, int world, int rank, int64_t shift, int fill) {
  int64_t off = 0;
  for (int t = 0; t < md->n; t++) {
    int64_t row = md->ndim[t] == 2 ? md->shape[t][1] : 1, rows = md->shape[t][0], numel = rows * row;
    for (int r = 0; r <= world; r++) {
      int64_t cut = rows * r / world + (r > 0 && r < world ? shift : 0);
      md->starts[t][r] = rf_min_i64(rf_max_i64(cut, 0), rows) * row;
    }
    struct rf_tensor_view *v = &md->views[t];
    *v = (struct rf_tensor_view){.name = md->names[t],
                                 .unit = t,
                                 .ndim = md->ndim[t],
                                 .numel = numel,
                                 .block_elems = row,
                                 .starts = md->starts[t]};
    v->shape[0] = md->shape[t][0];
    v->shape[1] = md->shape[t][1];
    v->begin = md->starts[t][rank];
    v->end = md->starts[t][rank + 1];
    v->shard_offset = off;
    off = rf_round_up(off + v->end - v->begin, 16);
  }
  md->slab = off;
  md->master = rf_xaligned(64, (size_t)off * 4 + 64);
  md->m = rf_xaligned(64, (size_t)off * 4 + 64);
  md->v = rf_xaligned(64, (size_t)off * 4 + 64);
  for (int64_t i = 0; i < off; i++) {
    float x = fill ? (float)((i * 2654435761u) % 1000003) * 1e-6f : 0.0f;
    md->master[i] = x;
    md->m[i] = x * 0.5f;
    md->v[i] = x * x;
  }
  for (int t = 0; t < md->n; t++) md->views[t].master = md->master + md->views[t].shard_offset;
}

static void model_release(struct model *md) {
  free(md->master);
  free(md->m);
  free(md->v);
}

static int agree_mpi(void *ctx, int status) {
  int32_t s = status;
  rf_comm_allreduce(ctx, &s, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  return s;
}

/* /proc/self/io: bytes read and written through system calls. */
static void io_bytes(uint64_t *rchar, uint64_t *wchar) {
  *rchar = *wchar = 0;
  FILE *f = fopen("/proc/self/io", "r");
  if (!f) return;
  char key[32];
  unsigned long long v;
  while (fscanf(f, "%31s %llu", key, &v) == 2) {
    if (strcmp(key, "rchar:") == 0) *rchar = v;
    if (strcmp(key, "wchar:") == 0) *wchar = v;
  }
  fclose(f);
}

/* Seconds of the slowest rank for `phase` (every rank starts after a barrier). */
static double max_time(const struct rf_comm *comm, uint64_t t0) {
  double s = (double)(rf_time_ns() - t0) / 1e9;
  rf_comm_allreduce(comm, &s, 1, RF_DTYPE_F64, RF_REDUCE_OP_MAX);
  return s;
}

static int64_t max_i64(const struct rf_comm *comm, int64_t x) {
  rf_comm_allreduce(comm, &x, 1, RF_DTYPE_I64, RF_REDUCE_OP_MAX);
  return x;
}

/* Writes and fsyncs `bytes` bytes (1 MiB writes: on this machine 8 MiB writes are 4x slower) to path (removed
 * later, untimed: with the `discard` mount option a removal costs). */
static void raw_write(const char *path, int64_t bytes) {
  enum { PIECE = 1 << 20 };
  char *buf = rf_xmalloc(PIECE);
  for (int i = 0; i < PIECE; i++) buf[i] = (char)(i * 31);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) RF_DIE("%s: cannot create", path);
  for (int64_t at = 0; at < bytes; at += PIECE) {
    size_t n = (size_t)rf_min_i64(PIECE, bytes - at);
    if (write(fd, buf, n) != (ssize_t)n) RF_DIE("%s: write failed", path);
  }
  if (fsync(fd) != 0) RF_DIE("%s: fsync failed", path);
  close(fd);
  free(buf);
}

static void drop_cache(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

int main(int argc, char **argv) {
  rf_comm_mpi_init(&argc, &argv);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  int rank = comm.rank, world = comm.world;
  const char *base = getenv("RF_BENCH_DIR") ? getenv("RF_BENCH_DIR") : "/tmp";
  char root[256];
  snprintf(root, sizeof root, "%s/rf_bench_ckpt.XXXXXX", base);
  if (rank == 0 && !mkdtemp(root)) RF_DIE("%s: cannot create", root);
  char raw_dir[300];
  snprintf(raw_dir, sizeof raw_dir, "%s/raw", root);
  if (rank == 0 && mkdir(raw_dir, 0755) != 0) RF_DIE("%s: cannot create", raw_dir);
  rf_comm_bcast(&comm, root, sizeof root, RF_DTYPE_U8, 0);
  char dir[300], raw[320], raw2[320];
  snprintf(dir, sizeof dir, "%s/step-1", root);
  snprintf(raw, sizeof raw, "%s/raw/raw-%d", root, rank);
  snprintf(raw2, sizeof raw2, "%s/raw/raw2-%d", root, rank);

  static struct model md;
  llama_100m(&md);
  model_split(&md, world, rank, 0, 1);
  int64_t params = 0;
  for (int t = 0; t < md.n; t++) params += md.views[t].numel;
  int64_t my_bytes = 0;
  for (int t = 0; t < md.n; t++) my_bytes += (md.views[t].end - md.views[t].begin) * 4 * 3;
  struct rf_ckpt_state_desc states[2] = {{.suffix = ".adam_m", .dtype = RF_DTYPE_F32, .slab = md.m},
                                         {.suffix = ".adam_v", .dtype = RF_DTYPE_F32, .slab = md.v}};
  struct rf_ckpt_views_args a = {.dir = dir,
                                 .rank = rank,
                                 .world = world,
                                 .step = 1,
                                 .extra_json = "{}",
                                 .n_views = md.n,
                                 .views = md.views,
                                 .n_states = 2,
                                 .states = states,
                                 .agree = agree_mpi,
                                 .agree_ctx = &comm};
  uint64_t r0, w0, r1, w1;

  /* twice, alternating: the disk (the same bytes per rank, written and fsynced
   * concurrently), then a save; the disk's speed varies with other jobs */
  double t_raw[2], t_save[2];
  uint64_t t0;
  char dir0[320];
  snprintf(dir0, sizeof dir0, "%s/step-0", root);
  for (int k = 0; k < 2; k++) {
    rf_comm_barrier(&comm);
    t0 = rf_time_ns();
    raw_write(k == 0 ? raw : raw2, my_bytes);
    t_raw[k] = max_time(&comm, t0);
    a.dir = k == 0 ? dir0 : dir;
    rf_comm_barrier(&comm);
    io_bytes(&r0, &w0);
    t0 = rf_time_ns();
    if (rf_ckpt_save_views(&a) != 0) RF_DIE("save: %s", rf_error_msg());
    t_save[k] = max_time(&comm, t0);
    io_bytes(&r1, &w1);
  }
  int64_t save_w = max_i64(&comm, (int64_t)(w1 - w0));
  char path[400];
  struct stat st;
  rf_ckpt_rank_path(path, sizeof path, dir, rank, "bin");
  int64_t file_bytes = stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
  file_bytes = max_i64(&comm, file_bytes);

  /* load, cold: same split, files out of the page cache */
  model_release(&md);
  model_split(&md, world, rank, 0, 0);
  states[0].slab = md.m;
  states[1].slab = md.v;
  a.views = md.views;
  drop_cache(path);
  rf_comm_barrier(&comm);
  io_bytes(&r0, &w0);
  t0 = rf_time_ns();
  if (rf_ckpt_load_views(&a, NULL, NULL) != 0) RF_DIE("load: %s", rf_error_msg());
  double t_cold = max_time(&comm, t0);
  io_bytes(&r1, &w1);
  int64_t cold_r = max_i64(&comm, (int64_t)(r1 - r0));
  int bad = 0;
  for (int64_t i = 0; i < md.slab && !bad; i += 997) bad = md.m[i] != md.master[i] * 0.5f;

  /* load, warm: another split (rows shifted by 3 at every cut) */
  model_release(&md);
  model_split(&md, world, rank, 3, 0);
  states[0].slab = md.m;
  states[1].slab = md.v;
  a.views = md.views;
  rf_comm_barrier(&comm);
  io_bytes(&r0, &w0);
  t0 = rf_time_ns();
  if (rf_ckpt_load_views(&a, NULL, NULL) != 0) RF_DIE("load: %s", rf_error_msg());
  double t_warm = max_time(&comm, t0);
  io_bytes(&r1, &w1);
  int64_t warm_r = max_i64(&comm, (int64_t)(r1 - r0));
  for (int64_t i = 0; i < md.slab && !bad; i += 997) bad = md.v[i] != md.master[i] * md.master[i];
  rf_comm_allreduce(&comm, &bad, 1, RF_DTYPE_I32, RF_REDUCE_OP_MAX);

  /* rank 0: the parameters exported to safetensors (f32), streamed */
  double t_export = 0;
  int64_t export_bytes = 0;
  if (rank == 0) {
    char st_path[400];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", root);
    t0 = rf_time_ns();
    if (rf_ckpt_export_safetensors(dir, st_path, RF_DTYPE_F32) != 0) RF_DIE("export: %s", rf_error_msg());
    t_export = (double)(rf_time_ns() - t0) / 1e9;
    export_bytes = stat(st_path, &st) == 0 ? (int64_t)st.st_size : -1;
  }
  rf_comm_barrier(&comm);

  int64_t total = my_bytes;
  rf_comm_allreduce(&comm, &total, 1, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  if (rank == 0) {
    double mb = (double)total / 1e6;
    printf(
        "bench_ckpt: W=%d, %.1fM f32 parameters in %d tensors + 2 f32 states = %.0f MB, %.0f MB per rank%s\n",
        world, (double)params / 1e6, md.n, mb, mb / world, bad ? "  (VALUES DIFFER)" : "");
    printf("| %-34s | %8s | %10s | %16s |\n", "what", "time s", "MB/s", "bytes/rank (max)");
    for (int k = 0; k < 2; k++) {
      printf("| %-34s | %8.2f | %10.0f | %16" PRId64 " |\n",
             k ? "raw disk: write + fsync, again" : "raw disk: write + fsync", t_raw[k], mb / t_raw[k],
             my_bytes);
      printf("| %-34s | %8.2f | %10.0f | %16" PRId64 " |\n",
             k ? "save, again" : "save (fsync, rename, marker)", t_save[k], mb / t_save[k], save_w);
    }
    printf("| %-34s | %8.2f | %10.0f | %16" PRId64 " |\n", "load, cold cache, same split", t_cold,
           mb / t_cold, cold_r);
    printf("| %-34s | %8.2f | %10.0f | %16" PRId64 " |\n", "load, warm cache, resharded", t_warm, mb / t_warm,
           warm_r);
    printf("| %-34s | %8.2f | %10.0f | %16" PRId64 " |\n", "export f32 safetensors (rank 0)", t_export,
           (double)export_bytes / 1e6 / t_export, export_bytes);
    double best_raw = t_raw[0] < t_raw[1] ? t_raw[0] : t_raw[1],
           best_save = t_save[0] < t_save[1] ? t_save[0] : t_save[1];
    printf("rank file: %" PRId64 " bytes (max); best save %.2f s / best raw write %.2f s = %.2f\n",
           file_bytes, best_save, best_raw, best_save / best_raw);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) fprintf(stderr, "bench_ckpt: could not remove %s\n", root);
  }
  model_release(&md);
  rf_comm_free(&comm);
  rf_comm_mpi_finalize();
  return 0;
}
