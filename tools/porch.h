/* The rfsdp command's error and allocation helpers, over the public API alone: the
 * command is a client of include/ (tests/test_boundary.c), so the library's
 * src/core/core.h is not its header. The macros are named RF_TOOL_* so that a reader
 * never takes them for core.h's RF_FAIL, RF_TRY, ... (the library's own, over
 * rf_error_set): these record through the public rf_fsdp_error_set, where
 * rf_fsdp_error() reads them, and RF_TOOL_DIE ends the command. */
#ifndef RF_TOOLS_PORCH_H
#define RF_TOOLS_PORCH_H

#include <stdio.h>
#include <stdlib.h>

#include "rfsdp.h"

/* Records the message (file:line: ...) and returns -1 from the calling function. */
#define RF_TOOL_FAIL(...) return rf_fsdp_error_set(__FILE__, __LINE__, __VA_ARGS__)
/* Returns -1 from the calling function when expr is not 0 (its message stays). */
#define RF_TOOL_TRY(expr)       \
  do {                          \
    if ((expr) != 0) return -1; \
  } while (0)
/* Fails with the message when cond is false. */
#define RF_TOOL_REQUIRE(cond, ...)          \
  do {                                      \
    if (!(cond)) RF_TOOL_FAIL(__VA_ARGS__); \
  } while (0)

/* Prints "file:line: fatal: message" to stderr and exits 1 (a broken invariant of the command). */
#define RF_TOOL_DIE(...)                                   \
  do {                                                     \
    fprintf(stderr, "%s:%d: fatal: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                          \
    fputc('\n', stderr);                                   \
    exit(1);                                               \
  } while (0)
/* An assert that stays on in release builds. */
#define RF_TOOL_ASSERT(cond)                                 \
  do {                                                       \
    if (!(cond)) RF_TOOL_DIE("assertion failed: %s", #cond); \
  } while (0)

/* The longest path the command builds (a prefix and a suffix, a checkpoint's folder). */
#define RF_FILE_PATH_MAX 4096

/* calloc that ends the command on failure (memory of the set-up, never of a step). */
static inline void *rf_tool_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) RF_TOOL_DIE("out of memory allocating %zu x %zu bytes", n, size);
  return p;
}

#endif
