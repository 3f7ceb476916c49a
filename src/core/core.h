/* src/core: errors and checks, logging, dtype conversion, counters (the arena and
 * the counted moves are src/device's: they run on a device).
 *
 * Error model. Functions that can fail because of their input (a file, a config,
 * a user argument) return int: 0 on success, -1 on failure, after recording a
 * message with RF_FAIL (file, line and reason). The caller either propagates with
 * RF_TRY or reports rf_error_msg(). Failures that no caller can handle (out of
 * memory, a communication error, a broken invariant) stop the process with a
 * message via rf_die(), which then calls the abort hook (src/comm installs one that
 * ends every rank of the job, so no rank hangs) and exits. src/core knows no MPI. */
#ifndef RF_CORE_H
#define RF_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rfsdp_types.h" /* enum rf_dtype, struct rf_counters */

/* ---- errors ------------------------------------------------------------ */

/* Records "file:line: message" as the thread's last error. Returns -1. */
int rf_error_set(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The last error recorded on this thread ("" if none). Borrowed. */
const char *rf_error_msg(void);
void rf_error_clear(void);
/* rf_error_set for a failure this rank only learned of through an agreement
 * ("another rank failed ..."): the message is recorded and marked, so that the
 * rank that saw the problem itself is the one heard (rf_error_is_elsewhere). */
int rf_error_set_elsewhere(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 1 when the last error was recorded by rf_error_set_elsewhere. */
int rf_error_is_elsewhere(void);

#define RF_FAIL(...) return rf_error_set(__FILE__, __LINE__, __VA_ARGS__)
#define RF_FAIL_ELSEWHERE(...) return rf_error_set_elsewhere(__FILE__, __LINE__, __VA_ARGS__)
#define RF_TRY(expr)            \
  do {                          \
    if ((expr) != 0) return -1; \
  } while (0)
/* Fails naming argument `arg` of public function `fn` when it is NULL. */
#define RF_REQUIRE_ARG(fn, arg) RF_REQUIRE((arg) != NULL, "%s: argument '%s' is NULL", fn, #arg)
/* Fails with the message when cond is false. */
#define RF_REQUIRE(cond, ...)          \
  do {                                 \
    if (!(cond)) RF_FAIL(__VA_ARGS__); \
  } while (0)

/* Prints "[rank r] file:line: message" to stderr and stops every rank. */
_Noreturn void rf_die(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4))); /* noreturn twice: cppcheck reads only the attribute */
#define RF_DIE(...) rf_die(__FILE__, __LINE__, __VA_ARGS__)

/* What rf_die calls after printing, before exit(1): ends the whole job (the comm
 * backend's abort). NULL (the default) exits this process only. Process-wide;
 * the last installed hook wins. */
typedef void (*rf_die_abort_hook)(void);
void rf_die_set_abort_hook(rf_die_abort_hook hook);

/* An assert that stays on in release builds. */
#define RF_ASSERT(cond)                                                     \
  do {                                                                      \
    if (!(cond)) rf_die(__FILE__, __LINE__, "assertion failed: %s", #cond); \
  } while (0)

/* Checked allocation: dies with file and line on failure, counts allocations
 * (rf_heap_allocations).
 * Memory from rf_xmalloc/rf_xcalloc/rf_xaligned is released with free(). */
void *rf_xmalloc_at(size_t bytes, const char *file, int line);
void *rf_xcalloc_at(size_t n, size_t size, const char *file, int line);
void *rf_xaligned_at(size_t align, size_t bytes, const char *file, int line);
#define rf_xmalloc(bytes) rf_xmalloc_at((bytes), __FILE__, __LINE__)
#define rf_xcalloc(n, size) rf_xcalloc_at((n), (size), __FILE__, __LINE__)
#define rf_xaligned(align, bytes) rf_xaligned_at((align), (bytes), __FILE__, __LINE__)
/* The bytes requested from rf_xmalloc/rf_xcalloc/rf_xaligned since the process
 * started (process-wide, atomic; never decreases). Tests measure what a create
 * allocates with it (test_optim_mpi: an optimizer's state_bytes and workspace_bytes
 * against what it really allocates). */
uint64_t rf_xalloc_bytes(void);
/* Adds bytes allocated outside rf_x* (a device's host allocator) to rf_xalloc_bytes. */
void rf_xalloc_note_bytes(size_t bytes);

/* ---- logging ------------------------------------------------------------ */

enum rf_log_level { RF_LOG_LEVEL_ERROR = 0, RF_LOG_LEVEL_WARN, RF_LOG_LEVEL_INFO, RF_LOG_LEVEL_DEBUG };

/* The rank printed in front of every line (-1: none). Set by rf_comm_init. */
void rf_log_set_rank(int rank);
int rf_log_get_rank(void);
/* Level from the environment variable RF_LOG (error|warn|info|debug), default info. */
void rf_log_set_level(enum rf_log_level level);
void rf_log(enum rf_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define rf_log_error(...) rf_log(RF_LOG_LEVEL_ERROR, __VA_ARGS__)
#define rf_log_warn(...) rf_log(RF_LOG_LEVEL_WARN, __VA_ARGS__)
#define rf_log_info(...) rf_log(RF_LOG_LEVEL_INFO, __VA_ARGS__)
#define rf_log_debug(...) rf_log(RF_LOG_LEVEL_DEBUG, __VA_ARGS__)

/* ---- dtypes ------------------------------------------------------------- */

/* rf_dtype_size and rf_dtype_name: include/rfsdp_types.h. */
/* Parses "f32", "bf16", "fp8e4m3", "u8", "i32", "i64", "f64". Returns -1 on an unknown name. */
int rf_dtype_parse(const char *name, enum rf_dtype *out);

/* The bits of an f32. Not memcpy: a union keeps loops over its callers vectorizable. */
static inline uint32_t rf_f32_bits(float x) {
  union {
    float f;
    uint32_t u;
  } v = {.f = x};
  return v.u;
}
/* bf16 stored as uint16_t: round to nearest even, NaN stays NaN (quiet). Inline
 * and branch-free so that loops over them vectorize (the bf16 sum of src/comm). */
static inline uint16_t rf_bf16_from_f32(float x) {
  uint32_t u = rf_f32_bits(x);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
static inline float rf_f32_from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}
/* fp8 e4m3 (OCP: bias 7, no infinities, 0x7f/0xff are NaN, max 448): round to
 * nearest even, saturating to +-448, NaN stays NaN, inf saturates. Without branches
 * (every path computed, one selected), so quantizing loops run without mispredictions:
 * normal results from the bits (exponent rebiased 127 -> 7, 3 mantissa bits rounded to
 * even on the 20 dropped, carries into the exponent, clamped at 0x7e = 448); below 2^-6
 * the value in units of 2^-9 rounded to even by adding and subtracting 2^23. */
static inline uint8_t rf_fp8e4m3_from_f32(float x) {
  uint32_t u = rf_f32_bits(x);
  uint32_t sign = (u >> 24) & 0x80u, mag = u & 0x7fffffffu;
  uint32_t mant = mag & 0x7fffffu, rem = mant & 0xfffffu;
  uint32_t v = (((mag >> 23) - 120u) << 3) | (mant >> 20); /* wraps below 2^-7: not selected then */
  v += (uint32_t)(rem > 0x80000u) | ((uint32_t)(rem == 0x80000u) & v);
  v = v > 0x7eu ? 0x7eu : v;
  float small = mag < 0x3c800000u ? __builtin_fabsf(x) : 0.0f; /* |x| < 2^-6 */
  uint32_t sub = (uint32_t)((small * 0x1p9f + 0x1p23f) - 0x1p23f);
  uint32_t r = mag < 0x3c800000u ? sub : v;
  r = mag >= 0x7f800000u ? 0x7eu : r;
  r = mag > 0x7f800000u ? 0x7fu : r;
  return (uint8_t)(sign | r);
}
float rf_f32_from_fp8e4m3(uint8_t b);
/* dst[i] = rf_fp8e4m3_from_f32(src[i]), i < n (AVX-512 when rf_fp8_simd_set is on). */
void rf_fp8e4m3_from_f32_n(uint8_t *dst, const float *src, size_t n);

void rf_bf16_from_f32_n(uint16_t *dst, const float *src, size_t n);
void rf_f32_from_bf16_n(float *dst, const uint16_t *src, size_t n);

/* ---- fp8 block quantization (src/core/fp8.c) ---------------------------- */

/* A row-major [rows, cols] f32 tensor cut into tiles of tile_rows x tile_cols
 * (DeepSeek-V3's recipe: 128 x 128 for weights, 1 x 128 for activations and output
 * gradients, 128 x 1 for the weight gradient's operands); the last tile of a row or
 * column is partial when the size is not a multiple. Tile (i, j)'s scale is at
 * scales[i * ceil(cols / tile_cols) + j]. A range of whole tile rows of a tensor is
 * itself such a tensor (pointers at its first row): an owner quantizes its own rows. */
#define RF_FP8_TILE 128
#define RF_FP8_E4M3_MAX 448.0f
struct rf_fp8_grid {
  int64_t rows, cols;
  int tile_rows, tile_cols;
};
/* The number of tiles along rows, along columns, and in all. */
int64_t rf_fp8_grid_tile_rows(const struct rf_fp8_grid *g);
int64_t rf_fp8_grid_tile_cols(const struct rf_fp8_grid *g);
int64_t rf_fp8_grid_tiles(const struct rf_fp8_grid *g);
/* A tile's scale from its largest magnitude: amax / 448 (f32 division); with pow2,
 * the smallest power of two s with 448 s >= amax (TransformerEngine's power-of-two
 * scales: the quantized values are then exact multiples). A zero tile's scale is 1
 * (its codes are zeros whatever the scale); a tiny amax whose amax / 448 underflows
 * to 0 takes the smallest positive f32, so no scale is 0. amax must be finite. */
float rf_fp8_scale(float amax, int pow2);
/* codes[e] = e4m3(x[e] / scale of e's tile) (round to nearest even), one scale per
 * tile. Fails, naming `name` and the element, when x holds a NaN or an infinity. */
int rf_fp8_quantize(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name, uint8_t *codes,
                    float *scales);
/* rf_fp8_quantize writing the codes as bf16 bits (rf_fp8_codes_to_bf16's) instead of
 * bytes: the operand of a product on codes in one pass. */
int rf_fp8_quantize_bf16(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name,
                         uint16_t *codes_bf16, float *scales);
/* x[e] = f32(codes[e]) * scale of e's tile. */
void rf_fp8_dequantize(const struct rf_fp8_grid *g, const uint8_t *codes, const float *scales, float *x);
/* The codes as bf16 (exact: every e4m3 value is a bf16 value), for products on codes. */
void rf_fp8_codes_to_bf16(uint16_t *dst, const uint8_t *codes, size_t n);
/* The AVX-512 quantizer and widening (built under -march with AVX-512 F, BW and VL) on
 * or off (the portable ones: the same codes, bits and scales); returns the previous
 * setting. Always off in a build without them. Not thread-safe: set before work. */
int rf_fp8_simd_set(int on);

/* ---- counters ----------------------------------------------------------- */

/* Counters (struct rf_counters: include/rfsdp_types.h) belong to whoever counts: a
 * runtime context owns one set, and its device (src/device), its moves and its
 * communicators (src/comm) add to it. The heap is the process's: */
/* rf_xmalloc, rf_xcalloc and rf_xaligned calls of this process since it started. */
uint64_t rf_heap_allocations(void);
/* rf_counters_diff (`now - before`, per-step numbers): include/rfsdp_types.h. */

/* ---- time --------------------------------------------------------------- */

/* Monotonic time in nanoseconds. */
uint64_t rf_time_ns(void);

/* ---- small helpers ------------------------------------------------------ */

static inline int64_t rf_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t rf_round_up(int64_t a, int64_t m) { return rf_ceil_div(a, m) * m; }
static inline int64_t rf_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t rf_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
int64_t rf_gcd_i64(int64_t a, int64_t b);

/* The param slot's memory-sizing rule, one for the DBuffer that lays a slot out
 * (src/dbuffer/layout.c) and the simulator that sizes it (src/sim/simulate.c): from
 * byte `at`, each piece is placed at `at` and `at` moves past it to the next multiple
 * of `align` bytes (the alignment of the element offsets times the param dtype's
 * size). In order: every buffer (elements times their width: the param dtype's size,
 * 1 for FP8), then per FP8 tensor its codes (a byte per element, only when quantized
 * after the gather: `after`; the widest 128-row band noted in *band) and its f32 tile
 * scales, then with a param dtype narrower than f32 the f32 scratch of that band
 * (rf_slot_band, nothing when *band is 0). Each returns the piece's first byte. */
static inline int64_t rf_slot_place(int64_t *at, int64_t bytes, int64_t align) {
  int64_t first = *at;
  *at = rf_round_up(*at + bytes, align);
  return first;
}
static inline int64_t rf_slot_fp8_codes(int64_t *at, int64_t *band, int64_t numel, int64_t rows, int64_t cols,
                                        int64_t align) {
  *band = rf_max_i64(*band, rf_min_i64(RF_FP8_TILE, rows) * cols);
  return rf_slot_place(at, numel, align);
}
static inline int64_t rf_slot_fp8_scales(int64_t *at, int64_t tiles, int64_t align) {
  return rf_slot_place(at, tiles * (int64_t)sizeof(float), align);
}
static inline int64_t rf_slot_band(int64_t *at, int64_t band, int64_t param_size, int64_t align) {
  if (param_size == (int64_t)sizeof(float) || band <= 0) return -1;
  return rf_slot_place(at, band * (int64_t)sizeof(float), align);
}
/* lcm, or -1 when it would exceed `cap`. */
int64_t rf_lcm_i64_capped(int64_t a, int64_t b, int64_t cap);

/* ---- files -------------------------------------------------------------- */

#define RF_FILE_PATH_MAX 4096

/* Writes a file atomically: bytes go to "<path>.tmp.<pid>"; commit fsyncs it,
 * renames it over `path` and fsyncs the directory, so `path` holds either its old
 * content or the whole new file, never a part. abort removes the temporary file.
 * Owns the descriptor between open and commit/abort. */
struct rf_file_writer {
  int fd;
  uint64_t bytes; /* written so far by rf_file_writer_write */
  char path[RF_FILE_PATH_MAX];
  char tmp[RF_FILE_PATH_MAX + 32];
  /* direct mode (rf_file_writer_open_direct): appended bytes gather in `bounce`
   * (borrowed) and reach the file in whole RF_FILE_DIRECT_ALIGN blocks written
   * with O_DIRECT (no page cache: less CPU than buffered writes + fsync); bytes
   * [flushed, bytes) are still in the bounce; the tail under one block is written
   * buffered at commit. direct 0: buffered writes, also where the filesystem
   * refuses O_DIRECT. */
  int direct;
  uint8_t *bounce;
  size_t bounce_cap;
  uint64_t flushed;
};

/* O_DIRECT's alignment of buffers, offsets and lengths (every Linux filesystem's
 * logical block divides it). */
#define RF_FILE_DIRECT_ALIGN 4096

int rf_file_writer_open(struct rf_file_writer *w, const char *path);
/* A writer whose appends go out with O_DIRECT through `bounce` (borrowed until
 * commit/abort: aligned to RF_FILE_DIRECT_ALIGN, `bounce_cap` a non-zero multiple
 * of it). Where the filesystem refuses O_DIRECT (EINVAL at open or at the first
 * write), the writer falls back to buffered writes (one debug line). The file's
 * bytes are the same either way. rf_file_writer_pwrite may rewrite only bytes
 * still in the bounce (not flushed yet). */
int rf_file_writer_open_direct(struct rf_file_writer *w, const char *path, void *bounce, size_t bounce_cap);
/* Files committed with O_DIRECT so far, process-wide (the tests tell the paths apart). */
uint64_t rf_file_direct_files(void);
/* Testing hook: 1 makes every open_direct act as if the filesystem refused O_DIRECT at
 * open, 2 as if it took the open but refused the first direct write (EINVAL); 0: off. */
void rf_file_test_refuse_direct(int refuse);
/* Appends at `bytes`. */
int rf_file_writer_write(struct rf_file_writer *w, const void *buf, size_t bytes);
/* Writes at an offset (e.g. a header completed at the end); does not move `bytes`. */
int rf_file_writer_pwrite(struct rf_file_writer *w, const void *buf, size_t bytes, uint64_t offset);
/* On failure the temporary file is removed and `path` is unchanged. */
int rf_file_writer_commit(struct rf_file_writer *w);
void rf_file_writer_abort(struct rf_file_writer *w);
/* One buffer, atomically. */
int rf_file_write_all(const char *path, const void *buf, size_t bytes);
int rf_file_fsync_dir(const char *dir);
/* Reads a whole file into a new NUL-terminated buffer (caller frees). */
int rf_file_read_all(const char *path, char **out, size_t *bytes);
/* pread of exactly `bytes`; a short file is an error naming `path` ("truncated"). */
int rf_file_pread_all(int fd, void *buf, size_t bytes, uint64_t offset, const char *path);

#endif
