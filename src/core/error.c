/* Error recording, fatal errors and checked allocation. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static _Thread_local char rf_error_text[1024];
static _Thread_local int rf_error_from_elsewhere; /* the last error only reports another rank's */
static rf_die_abort_hook rf_die_hook;
static uint64_t rf_alloc_bytes; /* rf_xalloc_bytes */

static void rf_error_vset(const char *file, int line, const char *fmt, va_list ap) {
  int n = snprintf(rf_error_text, sizeof rf_error_text, "%s:%d: ", file, line);
  if (n < 0 || (size_t)n >= sizeof rf_error_text) n = 0;
  vsnprintf(rf_error_text + n, sizeof rf_error_text - (size_t)n, fmt, ap);
}

int rf_error_set(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rf_error_vset(file, line, fmt, ap);
  va_end(ap);
  rf_error_from_elsewhere = 0;
  return -1;
}

int rf_error_set_elsewhere(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rf_error_vset(file, line, fmt, ap);
  va_end(ap);
  rf_error_from_elsewhere = 1;
  return -1;
}

const char *rf_error_msg(void) { return rf_error_text; }

int rf_error_is_elsewhere(void) { return rf_error_from_elsewhere; }

void rf_error_clear(void) {
  rf_error_text[0] = '\0';
  rf_error_from_elsewhere = 0;
}

void rf_die(const char *file, int line, const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  int rank = rf_log_get_rank();
  if (rank >= 0)
    fprintf(stderr, "[rank %d] %s:%d: fatal: %s\n", rank, file, line, text);
  else
    fprintf(stderr, "%s:%d: fatal: %s\n", file, line, text);
  fflush(stderr);
  if (rf_die_hook) rf_die_hook();
  exit(1);
}

void rf_die_set_abort_hook(rf_die_abort_hook hook) { rf_die_hook = hook; }

/* The heap is the process's: its allocations are counted process-wide. */
static uint64_t rf_heap_allocs;

uint64_t rf_heap_allocations(void) { return rf_heap_allocs; }

uint64_t rf_xalloc_bytes(void) { return __atomic_load_n(&rf_alloc_bytes, __ATOMIC_RELAXED); }

void rf_xalloc_note_bytes(size_t bytes) {
  __atomic_fetch_add(&rf_alloc_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
}

void *rf_xmalloc_at(size_t bytes, const char *file, int line) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) rf_die(file, line, "out of memory allocating %zu bytes", bytes);
  rf_heap_allocs++;
  __atomic_fetch_add(&rf_alloc_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
  return p;
}

void *rf_xcalloc_at(size_t n, size_t size, const char *file, int line) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) rf_die(file, line, "out of memory allocating %zu x %zu bytes", n, size);
  rf_heap_allocs++;
  __atomic_fetch_add(&rf_alloc_bytes, (uint64_t)n * (uint64_t)size, __ATOMIC_RELAXED);
  return p;
}

void *rf_xaligned_at(size_t align, size_t bytes, const char *file, int line) {
  void *p = NULL;
  size_t rounded = (bytes + align - 1) / align * align;
  int rc = posix_memalign(&p, align, rounded ? rounded : align);
  if (rc != 0)
    rf_die(file, line, "out of memory allocating %zu bytes (align %zu): %s", bytes, align, strerror(rc));
  rf_heap_allocs++;
  __atomic_fetch_add(&rf_alloc_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
  return p;
}
