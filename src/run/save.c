/* The whole training state saved into one checkpoint and resumed from it: the
 * master weights and optimizer states through src/ckpt (resharding on load), the
 * run's numbers in the checkpoint's "extra" object:
 *   {"step": N, "data_pos": N, "seed": "S", "rng": "R", "world": W,
 *    "optim": "adamw", "optim_step": N, "program": {...}}
 * and, for Shampoo, "shampoo_block": N (its state's shapes depend on it: a resume
 * with another block size is refused saying so)
 * (seed and rng as decimal strings: JSON numbers are doubles). Checkpoints written
 * before this layer (no data_pos, rng or program; a numeric seed) load as
 * data_pos = step, rng = 0. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "run/run.h"
#include "run/test_control.h"

/* The agreement of a save or a load: a checked all-reduce on the context's comm.
 * A save is written by the first replica group only (the others hold the same
 * shards), so its agreements are inside that shard group; a load is read by
 * every rank and agreed over the whole mesh. */
struct rf_run_agree_ctx {
  const struct rf_fsdp *fsdp;
  int64_t saving_step; /* -1 when loading */
};

/* Testing hook (rf_run_test_die_in_save): the step whose save the last rank
 * leaves abruptly, after writing its rank files and before anyone writes the
 * marker (tests/test_train.c: a rank killed mid-save; tests/test_train_async.c:
 * killed while its background writer runs); -1: none. */
static int64_t rf_run_die_in_save = -1;

void rf_run_test_die_in_save(int64_t step) { rf_run_die_in_save = step; }

void rf_run_die_check(const struct rf_fsdp *f, int64_t step) {
  if (rf_run_die_in_save >= 0 && step == rf_run_die_in_save && rf_fsdp_rank(f) == rf_fsdp_world(f) - 1)
    _exit(137);
}

static int rf_run_ckpt_agree(void *ctx, int status) {
  const struct rf_run_agree_ctx *c = ctx;
  rf_run_die_check(c->fsdp, c->saving_step);
  return c->saving_step >= 0 ? rf_comm_agree(&c->fsdp->mesh.shard, status) : rf_run_agree(c->fsdp, status);
}

static struct rf_ckpt_views_args rf_run_views_args(const struct rf_run *run, const struct rf_run_states *st,
                                                   const char *dir, struct rf_run_agree_ctx *agree) {
  struct rf_ckpt_views_args a = {0};
  a.dir = dir;
  a.rank = rf_fsdp_rank(run->fsdp);
  a.world = rf_fsdp_world(run->fsdp);
  a.n_views = rf_fsdp_n_tensors(run->fsdp);
  a.views = rf_fsdp_views(run->fsdp);
  a.n_states = st->n;
  a.states = st->desc;
  a.agree = rf_run_ckpt_agree;
  a.agree_ctx = agree;
  /* the shards are device memory: saved through host staging, loaded with host-to-device
   * copies, on the compute stream (after the optimizer step that wrote them) */
  a.device = run->fsdp->device;
  a.stream = run->fsdp->stream[RF_FSDP_STREAM_COMPUTE];
  return a;
}

char *rf_run_extra(const struct rf_run *run, const char *program_json) {
  cJSON *program = cJSON_Parse(program_json ? program_json : "{}");
  if (!cJSON_IsObject(program)) {
    cJSON_Delete(program);
    return NULL;
  }
  char num[32];
  cJSON *x = cJSON_CreateObject();
  cJSON_AddNumberToObject(x, "step", (double)run->step);
  cJSON_AddNumberToObject(x, "data_pos", (double)run->data_pos);
  snprintf(num, sizeof num, "%" PRIu64, run->seed);
  cJSON_AddStringToObject(x, "seed", num);
  snprintf(num, sizeof num, "%" PRIu64, run->rng);
  cJSON_AddStringToObject(x, "rng", num);
  cJSON_AddNumberToObject(x, "world", rf_fsdp_world(run->fsdp));
  cJSON_AddNumberToObject(x, "replicas", rf_fsdp_replicas(run->fsdp));
  if (run->optim) {
    cJSON_AddStringToObject(x, "optim", rf_optim_kind_name(rf_optim_get_kind(run->optim)));
    cJSON_AddNumberToObject(x, "optim_step", (double)rf_optim_get_step(run->optim));
    if (rf_optim_get_kind(run->optim) == RF_OPTIM_KIND_SHAMPOO) /* its state's shapes depend on it */
      cJSON_AddNumberToObject(x, "shampoo_block", (double)run->optim->opt.shampoo_block);
  }
  cJSON_AddItemToObject(x, "program", program);
  char *s = cJSON_PrintUnformatted(x);
  cJSON_Delete(x);
  RF_ASSERT(s);
  return s;
}

int rf_run_save(const struct rf_run *run, const char *dir, const char *program_json) {
  RF_REQUIRE_ARG("rf_run_save", run);
  RF_REQUIRE_ARG("rf_run_save", run->fsdp);
  RF_REQUIRE_ARG("rf_run_save", dir);
  char *extra = rf_run_extra(run, program_json);
  int ok = rf_run_agree(run->fsdp, extra ? 0 : -1) == 0;
  if (!ok) {
    free(extra);
    RF_FAIL("%s: the program's JSON is not an object%s", dir, extra ? " on another rank" : "");
  }
  struct rf_run_states st;
  rf_run_states_make(run->optim, &st);
  struct rf_run_agree_ctx agree = {run->fsdp, run->step};
  struct rf_ckpt_views_args a = rf_run_views_args(run, &st, dir, &agree);
  a.step = run->step;
  a.extra_json = extra;
  /* the first replica group writes; every rank learns how it went */
  int rc = rf_fsdp_replicate_rank(run->fsdp) == 0 ? rf_ckpt_save_views(&a) : 0;
  free(extra);
  if (rf_run_agree(run->fsdp, rc) != 0) {
    if (rc == 0) RF_FAIL("%s: the save failed on the replica group that writes it", dir);
    return -1;
  }
  return 0;
}

/* A uint64 member saved as a decimal string (or, before this layer, a number). */
static int rf_run_json_u64(const cJSON *obj, const char *key, uint64_t *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (cJSON_IsNumber(x) && x->valuedouble >= 0) {
    *out = (uint64_t)x->valuedouble;
    return 1;
  }
  char *end = NULL;
  if (!cJSON_IsString(x) || !x->valuestring[0]) return 0;
  *out = strtoull(x->valuestring, &end, 10);
  return *end == 0;
}

/* The numbers of a checkpoint's "extra" into run (not run->optim's step, which
 * *optim_step gets). Checks the optimizer. Local. */
static int rf_run_read_extra(struct rf_run *run, const char *dir, const char *extra, int64_t *optim_step,
                             char **program_json) {
  cJSON *x = cJSON_Parse(extra ? extra : "{}");
  RF_REQUIRE(cJSON_IsObject(x), "%s: the checkpoint's 'extra' is not an object", dir);
  const cJSON *optim = cJSON_GetObjectItemCaseSensitive(x, "optim");
  const cJSON *ostep = cJSON_GetObjectItemCaseSensitive(x, "optim_step");
  const cJSON *data_pos = cJSON_GetObjectItemCaseSensitive(x, "data_pos");
  const char *saved = cJSON_IsString(optim) ? optim->valuestring : "none";
  const char *ours = run->optim ? rf_optim_kind_name(rf_optim_get_kind(run->optim)) : NULL;
  int ok = !ours || (strcmp(saved, ours) == 0 && cJSON_IsNumber(ostep));
  char msg[160];
  snprintf(msg, sizeof msg, "saved with optimizer %s, this run uses optimizer %s", saved,
           ours ? ours : "none");
  const cJSON *block = cJSON_GetObjectItemCaseSensitive(x, "shampoo_block");
  if (ok && ours && rf_optim_get_kind(run->optim) == RF_OPTIM_KIND_SHAMPOO && cJSON_IsNumber(block) &&
      block->valuedouble != (double)run->optim->opt.shampoo_block) {
    ok = 0;
    snprintf(msg, sizeof msg,
             "saved with Shampoo blocks of side %.0f, this run uses %" PRId64 " (--shampoo-block)",
             block->valuedouble, run->optim->opt.shampoo_block);
  }
  *optim_step = ok && ours ? (int64_t)ostep->valuedouble : 0;
  uint64_t u = 0;
  run->seed = rf_run_json_u64(x, "seed", &u) ? u : run->seed;
  run->rng = rf_run_json_u64(x, "rng", &u) ? u : 0;
  run->data_pos = cJSON_IsNumber(data_pos) ? (int64_t)data_pos->valuedouble : -1; /* -1: the step */
  if (program_json) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(x, "program");
    *program_json = cJSON_IsObject(p) ? cJSON_PrintUnformatted(p) : strdup("{}");
    RF_ASSERT(*program_json);
  }
  cJSON_Delete(x);
  RF_REQUIRE(ok, "%s: %s", dir, msg);
  return 0;
}

/* The mesh's first rank resolves `where` (a complete checkpoint, or a series'
 * latest) into dir and tells every rank; 0 on every rank, or -1 on every rank. */
static int rf_run_resolve(const struct rf_fsdp *f, const char *where, char *dir) {
  int rc = 0;
  memset(dir, 0, RF_FILE_PATH_MAX);
  if (rf_comm_mesh_first(&f->mesh)) {
    char marker[RF_FILE_PATH_MAX + 16];
    snprintf(marker, sizeof marker, "%s/%s", where, RF_CKPT_MARKER);
    int64_t *steps = NULL;
    int n = 0;
    struct stat st;
    int missing = stat(where, &st) != 0;
    if (missing || !S_ISDIR(st.st_mode))
      rc = rf_error_set(__FILE__, __LINE__, "%s: %s", where,
                        missing ? "no such directory" : "not a directory (a checkpoint is one)");
    else if (access(marker, F_OK) == 0)
      snprintf(dir, RF_FILE_PATH_MAX, "%s", where);
    else if ((n = rf_run_series_list(where, &steps)) > 0)
      rf_run_series_path(dir, RF_FILE_PATH_MAX, where, steps[n - 1]);
    else
      rc = rf_error_set(__FILE__, __LINE__,
                        "%s: no complete checkpoint there (no %s marker, and no complete %s* directory)",
                        where, RF_CKPT_MARKER, RF_RUN_STEP_PREFIX);
    free(steps);
  }
  if (rf_run_agree(f, rc) != 0) {
    if (rc == 0) RF_FAIL_ELSEWHERE("%s: another rank failed", where);
    return -1;
  }
  rf_comm_mesh_bcast(&f->mesh, dir, RF_FILE_PATH_MAX, RF_DTYPE_U8);
  return 0;
}

int rf_run_resume(struct rf_run *run, const char *where, char *resumed, size_t cap, char **program_json) {
  RF_REQUIRE_ARG("rf_run_resume", run);
  RF_REQUIRE_ARG("rf_run_resume", run->fsdp);
  RF_REQUIRE_ARG("rf_run_resume", where);
  const struct rf_fsdp *f = run->fsdp;
  if (program_json) *program_json = NULL;
  char dir[RF_FILE_PATH_MAX];
  RF_TRY(rf_run_resolve(f, where, dir));
  /* the numbers and the optimizer first: a refused checkpoint leaves memory untouched */
  struct rf_ckpt ck;
  struct rf_run next = *run;
  int64_t optim_step = 0;
  int rc = rf_ckpt_open(&ck, dir);
  if (rc == 0) {
    rc = rf_run_read_extra(&next, dir, ck.extra_json, &optim_step, program_json);
    rf_ckpt_close(&ck);
  }
  if (rf_run_agree(f, rc) != 0) {
    if (program_json) {
      free(*program_json);
      *program_json = NULL;
    }
    if (rc == 0) RF_FAIL_ELSEWHERE("%s: another rank could not read the checkpoint", dir);
    return -1;
  }
  struct rf_run_states st;
  rf_run_states_make(run->optim, &st);
  struct rf_run_agree_ctx agree = {f, -1};
  struct rf_ckpt_views_args a = rf_run_views_args(run, &st, dir, &agree);
  int64_t step = 0;
  if (rf_ckpt_load_views(&a, &step, NULL) != 0) {
    if (program_json) {
      free(*program_json);
      *program_json = NULL;
    }
    return -1;
  }
  next.step = step;
  if (next.data_pos < 0) next.data_pos = step;
  *run = next;
  if (run->optim) rf_optim_set_step(run->optim, optim_step);
  if (resumed) snprintf(resumed, cap, "%s", dir);
  return 0;
}

/* ---- the checkpoint folder's lock ---- */

/* What a lock file says: "rfsdp.lock\nhost H\npid P\nboot B\nstart S\nsince T\n"
 * (boot: the host's boot id; start: the process's start time in clock ticks since
 * boot, /proc/PID/stat's 22nd field; either may be empty). */
struct rf_run_lock_info {
  char host[256], boot[64], since[64];
  long pid;
  unsigned long long start;
};

static void rf_run_lock_line(const char *text, const char *key, char *out, size_t cap) {
  out[0] = '\0';
  size_t kl = strlen(key);
  for (const char *at = text; at && *at; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL) {
    if (strncmp(at, key, kl) != 0 || at[kl] != ' ') continue;
    const char *v = at + kl + 1, *end = strchr(v, '\n');
    size_t n = end ? (size_t)(end - v) : strlen(v);
    if (n >= cap) n = cap - 1;
    memcpy(out, v, n);
    out[n] = '\0';
    return;
  }
}

/* The boot id of this host ("" when unknown). */
static void rf_run_lock_boot(char *out, size_t cap) {
  out[0] = '\0';
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return;
  if (!fgets(out, (int)cap, f)) out[0] = '\0';
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

/* Process pid's start time in clock ticks since boot (0 when unknown) and its state
 * ('Z': it has exited, its parent has not reaped it yet; 0 when unknown). */
static unsigned long long rf_run_lock_start(long pid, char *state) {
  char path[64], text[1024];
  if (state) *state = 0;
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  const char *p = strrchr(text, ')'); /* after the command name, which may hold spaces */
  if (p && state && p[1] == ' ') *state = p[2];
  unsigned long long start = 0;
  /* fields 3.. after ")": state is field 3, starttime field 22 */
  for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
  if (p) start = strtoull(p + 1, NULL, 10);
  return start;
}

static void rf_run_lock_self(struct rf_run_lock_info *me) {
  memset(me, 0, sizeof *me);
  if (gethostname(me->host, sizeof me->host - 1) != 0) snprintf(me->host, sizeof me->host, "unknown");
  me->pid = (long)getpid();
  rf_run_lock_boot(me->boot, sizeof me->boot);
  me->start = rf_run_lock_start(me->pid, NULL);
  time_t now = time(NULL);
  struct tm tm;
  strftime(me->since, sizeof me->since, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
}

/* Reads lock `path`: 0, 1 when it is gone, -1 when it cannot be read. */
static int rf_run_lock_read(const char *path, struct rf_run_lock_info *info, char **text) {
  memset(info, 0, sizeof *info);
  *text = NULL;
  size_t bytes;
  struct stat st;
  if (stat(path, &st) != 0 && errno == ENOENT) return 1;
  if (rf_file_read_all(path, text, &bytes) != 0) return stat(path, &st) != 0 && errno == ENOENT ? 1 : -1;
  char pid[32], start[32];
  rf_run_lock_line(*text, "host", info->host, sizeof info->host);
  rf_run_lock_line(*text, "pid", pid, sizeof pid);
  rf_run_lock_line(*text, "boot", info->boot, sizeof info->boot);
  rf_run_lock_line(*text, "start", start, sizeof start);
  rf_run_lock_line(*text, "since", info->since, sizeof info->since);
  info->pid = strtol(pid, NULL, 10);
  info->start = strtoull(start, NULL, 10);
  return 0;
}

/* Why lock `it` is stale as seen from `me` (a reason into why), 0 when its job may live. */
static int rf_run_lock_stale(const struct rf_run_lock_info *it, const struct rf_run_lock_info *me, int force,
                             char *why, size_t cap) {
  if (it->pid <= 0 || !it->host[0]) {
    snprintf(why, cap, "it names no host and PID");
    return 1;
  }
  if (strcmp(it->host, me->host) != 0) {
    snprintf(why, cap, "it is of host %s, whose job this host cannot see (forced)", it->host);
    return force;
  }
  if (it->boot[0] && me->boot[0] && strcmp(it->boot, me->boot) != 0) {
    snprintf(why, cap, "it was written before this host's last boot");
    return 1;
  }
  if (kill((pid_t)it->pid, 0) != 0 && errno == ESRCH) {
    snprintf(why, cap, "PID %ld is gone", it->pid);
    return 1;
  }
  char state;
  unsigned long long start = rf_run_lock_start(it->pid, &state);
  if (state == 'Z' || state == 'X') { /* kill() reaches a process that has exited but is not reaped */
    snprintf(why, cap, "PID %ld has exited", it->pid);
    return 1;
  }
  if (it->start && start != it->start) {
    snprintf(why, cap, "PID %ld is another process now", it->pid);
    return 1;
  }
  return 0;
}

int rf_run_lock_take(struct rf_run_lock *l, const char *dir, int force, char *note, size_t cap) {
  RF_REQUIRE_ARG("rf_run_lock_take", l);
  RF_REQUIRE_ARG("rf_run_lock_take", dir);
  memset(l, 0, sizeof *l);
  if (note && cap) note[0] = '\0';
  snprintf(l->path, sizeof l->path, "%s/rfsdp.lock", dir);
  struct rf_run_lock_info me;
  rf_run_lock_self(&me);
  char text[1024], tmp[sizeof l->path + 32], moved[sizeof l->path + 32];
  int len = snprintf(text, sizeof text, "rfsdp.lock\nhost %s\npid %ld\nboot %s\nstart %llu\nsince %s\n",
                     me.host, me.pid, me.boot, me.start, me.since);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", l->path, me.pid);
  snprintf(moved, sizeof moved, "%s.stale.%ld", l->path, me.pid);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) RF_FAIL("%s: cannot write the folder's lock: %s", tmp, strerror(errno));
  int ok = write(fd, text, (size_t)len) == len && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  int rc = -1, said = 0;
  for (int tries = 0; ok && tries < 8 && !said; tries++) {
    if (link(tmp, l->path) == 0) {
      rc = 0;
      break;
    }
    if (errno != EEXIST) {
      said =
          rf_error_set(__FILE__, __LINE__, "%s: cannot take the folder's lock: %s", l->path, strerror(errno));
      break;
    }
    struct rf_run_lock_info it;
    char *old = NULL, why[512];
    int got = rf_run_lock_read(l->path, &it, &old);
    if (got == 1) continue; /* removed meanwhile: try again */
    if (got < 0) {
      said =
          rf_error_set(__FILE__, __LINE__, "%s: cannot read the folder's lock: %s", l->path, strerror(errno));
      break;
    }
    if (!rf_run_lock_stale(&it, &me, force, why, sizeof why)) {
      snprintf(l->host, sizeof l->host, "%s", it.host);
      l->pid = it.pid;
      rf_error_set(__FILE__, __LINE__,
                   "%s: the checkpoint folder is in use by another job: host %s, PID %ld (its lock %s, "
                   "written %s); wait for it to end or pick another folder%s",
                   dir, it.host, it.pid, l->path, it.since[0] ? it.since : "at an unknown time",
                   strcmp(it.host, me.host) != 0
                       ? " (a job of another host: this host cannot tell whether it is gone; if it is, "
                         "rfsdp train --ckpt-dir-force takes its lock)"
                       : "");
      free(old);
      rc = 1;
      said = 1;
      break;
    }
    /* stale: moved aside (one taker wins the rename); put back if it changed meanwhile */
    if (rename(l->path, moved) == 0) {
      char *now = NULL;
      struct rf_run_lock_info again;
      if (rf_run_lock_read(moved, &again, &now) == 0 && strcmp(now, old) != 0) {
        (void)!link(moved,
                    l->path); /* a live job's, taken meanwhile: put back (unless another took it since) */
      } else if (note && cap) {
        snprintf(note, cap, "took over the lock of host %s, PID %ld (written %s): %s", it.host, it.pid,
                 it.since[0] ? it.since : "at an unknown time", why);
      }
      unlink(moved);
      free(now);
    }
    free(old);
  }
  if (!ok) rf_error_set(__FILE__, __LINE__, "%s: cannot write the folder's lock: %s", tmp, strerror(errno));
  if (ok && rc == -1 && !said)
    rf_error_set(__FILE__, __LINE__, "%s: the folder's lock changed hands too often", l->path);
  unlink(tmp);
  if (rc == 0) {
    l->held = 1;
    snprintf(l->host, sizeof l->host, "%s", me.host);
    l->pid = me.pid;
  }
  return rc;
}

void rf_run_lock_release(struct rf_run_lock *l) {
  if (!l || !l->held) return;
  struct rf_run_lock_info it;
  char *text = NULL;
  /* only our own: a job that took it over (--ckpt-dir-force) keeps it */
  if (rf_run_lock_read(l->path, &it, &text) == 0 && it.pid == l->pid && strcmp(it.host, l->host) == 0)
    unlink(l->path);
  free(text);
  l->held = 0;
}
