/* Asynchronous saves (include/rfsdp_run.h): a background thread that copies the
 * state into staging (the next optimizer step waits for that copy) and writes it
 * through src/ckpt, and the training thread answering the thread's agreements at
 * step boundaries.
 *
 * The writer thread runs rf_ckpt_save_views with an agreement callback that does
 * not communicate: it posts the thread's status and sleeps until the training
 * thread, at a step boundary where every rank's writer has posted, has combined
 * the statuses (rf_run_async_poll) and handed back the result. A save meets two
 * such points (every rank's files written; rank 0's meta.json and COMPLETE
 * written), or one when the first fails. Ranks of the replica groups other than
 * the first write nothing (they hold the same shards) and have no thread; they
 * take part in the mesh-wide agreements only. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "run/run.h"
#include "run/test_control.h"

/* Where the writer thread is. */
enum rf_run_async_state {
  RF_RUN_ASYNC_STATE_RUNNING = 0, /* writing */
  RF_RUN_ASYNC_STATE_AT_AGREE,    /* posted `status`, waits for the combined result */
  RF_RUN_ASYNC_STATE_FINISHED     /* rf_ckpt_save_views returned `rc` */
};

/* One state's piece for one view, resolved from the optimizer when the saver is
 * created (the writer thread never reads the optimizer). */
struct rf_run_async_piece {
  int64_t numel, begin, end;
  int64_t offset; /* elements into the state's staging slab */
};

struct rf_run_async_scale {
  struct rf_run_async *async;
  int state;
};

struct rf_run_async {
  struct rf_fsdp *fsdp;               /* borrowed */
  struct rf_optim *optim;             /* borrowed; NULL: none (the save call copies) */
  const struct rf_run_series *series; /* the in-flight save's (borrowed) */
  int writer;                         /* this rank writes (the first replica group) */
  int n_views;
  struct rf_tensor_view *views; /* owned copy; master points into staging */
  float *master;                /* owned staging: the shard, shard_elems */
  void *bounce;                 /* owned: the rank file's O_DIRECT bounce (RF_CKPT_BOUNCE_BYTES) */
  int64_t shard_elems;
  struct rf_run_states st; /* slabs and scale contexts point into staging */
  void *state[RF_RUN_MAX_STATES];
  size_t state_bytes[RF_RUN_MAX_STATES];
  struct rf_run_async_piece *pieces[RF_RUN_MAX_STATES]; /* n_views each, per-block states only */
  struct rf_run_async_scale scale[RF_RUN_MAX_STATES];
  /* the save in flight */
  int in_flight;
  int64_t step;
  char dir[RF_FILE_PATH_MAX];
  char *extra; /* owned */
  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  enum rf_run_async_state where; /* under mu */
  int status, result, has_result, abort, rc;
  char err[RF_FILE_PATH_MAX + 1024];
  int copying;            /* under mu: the thread has not finished copying the state into staging */
  int at_fence;           /* under mu: an optimizer step reached the fence since the save was staged */
  int steps_begun;        /* under mu: optimizer steps that passed the fence since then */
  int draining;           /* under mu: the training thread waits for the save's end */
  int64_t copies_late;    /* under mu: copies that ended after the next optimizer step began */
  uint64_t started_ns;    /* when the save in flight was staged */
  uint64_t writer_cpu_ns; /* under mu: the writer's CPU time of the save in flight */
  /* the snapshot's order: `snap` is recorded on the compute stream when a save is staged (after
   * the optimizer step that wrote the state); the writer's copies to the host run on `stream`
   * (owned), which first waits on it. The writer thread never reads device memory. */
  struct rf_device_stream *stream;
  struct rf_device_event snap;
  struct rf_run_async_stats stats; /* training thread only */
  int pending;                     /* every rank: a save was started and rf_run_async_wait has not ended it */
  int posted;                      /* writers: the step-boundary agreement in flight (req, vote) */
  int32_t vote[3];
  struct rf_comm_req req;
  int ended_rc; /* writers: the save's combined status once every writer finished */
};

void rf_run_async_get_stats(const struct rf_run_async *a, struct rf_run_async_stats *out) {
  *out = a->stats;
  out->staging_bytes = rf_run_async_staging_bytes(a);
}

int64_t rf_run_async_staging_bytes(const struct rf_run_async *a) {
  int64_t bytes = a->shard_elems * (int64_t)sizeof(float) + RF_CKPT_BOUNCE_BYTES;
  for (int i = 0; i < a->st.n; i++) bytes += (int64_t)a->state_bytes[i];
  return bytes;
}

static void rf_run_async_scale_piece(void *ctx, const struct rf_tensor_view *view, int index,
                                     struct rf_ckpt_state_piece *out) {
  (void)view;
  const struct rf_run_async_scale *c = ctx;
  const struct rf_run_async_piece *p = &c->async->pieces[c->state][index];
  const struct rf_ckpt_state_desc *d = &c->async->st.desc[c->state];
  out->numel = p->numel;
  out->begin = p->begin;
  out->end = p->end;
  out->data = (uint8_t *)c->async->state[c->state] + (size_t)p->offset * rf_dtype_size(d->dtype);
}

/* Testing hook (rf_run_test_late_async_copy): the writer's copy waits for the next optimizer step. */
static int rf_run_async_copy_late;
void rf_run_test_late_async_copy(int late) { rf_run_async_copy_late = late; }

/* The state into staging: the master shard and every optimizer state slab, device-to-host copies
 * on the saver's stream once the compute stream has reached `snap` (each copy has landed when it
 * returns). */
static void rf_run_async_copy(struct rf_run_async *a) {
  struct rf_device *dev = a->fsdp->device;
  rf_device_stream_wait(dev, a->stream, &a->snap);
  rf_device_copy(dev, a->master, rf_fsdp_shard_master(a->fsdp), (size_t)a->shard_elems * sizeof(float),
                 RF_DEVICE_COPY_DEVICE_TO_HOST, a->stream);
  for (int j = 0; j < a->st.n; j++) {
    struct rf_optim_state_slab slab;
    rf_optim_state(a->optim, j, &slab);
    rf_device_copy(dev, a->state[j], slab.data, a->state_bytes[j], RF_DEVICE_COPY_DEVICE_TO_HOST, a->stream);
  }
}

/* The testing hook's wait: the copy starts only once the next optimizer step is at
 * its fence (or the save is awaited, or abandoned): the latest a snapshot can be. */
static void rf_run_async_late(struct rf_run_async *a) {
  pthread_mutex_lock(&a->mu);
  while (rf_run_async_copy_late && !a->at_fence && !a->draining && !a->abort)
    pthread_cond_wait(&a->cv, &a->mu);
  pthread_mutex_unlock(&a->mu);
}

/* The copy is done: the fence opens. A copy that ended after the next optimizer
 * step began (only a broken fence lets one) is counted (rf_run_async_stats). */
static void rf_run_async_release(struct rf_run_async *a) {
  pthread_mutex_lock(&a->mu);
  a->copies_late += a->steps_begun > 0;
  a->copying = 0;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

/* The optimizer's before-step function: the writer's copy finished. */
static void rf_run_async_fence(void *ctx) {
  struct rf_run_async *a = ctx;
  uint64_t t0 = rf_time_ns();
  pthread_mutex_lock(&a->mu);
  a->at_fence = 1;
  pthread_cond_broadcast(&a->cv);
  a->stats.fence_waits += a->copying;
  while (a->copying) pthread_cond_wait(&a->cv, &a->mu);
  a->steps_begun++;
  pthread_mutex_unlock(&a->mu);
  a->stats.fence_ns += rf_time_ns() - t0;
}

int rf_run_async_create(struct rf_run_async **out, const struct rf_run *run) {
  RF_REQUIRE_ARG("rf_run_async_create", out);
  *out = NULL;
  RF_REQUIRE_ARG("rf_run_async_create", run);
  RF_REQUIRE_ARG("rf_run_async_create", run->fsdp);
  struct rf_run_async *a = rf_xcalloc(1, sizeof *a);
  struct rf_fsdp *f = run->fsdp;
  a->fsdp = f;
  a->optim = run->optim;
  rf_fsdp_hold(f); /* held until rf_run_async_free: its writer thread reads them */
  if (a->optim) rf_optim_hold(a->optim);
  a->writer = rf_fsdp_replicate_rank(f) == 0;
  a->n_views = rf_fsdp_n_tensors(f);
  a->shard_elems = rf_fsdp_shard_elems(f);
  /* staging is written (pre-faulted) here, before training: the first save's copy
   * then takes no page faults, and the memory is resident from the start */
  a->master = rf_xaligned(64, (size_t)a->shard_elems * sizeof(float));
  memset(a->master, 0, (size_t)a->shard_elems * sizeof(float));
  a->bounce = rf_xaligned(RF_FILE_DIRECT_ALIGN, RF_CKPT_BOUNCE_BYTES);
  memset(a->bounce, 0, RF_CKPT_BOUNCE_BYTES);
  a->views = rf_xcalloc((size_t)a->n_views + 1, sizeof *a->views);
  memcpy(a->views, rf_fsdp_views(f), (size_t)a->n_views * sizeof *a->views);
  for (int i = 0; i < a->n_views; i++) {
    a->views[i].master = a->master + a->views[i].shard_offset;
    a->views[i].grad = NULL;
  }
  rf_run_states_make(run->optim, &a->st);
  for (int j = 0; j < a->st.n; j++) {
    struct rf_optim_state_slab slab;
    rf_optim_state(run->optim, j, &slab);
    a->state_bytes[j] = (size_t)slab.count * rf_dtype_size(slab.dtype);
    a->state[j] = rf_xaligned(64, a->state_bytes[j]);
    memset(a->state[j], 0, a->state_bytes[j]);
    struct rf_ckpt_state_desc *d = &a->st.desc[j];
    if (d->slab) {
      d->slab = a->state[j];
      continue;
    }
    /* per-block or per-owner: each view's piece resolved now, its data in staging */
    a->pieces[j] = rf_xcalloc((size_t)a->n_views + 1, sizeof *a->pieces[j]);
    for (int i = 0; i < a->n_views; i++) {
      struct rf_ckpt_state_piece sp;
      memset(&sp, 0, sizeof sp);
      d->piece(d->ctx, &a->views[i], i, &sp);
      int64_t offset = sp.end > sp.begin ? ((const uint8_t *)sp.data - (const uint8_t *)slab.data) /
                                               (int64_t)rf_dtype_size(slab.dtype)
                                         : 0;
      RF_ASSERT(offset >= 0 && offset + (sp.end - sp.begin) <= slab.count);
      a->pieces[j][i] = (struct rf_run_async_piece){sp.numel, sp.begin, sp.end, offset};
    }
    a->scale[j] = (struct rf_run_async_scale){a, j};
    d->piece = rf_run_async_scale_piece;
    d->ctx = &a->scale[j];
  }
  rf_comm_req_init(&a->req, f->mesh.shard.world);
  a->stream = rf_device_stream_create(f->device);
  rf_device_event_create(f->device, &a->snap);
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  if (a->optim) rf_optim_set_before_step(a->optim, rf_run_async_fence, a);
  *out = a;
  return 0;
}

/* The writer's agreement: post the status, wait for the training thread's answer. */
static int rf_run_async_agree(void *ctx, int status) {
  struct rf_run_async *a = ctx;
  rf_run_die_check(a->fsdp, a->step);
  pthread_mutex_lock(&a->mu);
  a->status = status;
  a->where = RF_RUN_ASYNC_STATE_AT_AGREE;
  pthread_cond_broadcast(&a->cv);
  while (!a->has_result && !a->abort) pthread_cond_wait(&a->cv, &a->mu);
  int result = a->abort ? -1 : a->result;
  a->has_result = 0;
  pthread_mutex_unlock(&a->mu);
  return result;
}

static void *rf_run_async_main(void *arg) {
  struct rf_run_async *a = arg;
  if (a->copying) { /* first the snapshot: the next optimizer step waits for it (rf_run_async_fence) */
    rf_run_async_late(a);
    rf_run_async_copy(a);
    rf_run_async_release(a);
  }
  if (!a->extra) { /* the program's JSON was no object: the save fails on every rank at its first agreement */
    rf_run_async_agree(a, -1);
    pthread_mutex_lock(&a->mu);
    a->rc = -1;
    snprintf(a->err, sizeof a->err, "%s: the program's JSON is not an object", a->dir);
    a->where = RF_RUN_ASYNC_STATE_FINISHED;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return NULL;
  }
  struct rf_ckpt_views_args va = {.dir = a->dir,
                                  .rank = rf_fsdp_rank(a->fsdp),
                                  .world = rf_fsdp_world(a->fsdp),
                                  .step = a->step,
                                  .extra_json = a->extra,
                                  .n_views = a->n_views,
                                  .views = a->views,
                                  .n_states = a->st.n,
                                  .states = a->st.desc,
                                  .agree = rf_run_async_agree,
                                  .agree_ctx = a,
                                  .bounce = a->bounce,
                                  .bounce_bytes = RF_CKPT_BOUNCE_BYTES};
  int rc = rf_ckpt_save_views(&va);
  struct timespec cpu;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  pthread_mutex_lock(&a->mu);
  a->writer_cpu_ns = (uint64_t)cpu.tv_sec * 1000000000ull + (uint64_t)cpu.tv_nsec;
  a->rc = rc;
  if (rc != 0) snprintf(a->err, sizeof a->err, "%s", rf_error_msg()); /* the message is per thread */
  a->where = RF_RUN_ASYNC_STATE_FINISHED;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

static void rf_run_async_join(struct rf_run_async *a) {
  if (a->thread_started) pthread_join(a->thread, NULL);
  a->thread_started = 0;
  a->in_flight = 0;
  free(a->extra);
  a->extra = NULL;
}

/* Posts the writers' agreement of this step boundary (non-blocking, on the
 * writing shard group): {stopped at an agreement point or finished, the status,
 * finished}, combined with MIN. */
static void rf_run_async_post(struct rf_run_async *a, int block) {
  pthread_mutex_lock(&a->mu);
  while (block && a->where == RF_RUN_ASYNC_STATE_RUNNING) pthread_cond_wait(&a->cv, &a->mu);
  enum rf_run_async_state st = a->where;
  a->vote[0] = st != RF_RUN_ASYNC_STATE_RUNNING;
  a->vote[1] = st == RF_RUN_ASYNC_STATE_AT_AGREE ? a->status : st == RF_RUN_ASYNC_STATE_FINISHED ? a->rc : 0;
  a->vote[2] = st == RF_RUN_ASYNC_STATE_FINISHED;
  pthread_mutex_unlock(&a->mu);
  rf_comm_iallreduce(&a->fsdp->mesh.shard, a->vote, 3, RF_DTYPE_I32, RF_REDUCE_OP_MIN, &a->req);
  a->posted = 1;
}

/* Reads the agreement posted at the previous boundary (every writer posted it
 * then, so it has usually arrived) and acts on it: the combined status handed to
 * writers waiting at an agreement point, or, once every writer finished, the
 * thread joined and (complete) the rotation. Returns 1 when the save ended here. */
static int rf_run_async_settle(struct rf_run_async *a) {
  rf_comm_wait(&a->req);
  a->posted = 0;
  if (!a->vote[0]) return 0; /* a writer is still writing */
  if (!a->vote[2]) {         /* every writer waits at the same agreement point */
    pthread_mutex_lock(&a->mu);
    RF_ASSERT(a->where == RF_RUN_ASYNC_STATE_AT_AGREE);
    a->result = a->vote[1];
    a->has_result = 1;
    a->where = RF_RUN_ASYNC_STATE_RUNNING;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return 0;
  }
  a->stats.writer_cpu_ns += a->writer_cpu_ns;
  a->stats.copies_late += a->copies_late;
  a->stats.writer_wall_ns += rf_time_ns() - a->started_ns;
  a->ended_rc = a->vote[1];
  if (a->ended_rc != 0 && a->rc == 0)
    snprintf(a->err, sizeof a->err, "%s: the background save failed on another rank", a->dir);
  rf_run_async_join(a);
  if (a->ended_rc == 0) rf_run_series_rotate(a->series, a->fsdp, a->step); /* only now may an older one go */
  return 1;
}

int rf_run_async_poll(struct rf_run_async *a, int64_t *step) {
  RF_REQUIRE_ARG("rf_run_async_poll", a);
  if (!a->in_flight) return 0; /* also on the ranks that do not write */
  uint64_t t0 = rf_time_ns();
  int ended = a->posted ? rf_run_async_settle(a) : 0;
  if (!ended) rf_run_async_post(a, 0);
  a->stats.poll_ns += rf_time_ns() - t0;
  if (ended && a->ended_rc == 0 && step) *step = a->step;
  return ended && a->ended_rc == 0;
}

int rf_run_async_wait(struct rf_run_async *a, int64_t *step) {
  RF_REQUIRE_ARG("rf_run_async_wait", a);
  if (!a->pending) return 0;
  const struct rf_fsdp *f = a->fsdp;
  if (!a->in_flight && f->mesh.replicate.world == 1 && a->ended_rc == 0) {
    a->pending = 0; /* every rank writes, and every rank saw it complete at the same poll */
    return 0;
  }
  uint64_t t0 = rf_time_ns();
  int here = a->in_flight;
  pthread_mutex_lock(&a->mu); /* no later optimizer step to wait for (rf_run_async_late) */
  a->draining = 1;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  while (a->in_flight) {
    if (!a->posted) rf_run_async_post(a, 1);
    rf_run_async_settle(a);
  }
  a->pending = 0;
  a->stats.wait_ns += rf_time_ns() - t0;
  int rc = a->writer ? a->ended_rc : 0;
  char err[sizeof a->err];
  snprintf(err, sizeof err, "%s", a->err);
  if (rf_run_agree(f, rc) != 0) {
    if (rc != 0)
      return rf_error_set(__FILE__, __LINE__, "%s (the background save of step %lld)", err,
                          (long long)a->step);
    RF_FAIL("%s: the background save failed on the replica group that writes it", a->dir);
  }
  here = -rf_run_agree(f, -here); /* 1 on every rank when the writers completed it here */
  if (here && step) *step = a->step;
  return here;
}

int rf_run_series_save_async(struct rf_run_async *a, const struct rf_run_series *s, const struct rf_run *run,
                             const char *program_json) {
  RF_REQUIRE_ARG("rf_run_series_save_async", a);
  RF_REQUIRE_ARG("rf_run_series_save_async", s);
  RF_REQUIRE_ARG("rf_run_series_save_async", run);
  RF_REQUIRE(run->fsdp == a->fsdp && run->optim == a->optim,
             "an asynchronous save of another context or optimizer than its staging was made for");
  if (rf_run_async_wait(a, NULL) < 0) return -1; /* at most one in flight */
  /* no agreement here: a bad program JSON fails the save at the writers' first agreement */
  char *extra = rf_run_extra(run, program_json);
  rf_run_series_path(a->dir, sizeof a->dir, s->dir, run->step);
  /* the snapshot: everything the save writes. The writer thread copies it while
   * the next step's forward and backward run; the next optimizer step waits for
   * it. Without an optimizer nothing fences the shard: copied here. The ranks
   * that write nothing copy nothing. */
  uint64_t t0 = rf_time_ns();
  if (a->writer) rf_device_event_record(a->fsdp->device, &a->snap, a->fsdp->stream[RF_FSDP_STREAM_COMPUTE]);
  a->copying = a->writer && a->optim;
  if (a->writer && !a->optim) rf_run_async_copy(a);
  a->started_ns = rf_time_ns();
  a->stats.copy_ns += a->started_ns - t0;
  a->stats.saves++;
  a->writer_cpu_ns = 0;
  a->at_fence = a->steps_begun = a->draining = 0; /* (no writer thread runs now) */
  a->copies_late = 0;
  a->series = s;
  a->step = run->step;
  a->extra = extra;
  a->where = RF_RUN_ASYNC_STATE_RUNNING;
  a->has_result = 0;
  a->abort = 0;
  a->rc = 0;
  a->err[0] = '\0';
  a->pending = 1;
  a->ended_rc = 0;
  a->in_flight = a->writer; /* the ranks that write nothing only agree at the next wait */
  if (a->writer) {          /* SIGTERM and SIGINT stay blocked: rf_run_catch_signals' thread takes them */
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, &old);
    int rc = pthread_create(&a->thread, NULL, rf_run_async_main, a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) RF_DIE("cannot start the checkpoint writer thread: %s", strerror(rc));
    a->thread_started = 1;
  }
  return 0;
}

void rf_run_async_free(struct rf_run_async *a) {
  if (!a) return;
  if (a->optim) rf_optim_set_before_step(a->optim, NULL, NULL);
  if (a->thread_started) {
    pthread_mutex_lock(&a->mu);
    a->abort = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
  }
  rf_run_async_join(a);
  if (!a->posted) rf_comm_req_free(&a->req); /* (one posted when a run stops on an error is left to MPI) */
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  rf_device_event_free(a->fsdp->device, &a->snap);
  rf_device_stream_free(a->fsdp->device, a->stream);
  for (int j = 0; j < a->st.n; j++) {
    free(a->state[j]);
    free(a->pieces[j]);
  }
  free(a->views);
  free(a->master);
  free(a->bounce);
  if (a->optim) rf_optim_unhold(a->optim);
  rf_fsdp_unhold(a->fsdp);
  free(a);
}
