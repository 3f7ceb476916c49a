/* Matrix products through oneDNN (dnnl_matmul), primitives cached per shape. */
#include "gemm/gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define RF_GEMM_CHECK(call)                                                            \
  do {                                                                                 \
    dnnl_status_t st_ = (call);                                                        \
    if (st_ != dnnl_success) RF_DIE("oneDNN: %s failed (status %d)", #call, (int)st_); \
  } while (0)

/* Open addressing over a power-of-two table; entries are never removed. */
#define RF_GEMM_CACHE_SLOTS 4096

/* What one thread needs to run an entry's primitive: the operands' memory objects
 * (their data handles are set per product) and a scratchpad of its own. */
struct rf_gemm_thread {
  dnnl_memory_t a, b, c, scratch;
  void *scratch_buf;
};

struct rf_gemm_entry {
  struct rf_gemm_desc desc;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t prim;
  struct rf_gemm_thread *threads; /* [n_threads] */
  int n_threads;
  /* 1: a bf16 product this CPU's oneDNN does not implement (no AVX512-BF16 and no
   * AVX512 reference path, e.g. an AVX2 machine): A and B are widened to dense f32
   * (exact) and an f32 primitive runs; the products are exact in f32 and summed in
   * f32, as the bf16 kernels do (the summation order may differ). */
  int widen;
};

/* A thread's f32 copies of widened bf16 operands; grown at a new shape's first product
 * (the warm-up step), never freed. */
struct rf_gemm_widen_buf {
  float *a, *b;
  size_t cap_a, cap_b;
};

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  dnnl_engine_t engine;
  dnnl_stream_t *streams;          /* [n_threads] */
  struct rf_gemm_widen_buf *widen; /* [n_threads] */
  pthread_mutex_t *slots;          /* [n_threads]: held while a product uses that thread's state */
  int n_threads;
  struct rf_gemm_entry *table[RF_GEMM_CACHE_SLOTS];
  int64_t primitives, products;
} rf_gemm = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static int gemm_max_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

static int gemm_thread_index(void) {
#ifdef _OPENMP
  return omp_in_parallel() ? omp_get_thread_num() : 0;
#else
  return 0;
#endif
}

/* The engine and one stream per thread that may call in, created once. Threads are
 * counted at the first product: the OpenMP budget is set before it. */
static void gemm_init_engine(void) {
  RF_GEMM_CHECK(dnnl_engine_create(&rf_gemm.engine, dnnl_cpu, 0));
  rf_gemm.n_threads = gemm_max_threads();
  rf_gemm.streams = rf_xcalloc((size_t)rf_gemm.n_threads, sizeof(dnnl_stream_t));
  rf_gemm.widen = rf_xcalloc((size_t)rf_gemm.n_threads, sizeof(*rf_gemm.widen));
  rf_gemm.slots = rf_xcalloc((size_t)rf_gemm.n_threads, sizeof(*rf_gemm.slots));
  for (int t = 0; t < rf_gemm.n_threads; t++) {
    RF_GEMM_CHECK(dnnl_stream_create(&rf_gemm.streams[t], rf_gemm.engine, dnnl_stream_default_flags));
    pthread_mutex_init(&rf_gemm.slots[t], NULL);
  }
}

static void gemm_check_desc(const struct rf_gemm_desc *d) {
  if (d->m <= 0 || d->n <= 0 || d->k <= 0)
    RF_DIE("gemm: sizes m=%d n=%d k=%d must be positive", d->m, d->n, d->k);
  int a_cols = d->trans_a ? d->m : d->k, b_cols = d->trans_b ? d->k : d->n;
  if (d->lda < a_cols || d->ldb < b_cols || d->ldc < d->n)
    RF_DIE("gemm: leading dimensions lda=%d ldb=%d ldc=%d below the rows' widths %d, %d, %d", d->lda, d->ldb,
           d->ldc, a_cols, b_cols, d->n);
  if (d->dtype != RF_DTYPE_F32 && d->dtype != RF_DTYPE_BF16)
    RF_DIE("gemm: operand dtype %s (f32 or bf16 only)", rf_dtype_name(d->dtype));
}

/* alpha and beta key the cache by their bits (-0 and 0 differ, a NaN equals itself). */
static uint32_t gemm_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static uint64_t gemm_hash(const struct rf_gemm_desc *d) {
  const int v[] = {d->m, d->n, d->k, d->trans_a, d->trans_b, d->lda, d->ldb, d->ldc, (int)d->dtype};
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = (h ^ (uint64_t)(uint32_t)v[i]) * 1099511628211ull;
  h = (h ^ gemm_f32_bits(d->alpha)) * 1099511628211ull;
  return (h ^ gemm_f32_bits(d->beta)) * 1099511628211ull;
}

static int gemm_desc_equal(const struct rf_gemm_desc *a, const struct rf_gemm_desc *b) {
  return a->m == b->m && a->n == b->n && a->k == b->k && a->trans_a == b->trans_a &&
         a->trans_b == b->trans_b && a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc &&
         a->dtype == b->dtype && gemm_f32_bits(a->beta) == gemm_f32_bits(b->beta) &&
         gemm_f32_bits(a->alpha) == gemm_f32_bits(b->alpha);
}

/* A 2-D memory descriptor of rows x cols with the given leading dimension,
 * transposed storage when `trans`. */
static void gemm_md(dnnl_memory_desc_t *md, int rows, int cols, int ld, int trans, dnnl_data_type_t dt) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
  RF_GEMM_CHECK(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides));
}

/* The operand descriptors of d in `dt`; `dense`: A and B as the contiguous f32 copies
 * the widening writes (leading dimension = stored row width). */
static void gemm_mds(const struct rf_gemm_desc *d, dnnl_data_type_t dt, int dense, dnnl_memory_desc_t *a_md,
                     dnnl_memory_desc_t *b_md, dnnl_memory_desc_t *c_md) {
  int lda = dense ? (d->trans_a ? d->m : d->k) : d->lda, ldb = dense ? (d->trans_b ? d->k : d->n) : d->ldb;
  gemm_md(a_md, d->m, d->k, lda, d->trans_a, dt);
  gemm_md(b_md, d->k, d->n, ldb, d->trans_b, dt);
  gemm_md(c_md, d->m, d->n, d->ldc, 0, dnnl_f32);
}

/* The primitive descriptor of d's product on operands described by a_md, b_md. */
static dnnl_status_t gemm_pd_create(const struct rf_gemm_desc *d, const dnnl_memory_desc_t *a_md,
                                    const dnnl_memory_desc_t *b_md, const dnnl_memory_desc_t *c_md,
                                    dnnl_primitive_desc_t *pd) {
  dnnl_matmul_desc_t op;
  RF_GEMM_CHECK(dnnl_matmul_desc_init(&op, a_md, b_md, NULL, c_md));
  dnnl_primitive_attr_t attr;
  RF_GEMM_CHECK(dnnl_primitive_attr_create(&attr));
  RF_GEMM_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  if (d->alpha != 1.0f) RF_GEMM_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &d->alpha));
  dnnl_post_ops_t post = NULL;
  if (d->beta != 0.0f) {
    RF_GEMM_CHECK(dnnl_post_ops_create(&post));
    RF_GEMM_CHECK(dnnl_post_ops_append_sum(post, d->beta));
    RF_GEMM_CHECK(dnnl_primitive_attr_set_post_ops(attr, post));
  }
  dnnl_status_t st = dnnl_primitive_desc_create(pd, &op, attr, rf_gemm.engine, NULL);
  RF_GEMM_CHECK(dnnl_primitive_attr_destroy(attr));
  if (post) RF_GEMM_CHECK(dnnl_post_ops_destroy(post));
  return st;
}

static struct rf_gemm_entry *gemm_entry_create(const struct rf_gemm_desc *d) {
  dnnl_data_type_t dt = d->dtype == RF_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_t a_md, b_md, c_md;
  struct rf_gemm_entry *e = rf_xcalloc(1, sizeof(*e));
  e->desc = *d;
  gemm_mds(d, dt, 0, &a_md, &b_md, &c_md);
  dnnl_status_t st = gemm_pd_create(d, &a_md, &b_md, &c_md, &e->pd);
  if (st == dnnl_unimplemented && dt == dnnl_bf16) {
    e->widen = 1;
    gemm_mds(d, dnnl_f32, 1, &a_md, &b_md, &c_md);
    st = gemm_pd_create(d, &a_md, &b_md, &c_md, &e->pd);
  }
  if (st != dnnl_success)
    RF_DIE("oneDNN: no matmul for %s %dx%dx%d (status %d)", rf_dtype_name(d->dtype), d->m, d->n, d->k,
           (int)st);
  RF_GEMM_CHECK(dnnl_primitive_create(&e->prim, e->pd));
  const dnnl_memory_desc_t *sp_md = dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
  size_t sp_bytes = dnnl_memory_desc_get_size(sp_md);
  e->n_threads = rf_gemm.n_threads;
  e->threads = rf_xcalloc((size_t)e->n_threads, sizeof(*e->threads));
  for (int t = 0; t < e->n_threads; t++) {
    struct rf_gemm_thread *th = &e->threads[t];
    RF_GEMM_CHECK(dnnl_memory_create(&th->a, &a_md, rf_gemm.engine, DNNL_MEMORY_NONE));
    RF_GEMM_CHECK(dnnl_memory_create(&th->b, &b_md, rf_gemm.engine, DNNL_MEMORY_NONE));
    RF_GEMM_CHECK(dnnl_memory_create(&th->c, &c_md, rf_gemm.engine, DNNL_MEMORY_NONE));
    th->scratch_buf = rf_xaligned(64, (size_t)rf_round_up((int64_t)(sp_bytes > 0 ? sp_bytes : 64), 64));
    RF_GEMM_CHECK(dnnl_memory_create(&th->scratch, sp_md, rf_gemm.engine, th->scratch_buf));
  }
  return e;
}

/* A bf16 operand stored rows x cols with leading dimension ld, widened into a dense f32
 * copy in *buf (grown to fit at a shape's first product). Returns the copy. */
static const float *gemm_widen(const uint16_t *src, int rows, int cols, int ld, float **buf, size_t *cap) {
  size_t need = (size_t)rows * (size_t)cols;
  if (need > *cap) {
    free(*buf);
    *buf = rf_xaligned(64, (size_t)rf_round_up((int64_t)(need * sizeof(float)), 64));
    *cap = need;
  }
  for (int r = 0; r < rows; r++)
    rf_f32_from_bf16_n(*buf + (size_t)r * cols, src + (size_t)r * ld, (size_t)cols);
  return *buf;
}

/* The cached entry of d, created on first use. Lookups read published slots
 * without the lock; a creation holds it and publishes the finished entry. */
static struct rf_gemm_entry *gemm_entry(const struct rf_gemm_desc *d) {
  pthread_once(&rf_gemm.once, gemm_init_engine);
  uint64_t h = gemm_hash(d);
  for (int locked = 0; locked < 2; locked++) {
    if (locked) pthread_mutex_lock(&rf_gemm.lock);
    for (uint64_t i = 0; i < RF_GEMM_CACHE_SLOTS; i++) {
      size_t slot = (size_t)((h + i) & (RF_GEMM_CACHE_SLOTS - 1));
      struct rf_gemm_entry *e = __atomic_load_n(&rf_gemm.table[slot], __ATOMIC_ACQUIRE);
      if (e && gemm_desc_equal(&e->desc, d)) {
        if (locked) pthread_mutex_unlock(&rf_gemm.lock);
        return e;
      }
      if (e) continue;
      if (!locked) break; /* not there: look again under the lock, then create */
      gemm_check_desc(d);
      e = gemm_entry_create(d);
      __atomic_store_n(&rf_gemm.table[slot], e, __ATOMIC_RELEASE);
      __atomic_add_fetch(&rf_gemm.primitives, 1, __ATOMIC_RELAXED);
      pthread_mutex_unlock(&rf_gemm.lock);
      return e;
    }
  }
  RF_DIE("gemm: more than %d distinct product shapes", RF_GEMM_CACHE_SLOTS);
}

void rf_gemm_run(const struct rf_gemm_desc *d, const void *a, const void *b, float *c) {
  struct rf_gemm_entry *e = gemm_entry(d);
  int t = gemm_thread_index();
  if (t >= e->n_threads)
    RF_DIE("gemm: called from thread %d, but the OpenMP budget was %d threads at the first product", t,
           e->n_threads);
  struct rf_gemm_thread *th = &e->threads[t];
  /* Slot t's state (memory objects, scratchpad, stream, widened copies) is one thread's at a
   * time: the threads of one team each have their own slot (uncontended), but two host threads
   * outside a parallel region (the main thread and a checked device's stream worker) share slot 0:
   * the second waits instead of racing. */
  pthread_mutex_lock(&rf_gemm.slots[t]);
  if (e->widen) {
    struct rf_gemm_widen_buf *w = &rf_gemm.widen[t];
    a = gemm_widen(a, d->trans_a ? d->k : d->m, d->trans_a ? d->m : d->k, d->lda, &w->a, &w->cap_a);
    b = gemm_widen(b, d->trans_b ? d->n : d->k, d->trans_b ? d->k : d->n, d->ldb, &w->b, &w->cap_b);
  }
  /* oneDNN takes a non-const handle; it only reads A and B */
  RF_GEMM_CHECK(dnnl_memory_set_data_handle(th->a, (void *)a));
  RF_GEMM_CHECK(dnnl_memory_set_data_handle(th->b, (void *)b));
  RF_GEMM_CHECK(dnnl_memory_set_data_handle(th->c, c));
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, th->a},
                            {DNNL_ARG_WEIGHTS, th->b},
                            {DNNL_ARG_DST, th->c},
                            {DNNL_ARG_SCRATCHPAD, th->scratch}};
  RF_GEMM_CHECK(dnnl_primitive_execute(e->prim, rf_gemm.streams[t], 4, args));
  pthread_mutex_unlock(&rf_gemm.slots[t]);
  __atomic_add_fetch(&rf_gemm.products, 1, __ATOMIC_RELAXED);
}

struct rf_gemm_stats rf_gemm_stats(void) {
  struct rf_gemm_stats s = {__atomic_load_n(&rf_gemm.primitives, __ATOMIC_RELAXED),
                            __atomic_load_n(&rf_gemm.products, __ATOMIC_RELAXED)};
  return s;
}

const char *rf_gemm_impl_name(const struct rf_gemm_desc *d) {
  const char *name = "?";
  struct rf_gemm_entry *e = gemm_entry(d);
  RF_GEMM_CHECK(dnnl_primitive_desc_query(e->pd, dnnl_query_impl_info_str, 0, &name));
  if (!e->widen) return name;
  static __thread char widened[96];
  snprintf(widened, sizeof widened, "widened to f32: %s", name);
  return widened;
}

const char *rf_gemm_cpu_name(void) {
  static const struct {
    dnnl_cpu_isa_t isa;
    const char *name;
  } names[] = {{dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
               {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
               {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
               {dnnl_cpu_isa_avx512_core, "avx512_core"},
               {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
               {dnnl_cpu_isa_avx2, "avx2"},
               {dnnl_cpu_isa_avx, "avx"},
               {dnnl_cpu_isa_sse41, "sse41"}};
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (isa == names[i].isa) return names[i].name;
  return "other";
}

/* Process CPU time in seconds. */
static double gemm_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double rf_gemm_measure_gflops(enum rf_dtype dtype, int n, int reps) {
  size_t elems = (size_t)n * n, es = rf_dtype_size(dtype);
  uint8_t *a = rf_xaligned(64, elems * es), *b = rf_xaligned(64, elems * es);
  float *c = rf_xaligned(64, elems * sizeof(float));
  for (size_t i = 0; i < elems; i++) {
    float x = (float)((i * 7919u) % 1000u) * 1e-3f - 0.5f;
    if (dtype == RF_DTYPE_BF16)
      ((uint16_t *)(void *)a)[i] = ((uint16_t *)(void *)b)[i] = rf_bf16_from_f32(x);
    else
      ((float *)(void *)a)[i] = ((float *)(void *)b)[i] = x;
  }
  struct rf_gemm_desc d = {
      .m = n, .n = n, .k = n, .lda = n, .ldb = n, .ldc = n, .dtype = dtype, .alpha = 1.0f};
  rf_gemm_run(&d, a, b, c);
  int threads = gemm_max_threads();
  double best = 0.0;
  for (int r = 0; r < reps; r++) {
    uint64_t t0 = rf_time_ns();
    double c0 = gemm_cpu_seconds();
    rf_gemm_run(&d, a, b, c);
    double s = (double)(rf_time_ns() - t0) * 1e-9, cpu = (gemm_cpu_seconds() - c0) / threads;
    if (cpu > 0 && cpu < s) s = cpu;
    double rate = 2.0 * n * (double)n * n / s * 1e-9;
    best = rate > best ? rate : best;
  }
  free(a);
  free(b);
  free(c);
  return best;
}
