/* A bump allocator over one slab: sized once, never grows. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

void rf_arena_init(struct rf_arena *arena, size_t capacity) {
  memset(arena, 0, sizeof *arena);
  arena->capacity = capacity;
  arena->base = capacity ? rf_xaligned(64, capacity) : NULL;
}

void rf_arena_free(struct rf_arena *arena) {
  free(arena->base);
  memset(arena, 0, sizeof *arena);
}

void *rf_arena_alloc(struct rf_arena *arena, size_t bytes, size_t align) {
  RF_ASSERT(align > 0 && (align & (align - 1)) == 0);
  /* align the address, not the offset: the slab itself is only 64-byte aligned */
  uintptr_t base = (uintptr_t)arena->base;
  size_t start = (size_t)(((base + arena->used + align - 1) & ~(uintptr_t)(align - 1)) - base);
  if (start + bytes > arena->capacity)
    RF_DIE("arena of %zu bytes exhausted: %zu used, %zu requested", arena->capacity, arena->used, bytes);
  arena->used = start + bytes;
  if (arena->used > arena->peak) arena->peak = arena->used;
  arena->allocs++;
  rf_counters_global.allocations++;
  memset(arena->base + start, 0, bytes);
  return arena->base + start;
}

size_t rf_arena_mark(const struct rf_arena *arena) { return arena->used; }

void rf_arena_release(struct rf_arena *arena, size_t mark) {
  RF_ASSERT(mark <= arena->used);
  arena->used = mark;
}

void rf_arena_reset(struct rf_arena *arena) { arena->used = 0; }
