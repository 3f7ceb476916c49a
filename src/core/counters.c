/* Counter arithmetic, the heap's allocation count and the monotonic clock. */
#include <string.h>
#include <time.h>

#include "core/core.h"

struct rf_counters rf_counters_diff(const struct rf_counters *now, const struct rf_counters *before) {
  static const struct rf_counters zero;
  if (!now) now = &zero;
  if (!before) before = &zero;
  struct rf_counters d;
  d.bytes_gathered = now->bytes_gathered - before->bytes_gathered;
  d.bytes_reduced = now->bytes_reduced - before->bytes_reduced;
  d.bytes_alltoall = now->bytes_alltoall - before->bytes_alltoall;
  d.bytes_intra = now->bytes_intra - before->bytes_intra;
  d.bytes_inter = now->bytes_inter - before->bytes_inter;
  d.bytes_copied = now->bytes_copied - before->bytes_copied;
  d.bytes_cast = now->bytes_cast - before->bytes_cast;
  d.bytes_own_shard = now->bytes_own_shard - before->bytes_own_shard;
  d.bytes_padding = now->bytes_padding - before->bytes_padding;
  d.collectives = now->collectives - before->collectives;
  d.allocations = now->allocations - before->allocations;
  d.comm_wait_ns = now->comm_wait_ns - before->comm_wait_ns;
  d.host_syncs = now->host_syncs - before->host_syncs;
  return d;
}

uint64_t rf_time_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t rf_gcd_i64(int64_t a, int64_t b) {
  while (b != 0) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a < 0 ? -a : a;
}

int64_t rf_lcm_i64_capped(int64_t a, int64_t b, int64_t cap) {
  int64_t g = rf_gcd_i64(a, b);
  int64_t q = a / g;
  if (q != 0 && b > cap / q) return -1;
  int64_t l = q * b;
  return l > cap ? -1 : l;
}
