/* Deterministic initialization: element i of a tensor is a function of (seed,
 * the tensor's name, i) alone, so every rank fills only its own piece and the
 * parameters are the same for any world size and layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fsdp.h"

static uint64_t rf_init_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t rf_init_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

/* Uniform in (0, 1]. */
static double rf_init_unit(uint64_t key, uint64_t i) {
  return ((double)(rf_init_mix(key ^ rf_init_mix(i)) >> 11) + 1.0) * 0x1.0p-53;
}

static float rf_init_value(const struct rf_init *init, uint64_t key, int64_t i) {
  switch (init->kind) {
    case RF_INIT_ZEROS:
      return 0.0f;
    case RF_INIT_CONST:
      return init->value;
    case RF_INIT_NORMAL: { /* Box-Muller on two independent uniforms */
      double u1 = rf_init_unit(key, 2 * (uint64_t)i), u2 = rf_init_unit(key, 2 * (uint64_t)i + 1);
      return (float)(init->value * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
    case RF_INIT_UNIFORM:
      return (float)(init->value * (2.0 * rf_init_unit(key, (uint64_t)i) - 1.0));
  }
  return 0.0f;
}

/* The values are computed on the host, a chunk at a time, and copied to the
 * device's master slab (on the host device the copy is a memcpy at start-up). */
void rf_fsdp_init_params(struct rf_fsdp *f) {
  const int64_t chunk = (int64_t)1 << 20;
  float *host = rf_xmalloc((size_t)chunk * sizeof(float));
  for (int t = 0; t < f->n_tensors; t++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, t, &v);
    const struct rf_init *init = &f->tensors[t].init;
    uint64_t key = rf_init_mix(f->opt.seed) ^ rf_init_name_hash(v.name);
    for (int64_t c0 = v.begin; c0 < v.end; c0 += chunk) {
      int64_t c1 = rf_min_i64(c0 + chunk, v.end);
#pragma omp parallel for schedule(static) if (c1 - c0 > 65536)
      for (int64_t i = c0; i < c1; i++) host[i - c0] = rf_init_value(init, key, i);
      rf_device_copy(f->device, v.master + (c0 - v.begin), host, (size_t)(c1 - c0) * sizeof(float),
                     RF_DEVICE_COPY_HOST_TO_DEVICE, f->stream[RF_FSDP_STREAM_COMPUTE]);
    }
  }
  free(host);
}
