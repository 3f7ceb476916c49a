/* The data loader: a stateless function of (seed, step) to a global batch. */
#include "data/data.h"

int rf_data_loader_init(struct rf_data_loader *loader, const struct rf_token_file *file) {
  loader->file = file;
  if (file->n_tokens < 2)
    RF_FAIL("%s: %lld tokens are too few to train on", file->path, (long long)file->n_tokens);
  return 0;
}

/* splitmix64's finalizer: a bijective mix of 64 bits. */
static uint64_t rf_data_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int64_t rf_data_loader_offset(const struct rf_data_loader *loader, uint64_t seed, int64_t step, int64_t index,
                              int64_t seq) {
  uint64_t h = rf_data_mix(rf_data_mix(rf_data_mix(seed) ^ (uint64_t)step) ^ (uint64_t)index);
  uint64_t starts = (uint64_t)(loader->file->n_tokens - seq); /* offsets 0 .. n - seq - 1 */
  return (int64_t)(((unsigned __int128)h * starts) >> 64);
}

int rf_data_loader_batch(const struct rf_data_loader *loader, uint64_t seed, int64_t step, int64_t batch,
                         int64_t seq, int rank, int world, int32_t *tokens, int32_t *targets) {
  const struct rf_token_file *f = loader->file;
  if (batch <= 0 || seq <= 0)
    RF_FAIL("batch %lld and sequence length %lld must be positive", (long long)batch, (long long)seq);
  if (world <= 0 || rank < 0 || rank >= world)
    RF_FAIL("rank %d is outside the world of %d ranks", rank, world);
  if (batch % world != 0)
    RF_FAIL("the global batch of %lld sequences is not divisible by the %d ranks", (long long)batch, world);
  if (f->n_tokens < seq + 1)
    RF_FAIL("%s: %lld tokens are fewer than one sequence of %lld + 1", f->path, (long long)f->n_tokens,
            (long long)seq);
  int64_t per = batch / world;
  for (int64_t i = 0; i < per; i++) {
    int64_t off = rf_data_loader_offset(loader, seed, step, rank * per + i, seq);
    int32_t *x = tokens + i * seq, *y = targets + i * seq;
    for (int64_t t = 0; t < seq; t++) {
      x[t] = rf_token_file_get(f, off + t);
      y[t] = rf_token_file_get(f, off + t + 1);
    }
  }
  return 0;
}
