/* What the runtime benches share (bench_fsdp, bench_hsdp): a LLaMA-shaped model
 * declared into a context, the synthetic compute of one unit, and medians. Linked
 * into every bench (the Makefile's bench rule). */
#ifndef RF_BENCH_SUPPORT_H
#define RF_BENCH_SUPPORT_H

#include <stdint.h>

#include "rfsdp.h"

/* The model's shape: an embedding [vocab, hidden], `blocks` units of attention
 * (q, k, v, o) and MLP (gate, up, down) weights, with an RMSNorm weight before
 * and after them when `block_norms`, and a head unit (a norm, [vocab, hidden]). */
struct bench_llama {
  int64_t hidden, inter, kv, vocab;
  int blocks;
  int block_norms;
};

/* Declares the model into f (units and tensors, normal(0.02) init) and finalizes it; dies on an error. */
void bench_llama_declare(struct rf_fsdp *f, const struct bench_llama *m);

/* Its parameters. */
int64_t bench_llama_params(const struct bench_llama *m);

/* The synthetic compute of unit u on `tokens` tokens: per 2-D tensor [out, in],
 * forward Y = X W^T; backward dX = dY W and dW += 1e-3 dY^T X, polling the
 * context between the gemms. x holds tokens x max(in), y tokens x max(out). */
void bench_unit_compute(struct rf_fsdp *f, int u, int backward, int tokens, float *x, float *y);

/* One forward over every unit in order and one backward in reverse, each unit's
 * compute bench_unit_compute between its begin and end calls. */
void bench_forward_backward(struct rf_fsdp *f, int tokens, float *x, float *y);

/* qsort's comparison of doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);

/* The median of v[0..n) (sorts v). */
double bench_median(double *v, int n);

#endif
