/* src/safetensors: the safetensors format (Hugging Face), read and written.
 *
 * A file is: an 8-byte little-endian header length N, N bytes of a JSON object
 * (UTF-8, possibly padded with spaces), then the data. Each key of the object is
 * a tensor name mapping to {"dtype": "F32", "shape": [d0, ...], "data_offsets":
 * [begin, end]} (byte offsets into the data, row-major, little-endian); the key
 * "__metadata__" maps to an object of strings. The tensors' byte ranges tile the
 * data exactly (contiguous, no gap, no overlap) and the data ends the file.
 *
 * The reader validates all of that on open and fails naming the file and the
 * problem; it then reads any tensor or any flat element range of one, as raw
 * bytes or converted to f32 (from F32, BF16, F16). It never maps or holds the
 * file: every read is a pread of the bytes asked for.
 *
 * The writer streams: the caller declares every tensor (name, dtype, shape)
 * first, the header is written at open, then the tensors' bytes are appended in
 * declaration order, in pieces of any size; commit checks that every byte came
 * and renames the file into place atomically (rf_file_writer). */
#ifndef RF_SAFETENSORS_H
#define RF_SAFETENSORS_H

#include <stdint.h>

#include "core/core.h"

/* The largest header accepted (the reference implementation's limit). */
#define RF_SAFETENSORS_MAX_HEADER_BYTES (100u << 20)

enum rf_safetensors_dtype {
  RF_SAFETENSORS_DTYPE_BOOL = 0,
  RF_SAFETENSORS_DTYPE_U8,
  RF_SAFETENSORS_DTYPE_I8,
  RF_SAFETENSORS_DTYPE_I16,
  RF_SAFETENSORS_DTYPE_U16,
  RF_SAFETENSORS_DTYPE_F16,
  RF_SAFETENSORS_DTYPE_BF16,
  RF_SAFETENSORS_DTYPE_I32,
  RF_SAFETENSORS_DTYPE_U32,
  RF_SAFETENSORS_DTYPE_F32,
  RF_SAFETENSORS_DTYPE_I64,
  RF_SAFETENSORS_DTYPE_U64,
  RF_SAFETENSORS_DTYPE_F64,
  RF_SAFETENSORS_DTYPE_F8_E4M3,
  RF_SAFETENSORS_DTYPE_F8_E5M2,
  RF_SAFETENSORS_DTYPE_COUNT
};

/* "F32", "BF16", ... as in the format. */
const char *rf_safetensors_dtype_name(enum rf_safetensors_dtype dtype);
int rf_safetensors_dtype_parse(const char *name, enum rf_safetensors_dtype *out);
size_t rf_safetensors_dtype_size(enum rf_safetensors_dtype dtype);
/* The safetensors dtype of an rfsdp dtype (f32, bf16, fp8e4m3, u8, i32, i64, f64). */
enum rf_safetensors_dtype rf_safetensors_dtype_from_rf(enum rf_dtype dtype);

/* IEEE half precision, round to nearest even (NaN stays NaN, overflow to inf). */
float rf_f32_from_f16(uint16_t h);
uint16_t rf_f16_from_f32(float x);

/* One tensor of a file. Owns name. */
struct rf_safetensors_tensor {
  char *name;
  enum rf_safetensors_dtype dtype;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
  int64_t numel;
  uint64_t begin, end; /* bytes, relative to the start of the data */
};

/* ---- reading ----------------------------------------------------------------- */

/* An open file: the parsed header and a read-only descriptor. Owns everything;
 * rf_safetensors_close releases it. Tensors are in the order of their data. */
struct rf_safetensors_file {
  char path[RF_FILE_PATH_MAX];
  int fd;
  uint64_t file_bytes;
  uint64_t data_start; /* 8 + header length */
  int n_tensors;
  struct rf_safetensors_tensor *tensors;
  char *metadata_json; /* "__metadata__" printed compactly, or NULL when absent */
};

/* Opens and validates the file; on failure nothing is left open and the message
 * names the file and the problem. */
int rf_safetensors_open(struct rf_safetensors_file *f, const char *path);
void rf_safetensors_close(struct rf_safetensors_file *f);
/* NULL when absent. Borrowed. */
const struct rf_safetensors_tensor *rf_safetensors_find(const struct rf_safetensors_file *f,
                                                        const char *name);
/* Elements [begin, end) of tensor `name`, raw (its own dtype) into `out`. */
int rf_safetensors_read_raw(struct rf_safetensors_file *f, const char *name, int64_t begin, int64_t end,
                            void *out);
/* Elements [begin, end) of tensor `name` converted to f32 (F32, BF16, F16 only;
 * exact for all three). Reads in pieces of at most 1 MiB through a small buffer. */
int rf_safetensors_read_f32(struct rf_safetensors_file *f, const char *name, int64_t begin, int64_t end,
                            float *out);

/* ---- writing ----------------------------------------------------------------- */

/* A tensor to be written. Borrowed. */
struct rf_safetensors_decl {
  const char *name;
  enum rf_safetensors_dtype dtype;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
};

/* A file being written. Owns its tensors' names and the file writer. */
struct rf_safetensors_writer {
  struct rf_file_writer file;
  int n_tensors;
  struct rf_safetensors_tensor *tensors;
  int cur;             /* the tensor being written */
  uint64_t cur_bytes;  /* bytes of it written so far */
  uint64_t data_start; /* 8 + header length */
  uint8_t *conv;       /* conversion buffer of rf_safetensors_writer_write_f32 */
};

/* Declares every tensor (names unique, not "__metadata__") and writes the header.
 * metadata_json: NULL, or a JSON object of string values stored as "__metadata__". */
int rf_safetensors_writer_open(struct rf_safetensors_writer *w, const char *path, int n,
                               const struct rf_safetensors_decl *decls, const char *metadata_json);
/* Appends `bytes` raw bytes: the rest of the current tensor, then the next ones in
 * declaration order (a piece may span tensors). Too many bytes is an error. */
int rf_safetensors_writer_write(struct rf_safetensors_writer *w, const void *buf, size_t bytes);
/* Appends `n` elements given as f32, converted to the current tensor's dtype
 * (F32, BF16, F16: round to nearest even); the n elements must not cross the end
 * of the current tensor. */
int rf_safetensors_writer_write_f32(struct rf_safetensors_writer *w, const float *x, int64_t n);
/* The tensor the next byte belongs to (n_tensors when all are complete). */
static inline int rf_safetensors_writer_current(const struct rf_safetensors_writer *w) { return w->cur; }
/* Checks that every tensor is complete, then fsyncs and renames into place. On
 * failure (or after abort) the destination is unchanged. Frees the writer. */
int rf_safetensors_writer_commit(struct rf_safetensors_writer *w);
void rf_safetensors_writer_abort(struct rf_safetensors_writer *w);

#endif
