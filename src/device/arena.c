/* A bump allocator over one slab of device memory: sized once, never grows. */
#include "device/device.h"

void rf_arena_init(struct rf_arena *arena, struct rf_device *dev, size_t capacity,
                   struct rf_device_stream *stream) {
  memset(arena, 0, sizeof *arena);
  arena->dev = dev;
  arena->stream = stream;
  arena->capacity = capacity;
  arena->base = capacity ? rf_device_alloc(dev, capacity, 64) : NULL;
}

void rf_arena_free(struct rf_arena *arena) {
  if (arena->dev) rf_device_release(arena->dev, arena->base);
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
  RF_DEVICE_COUNT(arena->dev, allocations, 1);
  rf_device_memset(arena->dev, arena->base + start, 0, bytes, arena->stream);
  return arena->base + start;
}

size_t rf_arena_mark(const struct rf_arena *arena) { return arena->used; }

void rf_arena_release(struct rf_arena *arena, size_t mark) {
  RF_ASSERT(mark <= arena->used);
  arena->used = mark;
}

void rf_arena_reset(struct rf_arena *arena) { arena->used = 0; }
