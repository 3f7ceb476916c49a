/* cuda-emu: CUDA's warp matrix functions (nvcuda::wmma, <mma.h>) for bf16 operands and f32
 * accumulators, the tensor-core path of the kernels, on the stand-in's warps.
 *
 * A fragment holds a whole 16x16 tile here (row-major: x[r * 16 + c]) in every lane,
 * where the GPU spreads the tile over the warp's lanes in an unspecified way; a kernel
 * that uses fragments only through the functions below, and element-wise operations
 * applied alike to every x[i] (as CUDA permits), computes the same either way.
 * load_matrix_sync, store_matrix_sync and mma_sync are warp collectives (block.cpp):
 * every lane of the warp must reach them, with the same pointer and leading dimension
 * (a divergent or partial call stops the program, where the GPU's result is undefined);
 * the last lane to arrive does the work once for the warp. mma_sync computes
 * d = a b + c with each product exact in f32 (a bf16 product is) and the 16 terms of a
 * dot product added to c in k order, each sum rounded (fmaf); a tensor core adds them in
 * its own order and precision, so tests allow for the difference. The pointer of a load
 * or store must be 32-byte aligned and ldm a multiple of 8 (16-byte units for bf16,
 * 4 elements... CUDA's rule: a multiple of 8 for 16-bit types, 4 for f32), as on the GPU. */
#ifndef RF_EMU_MMA_H
#define RF_EMU_MMA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cuda-emu: only the m16n16k16 shape");
  enum { num_elements = 256 };
  T x[256];
};

}  // namespace wmma
}  // namespace nvcuda

namespace rf_emu {
namespace wmma_detail {

struct lane_op {
  const void *ptr;
  unsigned ldm;
  int layout; /* 0 row-major, 1 col-major */
  void *frag;
  const void *a, *b, *c;
};

inline void check_same(void *const *lanes, unsigned mask, const char *what) {
  if (mask != 0xffffffffu) kernel_fail("%s with mask %08x: every lane of the warp must call it", what, mask);
  const lane_op *l0 = (const lane_op *)lanes[0];
  for (int l = 1; l < 32; l++) {
    const lane_op *o = (const lane_op *)lanes[l];
    if (o->ptr != l0->ptr || o->ldm != l0->ldm || o->layout != l0->layout)
      kernel_fail(
          "%s: lane %d passes (%p, ldm %u) where lane 0 passes (%p, ldm %u): a warp matrix function's "
          "arguments must be the same in every lane",
          what, l, o->ptr, o->ldm, l0->ptr, l0->ldm);
  }
  if (((uintptr_t)l0->ptr & 31u) != 0)
    kernel_fail("%s: the pointer %p is not 32-byte aligned", what, l0->ptr);
}

/* CUDA's rule: ldm a multiple of 16 bytes (8 elements of 16 bits, 4 of f32) */
inline void check_ldm(unsigned ldm, size_t elem, const char *what) {
  if ((ldm * elem) % 16 != 0)
    kernel_fail("%s: ldm %u is not a multiple of %zu elements", what, ldm, 16 / elem);
}

template <typename T>
inline float to_f32(T v) {
  return (float)v;
}
template <>
inline float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

/* a tile loaded into every lane's fragment: element (r, c) of the tile at ptr[r * ldm + c]
 * (row-major) or ptr[c * ldm + r] (col-major) */
template <typename T>
void load_resolve(void *const *lanes, unsigned mask) {
  check_same(lanes, mask, "wmma::load_matrix_sync");
  const lane_op *l0 = (const lane_op *)lanes[0];
  check_ldm(l0->ldm, sizeof(T), "wmma::load_matrix_sync");
  T tile[256];
  const T *p = (const T *)l0->ptr;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      tile[r * 16 + c] = l0->layout ? p[(size_t)c * l0->ldm + r] : p[(size_t)r * l0->ldm + c];
  for (int l = 0; l < 32; l++) memcpy(((lane_op *)lanes[l])->frag, tile, sizeof tile);
}

template <typename T>
void store_resolve(void *const *lanes, unsigned mask) {
  check_same(lanes, mask, "wmma::store_matrix_sync");
  const lane_op *l0 = (const lane_op *)lanes[0];
  check_ldm(l0->ldm, sizeof(T), "wmma::store_matrix_sync");
  for (int l = 1; l < 32; l++)
    if (memcmp(((lane_op *)lanes[l])->frag, l0->frag, 256 * sizeof(T)) != 0)
      kernel_fail(
          "wmma::store_matrix_sync: lane %d's fragment differs from lane 0's (a fragment changed in "
          "some lanes only)",
          l);
  T *p = (T *)l0->ptr;
  const T *f = (const T *)l0->frag;
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++)
      (l0->layout ? p[(size_t)c * l0->ldm + r] : p[(size_t)r * l0->ldm + c]) = f[r * 16 + c];
}

/* d = a b + c: a [16 x 16] row-major in the fragment, b likewise (k, n) */
template <typename TA>
void mma_resolve(void *const *lanes, unsigned mask) {
  if (mask != 0xffffffffu)
    kernel_fail("wmma::mma_sync with mask %08x: every lane of the warp must call it", mask);
  const lane_op *l0 = (const lane_op *)lanes[0];
  const TA *a = (const TA *)l0->a, *b = (const TA *)l0->b;
  const float *c = (const float *)l0->c;
  for (int l = 1; l < 32; l++) {
    const lane_op *o = (const lane_op *)lanes[l];
    if (memcmp(o->a, a, 256 * sizeof(TA)) != 0 || memcmp(o->b, b, 256 * sizeof(TA)) != 0 ||
        memcmp(o->c, c, 256 * sizeof(float)) != 0)
      kernel_fail(
          "wmma::mma_sync: lane %d's fragments differ from lane 0's (a fragment changed in some lanes "
          "only)",
          l);
  }
  float d[256];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c[i * 16 + j];
      for (int k = 0; k < 16; k++) s = fmaf(to_f32(a[i * 16 + k]), to_f32(b[k * 16 + j]), s);
      d[i * 16 + j] = s;
    }
  for (int l = 0; l < 32; l++) memcpy(((lane_op *)lanes[l])->frag, d, sizeof d);
}

}  // namespace wmma_detail
}  // namespace rf_emu

namespace nvcuda {
namespace wmma {

template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *ptr, unsigned ldm) {
  rf_emu::wmma_detail::lane_op me = {ptr, ldm, std::is_same<Layout, col_major>::value ? 1 : 0, f.x, 0, 0, 0};
  rf_emu::warp_collective(0xffffffffu, rf_emu::wmma_detail::load_resolve<T>, &me, "wmma::load_matrix_sync");
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *ptr, unsigned ldm,
                             layout_t layout) {
  rf_emu::wmma_detail::lane_op me = {ptr, ldm, layout == mem_col_major ? 1 : 0, f.x, 0, 0, 0};
  rf_emu::warp_collective(0xffffffffu, rf_emu::wmma_detail::load_resolve<float>, &me,
                          "wmma::load_matrix_sync");
}
inline void store_matrix_sync(float *ptr, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                              layout_t layout) {
  rf_emu::wmma_detail::lane_op me = {ptr, ldm, layout == mem_col_major ? 1 : 0, (void *)f.x, 0, 0, 0};
  rf_emu::warp_collective(0xffffffffu, rf_emu::wmma_detail::store_resolve<float>, &me,
                          "wmma::store_matrix_sync");
}
template <typename Use, typename T, typename Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, T v) {
  for (int i = 0; i < 256; i++) f.x[i] = v;
}
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
  rf_emu::wmma_detail::lane_op me = {0, 0, 0, d.x, a.x, b.x, c.x};
  rf_emu::warp_collective(0xffffffffu, rf_emu::wmma_detail::mma_resolve<T>, &me, "wmma::mma_sync");
}

}  // namespace wmma
}  // namespace nvcuda

#endif
