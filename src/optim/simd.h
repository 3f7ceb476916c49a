/* src/optim: what the AVX-512 kernels of quant.c and adamw8bit.c share. They
 * are built when the compiler targets AVX-512 F, BW, VL and VBMI (-march=native on
 * such a machine; not under ARCH=-march=x86-64-v3, e.g. for valgrind), next to
 * the portable kernels (rf_optim_simd_set in optim.h chooses). */
#ifndef RF_OPTIM_SIMD_H
#define RF_OPTIM_SIMD_H

#include <stdint.h>

/* The quantizer's lookup (quant.c): buckets by sign and the top 16 bits of the
 * magnitude, magnitudes below 2^-30 in the first, 2 and above in the last; an
 * entry is change | below << 16 | from << 24 (the code below and from the low 16
 * bits `change`). */
#define RF_OPTIM_QKEY_LO (97 << 7)                            /* magnitude key of 2^-30 */
#define RF_OPTIM_QBUCKETS ((128 << 7) - RF_OPTIM_QKEY_LO + 1) /* up to 2, then the rest */
/* [sign][bucket] entries of a map. */
const uint32_t *rf_optim_qentries(int is_signed);

/* A map as 4 planes of 256 bytes, 64-byte aligned: byte j (little-endian) of
 * map[c] at [256 j + c], for decoding 64 codes with byte permutes. */
const uint8_t *rf_optim_qmap_planes(int is_signed);

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI__)
#define RF_OPTIM_AVX512 1
#include <immintrin.h>

/* The lanes of a 16-wide step with `left` elements left. */
static inline __mmask16 rf_optim_mask16(int64_t left) {
  return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* 16 codes: one gather of the entries, then the comparison (NaN: 0). */
static inline __m512i rf_optim_quantize16(const uint32_t *entries, __m512 x) {
  const __m512i b = _mm512_castps_si512(x), low = _mm512_set1_epi32(0xffff);
  __m512i k = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)), 16),
                               _mm512_set1_epi32(RF_OPTIM_QKEY_LO));
  k = _mm512_min_epi32(_mm512_max_epi32(k, _mm512_setzero_si512()), _mm512_set1_epi32(RF_OPTIM_QBUCKETS - 1));
  k = _mm512_add_epi32(k, _mm512_and_si512(_mm512_srai_epi32(b, 31), _mm512_set1_epi32(RF_OPTIM_QBUCKETS)));
  __m512i e = _mm512_i32gather_epi32(k, (const void *)entries, 4);
  __mmask16 from = _mm512_cmpge_epu32_mask(_mm512_and_si512(b, low), _mm512_and_si512(e, low));
  __m512i c = _mm512_mask_mov_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 16), _mm512_set1_epi32(0xff)), from,
                                    _mm512_srli_epi32(e, 24));
  return _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), c);
}

/* 4 x 16 codes (in 32-bit lanes) as 64 bytes in order. */
static inline __m512i rf_optim_codes64(__m512i c0, __m512i c1, __m512i c2, __m512i c3) {
  __m512i r = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(c0));
  r = _mm512_inserti32x4(r, _mm512_cvtepi32_epi8(c1), 1);
  r = _mm512_inserti32x4(r, _mm512_cvtepi32_epi8(c2), 2);
  return _mm512_inserti32x4(r, _mm512_cvtepi32_epi8(c3), 3);
}

/* The order of 64 codes that rf_optim_decode64 wants: the unpacking of its 4
 * byte planes to floats interleaves 128-bit lanes, so the code of element
 * 16 k + 4 l + j goes to byte 16 l + 4 k + j (l, k < 4, j < 4; its own inverse). */
static inline __m512i rf_optim_decode64_order(__m512i codes) {
  const __m512i idx = _mm512_set_epi32(0x3f3e3d3c, 0x2f2e2d2c, 0x1f1e1d1c, 0x0f0e0d0c, 0x3b3a3938, 0x2b2a2928,
                                       0x1b1a1918, 0x0b0a0908, 0x37363534, 0x27262524, 0x17161514, 0x07060504,
                                       0x33323130, 0x23222120, 0x13121110, 0x03020100);
  return _mm512_permutexvar_epi8(idx, codes);
}

/* One byte plane of a 256-entry lookup: two 128-entry permutes, a blend on the
 * code's top bit. */
static inline __m512i rf_optim_decode_plane(const uint8_t *t, __m512i codes, __mmask64 top) {
  __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512((const void *)t), codes,
                                        _mm512_load_si512((const void *)(t + 64)));
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512((const void *)(t + 128)), codes,
                                        _mm512_load_si512((const void *)(t + 192)));
  return _mm512_mask_blend_epi8(top, lo, hi);
}

/* *o<k> = map[code of element 16 k + i], i < 16, for 64 codes in
 * rf_optim_decode64_order: a lookup per byte plane, then bytes to floats. */
static inline void rf_optim_decode64(const uint8_t *planes, __m512i codes, __m512 *o0, __m512 *o1, __m512 *o2,
                                     __m512 *o3) {
  const __mmask64 top = _mm512_movepi8_mask(codes);
  __m512i b0 = rf_optim_decode_plane(planes, codes, top),
          b1 = rf_optim_decode_plane(planes + 256, codes, top);
  __m512i b2 = rf_optim_decode_plane(planes + 512, codes, top),
          b3 = rf_optim_decode_plane(planes + 768, codes, top);
  __m512i w01l = _mm512_unpacklo_epi8(b0, b1), w01h = _mm512_unpackhi_epi8(b0, b1);
  __m512i w23l = _mm512_unpacklo_epi8(b2, b3), w23h = _mm512_unpackhi_epi8(b2, b3);
  *o0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01l, w23l));
  *o1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01l, w23l));
  *o2 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01h, w23h));
  *o3 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01h, w23h));
}
#else
#define RF_OPTIM_AVX512 0
#endif

#endif
