/* The rectangular boxes of a flat range of a row-major tensor. */
#include <string.h>

#include "ckpt/ckpt.h"

/* Boxes of [begin, end) (begin < end) inside the sub-tensor of dims [d, ndim);
 * `prefix` fixes the start of dims [0, d) (each of size 1). Appends to boxes. */
static int rf_ckpt_boxes_rec(int ndim, const int64_t *shape, int d, const int64_t *prefix, int64_t begin,
                             int64_t end, struct rf_ckpt_box *boxes, int n) {
  int64_t inner = 1;
  for (int k = d + 1; k < ndim; k++) inner *= shape[k];
  int64_t row0 = begin / inner, row1 = end / inner;
  int64_t pos[RF_CKPT_MAX_DIMS];
  memcpy(pos, prefix, sizeof pos);
  if (d == ndim - 1 || (begin % inner == 0 && end % inner == 0)) {
    /* whole rows [row0, row1) of dim d, every inner dim full */
    struct rf_ckpt_box *b = &boxes[n];
    for (int k = 0; k < d; k++) {
      b->start[k] = prefix[k];
      b->size[k] = 1;
    }
    b->start[d] = row0;
    b->size[d] = (d == ndim - 1) ? end - begin : row1 - row0;
    for (int k = d + 1; k < ndim; k++) {
      b->start[k] = 0;
      b->size[k] = shape[k];
    }
    return n + 1;
  }
  if (row0 == row1) { /* inside one row */
    pos[d] = row0;
    return rf_ckpt_boxes_rec(ndim, shape, d + 1, pos, begin - row0 * inner, end - row0 * inner, boxes, n);
  }
  if (begin % inner != 0) { /* the tail of row0 */
    pos[d] = row0;
    n = rf_ckpt_boxes_rec(ndim, shape, d + 1, pos, begin - row0 * inner, inner, boxes, n);
    row0++;
  }
  if (row1 > row0) /* whole rows */
    n = rf_ckpt_boxes_rec(ndim, shape, d, prefix, row0 * inner, row1 * inner, boxes, n);
  if (end % inner != 0) { /* the head of row1 */
    pos[d] = row1;
    n = rf_ckpt_boxes_rec(ndim, shape, d + 1, pos, 0, end - row1 * inner, boxes, n);
  }
  return n;
}

int rf_ckpt_range_boxes(int ndim, const int64_t *shape, int64_t begin, int64_t end,
                        struct rf_ckpt_box *boxes) {
  static const int64_t scalar[1] = {1};
  if (ndim == 0) {
    ndim = 1;
    shape = scalar;
  }
  RF_ASSERT(ndim <= RF_CKPT_MAX_DIMS && begin <= end);
  if (begin == end) return 0;
  int64_t prefix[RF_CKPT_MAX_DIMS] = {0};
  int n = rf_ckpt_boxes_rec(ndim, shape, 0, prefix, begin, end, boxes, 0);
  RF_ASSERT(n <= 2 * ndim - 1);
  return n;
}
