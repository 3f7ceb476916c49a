/* src/optim: the optimizers' internal header: the public API (rfsdp_optim.h)
 * and the building blocks exposed for tests. See rfsdp_optim.h and docs/optim.md. */
#ifndef RF_OPTIM_H
#define RF_OPTIM_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/core.h"
#include "rfsdp.h"
#include "rfsdp_optim.h"

/* ---- building blocks (exposed for tests) -------------------------------------- */

/* bitsandbytes' create_dynamic_map(signed, 7, 8): 256 sorted values in [-1, 1]. */
const float *rf_optim_qmap(int is_signed);
/* The code of the map value nearest to x (x normalized to [-1, 1]). */
uint8_t rf_optim_quantize(int is_signed, float x);
/* Quantizes n floats with their absmax: codes[i] = nearest(x[i] / absmax). */
void rf_optim_quantize_block(int is_signed, const float *x, int64_t n, uint8_t *codes, float *absmax);
void rf_optim_dequantize_block(int is_signed, const uint8_t *codes, int64_t n, float absmax, float *x);

/* Orthogonalizes the A x B row-major matrix x in place with `steps` quintic
 * Newton-Schulz iterations (a, b, c) = (3.4445, -4.7750, 2.0315), after dividing
 * by max(Frobenius norm, eps); transposes when A > B. `work` holds at least
 * 2*A*B + 2*min(A,B)^2 floats. `poll(poll_arg)` (may be NULL) runs after every
 * gemm (to progress communication in flight). Returns the FLOPs. */
double rf_optim_newton_schulz(float *x, int64_t rows, int64_t cols, int steps, float eps, float *work,
                              void (*poll)(void *), void *poll_arg);

#endif
