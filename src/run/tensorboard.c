/* TensorBoard scalars: one event file in TensorBoard's record format.
 *
 * A record is (little-endian) a u64 length, the masked CRC32C of those 8 bytes, the
 * data, and the masked CRC32C of the data (TFRecord; mask(c) = rotate-right-15(c) +
 * 0xa282ead8). The data is an Event protobuf (tensorflow/core/util/event.proto):
 *   1 wall_time double, 2 step int64, 3 file_version string, 5 summary Summary;
 *   Summary: 1 value (repeated) Summary.Value; Summary.Value: 1 tag string, 2 simple_value float.
 * The first record is the file version "brain.Event:2" at step 0; then one Event per
 * written step with all of its scalars. The encoder writes only those fields, in field
 * order; the resume scan reads any Event whose step field it can find. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "run/run.h"

#define RF_TB_VERSION "brain.Event:2"
#define RF_TB_RECORD_MAX (1u << 20) /* bytes of one Event: far above any step's scalars */

struct rf_run_tensorboard {
  int fd;
  char path[RF_FILE_PATH_MAX];
  uint8_t *buf; /* owned: one record being built */
  size_t cap;
};

/* CRC32C (Castagnoli, reflected polynomial 0x82f63b78), table-driven. */
static uint32_t rf_tb_crc32c(const uint8_t *p, size_t n) {
  static uint32_t table[256];
  static int ready;
  if (!ready) {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      table[i] = c;
    }
    ready = 1;
  }
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t rf_run_tensorboard_crc32c(const void *data, size_t n) { return rf_tb_crc32c(data, n); }

static uint32_t rf_tb_masked(const uint8_t *p, size_t n) {
  uint32_t c = rf_tb_crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void rf_tb_le(uint8_t *out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t rf_tb_get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* ---- a tiny protobuf encoder into tb->buf ---- */
struct rf_tb_enc {
  uint8_t *p;
  size_t n, cap;
};

static int rf_tb_put(struct rf_tb_enc *e, const void *bytes, size_t n) {
  if (e->n + n > e->cap) return -1;
  memcpy(e->p + e->n, bytes, n);
  e->n += n;
  return 0;
}

static int rf_tb_varint(struct rf_tb_enc *e, uint64_t v) {
  uint8_t b[10];
  int n = 0;
  do {
    b[n] = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v) b[n] |= 0x80;
    n++;
  } while (v);
  return rf_tb_put(e, b, (size_t)n);
}

static size_t rf_tb_varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static int rf_tb_key(struct rf_tb_enc *e, int field, int wire) {
  return rf_tb_varint(e, (uint64_t)(field << 3 | wire));
}

static int rf_tb_bytes_field(struct rf_tb_enc *e, int field, const void *bytes, size_t n) {
  if (rf_tb_key(e, field, 2) || rf_tb_varint(e, n)) return -1;
  return rf_tb_put(e, bytes, n);
}

/* The bytes of one Summary.Value {tag, simple_value}. */
static size_t rf_tb_value_len(const char *tag) {
  size_t t = strlen(tag);
  return 1 + rf_tb_varint_len(t) + t + 1 + 4;
}

/* Event {wall_time, step, file_version | summary}: into e. */
static int rf_tb_event(struct rf_tb_enc *e, double wall_time, int64_t step, const char *version, int n,
                       const char *const *tags, const double *values) {
  uint8_t w[8];
  uint64_t bits;
  memcpy(&bits, &wall_time, sizeof bits);
  rf_tb_le(w, bits, 8);
  if (rf_tb_key(e, 1, 1) || rf_tb_put(e, w, 8)) return -1;
  if (step != 0 && (rf_tb_key(e, 2, 0) || rf_tb_varint(e, (uint64_t)step))) return -1;
  if (version) return rf_tb_bytes_field(e, 3, version, strlen(version));
  size_t summary = 0;
  for (int i = 0; i < n; i++) {
    size_t v = rf_tb_value_len(tags[i]);
    summary += 1 + rf_tb_varint_len(v) + v;
  }
  if (rf_tb_key(e, 5, 2) || rf_tb_varint(e, summary)) return -1;
  for (int i = 0; i < n; i++) {
    if (rf_tb_key(e, 1, 2) || rf_tb_varint(e, rf_tb_value_len(tags[i]))) return -1;
    if (rf_tb_bytes_field(e, 1, tags[i], strlen(tags[i]))) return -1;
    float f = (float)values[i];
    uint32_t fb;
    memcpy(&fb, &f, sizeof fb);
    uint8_t fbytes[4];
    rf_tb_le(fbytes, fb, 4);
    if (rf_tb_key(e, 2, 5) || rf_tb_put(e, fbytes, 4)) return -1;
  }
  return 0;
}

/* Appends e's bytes as one record (header, data, footer) with one write. */
static int rf_tb_append(struct rf_run_tensorboard *tb, size_t data_bytes) {
  uint8_t *rec = tb->buf; /* [12 header][data][4 footer]; the data was encoded at rec + 12 */
  rf_tb_le(rec, data_bytes, 8);
  rf_tb_le(rec + 8, rf_tb_masked(rec, 8), 4);
  rf_tb_le(rec + 12 + data_bytes, rf_tb_masked(rec + 12, data_bytes), 4);
  size_t n = 16 + data_bytes, done = 0;
  while (done < n) {
    ssize_t w = write(tb->fd, rec + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) RF_FAIL("%s: cannot write the TensorBoard event file: %s", tb->path, strerror(errno));
    done += (size_t)w;
  }
  return 0;
}

static int rf_tb_write_event(struct rf_run_tensorboard *tb, double wall_time, int64_t step,
                             const char *version, int n, const char *const *tags, const double *values) {
  struct rf_tb_enc e = {.p = tb->buf + 12, .n = 0, .cap = tb->cap - 16};
  if (rf_tb_event(&e, wall_time, step, version, n, tags, values) != 0)
    RF_FAIL("%s: a TensorBoard event of step %lld is over %u bytes", tb->path, (long long)step,
            RF_TB_RECORD_MAX);
  return rf_tb_append(tb, e.n);
}

/* The step of an Event's bytes (0 when absent, as protobuf reads it); -1 when the
 * bytes are not a protobuf message this scan can walk. */
static int64_t rf_tb_event_step(const uint8_t *p, size_t n) {
  size_t i = 0;
  int64_t step = 0;
  while (i < n) {
    uint64_t key = 0;
    int shift = 0;
    do {
      if (i >= n || shift > 63) return -1;
      key |= (uint64_t)(p[i] & 0x7f) << shift;
      shift += 7;
    } while (p[i++] & 0x80);
    uint64_t v = 0;
    switch (key & 7) {
      case 0:
        shift = 0;
        do {
          if (i >= n || shift > 63) return -1;
          v |= (uint64_t)(p[i] & 0x7f) << shift;
          shift += 7;
        } while (p[i++] & 0x80);
        if ((key >> 3) == 2) step = (int64_t)v;
        break;
      case 1:
        i += 8;
        break;
      case 5:
        i += 4;
        break;
      case 2:
        shift = 0;
        do {
          if (i >= n || shift > 63) return -1;
          v |= (uint64_t)(p[i] & 0x7f) << shift;
          shift += 7;
        } while (p[i++] & 0x80);
        if (v > n - i) return -1;
        i += v;
        break;
      default:
        return -1;
    }
  }
  return i == n ? step : -1;
}

/* Reads the records of fd from the start; *keep = the byte offset after the last record
 * to keep (each whole and valid, its step <= resume_step). A file whose first record is
 * not TensorBoard's file version is refused: it is not ours to cut. */
static int rf_tb_scan(struct rf_run_tensorboard *tb, int64_t resume_step, off_t *keep, int *dropped) {
  *keep = 0;
  *dropped = 0;
  off_t at = 0;
  int first = 1;
  for (;;) {
    uint8_t head[12];
    ssize_t r = pread(tb->fd, head, sizeof head, at);
    if (r == 0) return 0;
    if (r != (ssize_t)sizeof head || (uint32_t)rf_tb_get_le(head + 8, 4) != rf_tb_masked(head, 8)) break;
    uint64_t len = rf_tb_get_le(head, 8);
    if (len > tb->cap - 16) break;
    r = pread(tb->fd, tb->buf, (size_t)len + 4, at + 12);
    if (r != (ssize_t)len + 4 ||
        (uint32_t)rf_tb_get_le(tb->buf + len, 4) != rf_tb_masked(tb->buf, (size_t)len))
      break;
    int64_t step = rf_tb_event_step(tb->buf, (size_t)len);
    if (first) {
      static const uint8_t version[] = {0x1a, sizeof RF_TB_VERSION - 1};
      const uint8_t *v = memmem(tb->buf, (size_t)len, version, sizeof version);
      if (step != 0 || !v || (size_t)(v - tb->buf) + 2 + sizeof RF_TB_VERSION - 1 > len ||
          memcmp(v + 2, RF_TB_VERSION, sizeof RF_TB_VERSION - 1) != 0)
        RF_FAIL(
            "%s: not a TensorBoard event file written by rfsdp (its first record is not the file version "
            "\"%s\"); remove it or choose another --tensorboard folder",
            tb->path, RF_TB_VERSION);
      first = 0;
    } else if (step < 0 || step > resume_step) {
      break;
    }
    at += 16 + (off_t)len;
    *keep = at;
  }
  if (first)
    RF_FAIL(
        "%s: not a TensorBoard event file (no valid first record); remove it or choose another "
        "--tensorboard folder",
        tb->path);
  struct stat st;
  if (fstat(tb->fd, &st) == 0 && st.st_size > *keep) *dropped = 1;
  return 0;
}

int rf_run_tensorboard_open(struct rf_run_tensorboard **out, const char *dir) {
  *out = NULL;
  if (!dir || !*dir) RF_FAIL("rf_run_tensorboard_open: the folder is missing");
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    RF_FAIL("%s: cannot create the folder: %s", dir, strerror(errno));
  struct rf_run_tensorboard *tb = rf_xcalloc(1, sizeof *tb);
  tb->fd = -1;
  tb->cap = RF_TB_RECORD_MAX + 16;
  tb->buf = rf_xmalloc(tb->cap);
  int n = snprintf(tb->path, sizeof tb->path, "%s/%s", dir, RF_RUN_TENSORBOARD_FILE);
  if (n < 0 || (size_t)n >= sizeof tb->path) {
    rf_run_tensorboard_close(tb);
    RF_FAIL("%s: the folder's path is too long", dir);
  }
  tb->fd = open(tb->path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (tb->fd < 0) {
    int e = errno;
    rf_run_tensorboard_close(tb);
    RF_FAIL("%s/%s: cannot open the TensorBoard event file: %s", dir, RF_RUN_TENSORBOARD_FILE, strerror(e));
  }
  off_t keep = 0;
  int dropped = 0;
  struct stat st;
  if (fstat(tb->fd, &st) == 0 && st.st_size > 0 && rf_tb_scan(tb, INT64_MAX, &keep, &dropped) != 0) {
    rf_run_tensorboard_close(tb);
    return -1;
  }
  *out = tb;
  return 0;
}

int rf_run_tensorboard_begin(struct rf_run_tensorboard *tb, int64_t resume_step, double wall_time) {
  if (!tb) RF_FAIL("rf_run_tensorboard_begin: the writer is missing");
  off_t keep = 0;
  int dropped = 0;
  struct stat st;
  if (resume_step >= 0 && fstat(tb->fd, &st) == 0 && st.st_size > 0 &&
      rf_tb_scan(tb, resume_step, &keep, &dropped) != 0)
    return -1;
  if (ftruncate(tb->fd, keep) != 0 || lseek(tb->fd, keep, SEEK_SET) != keep)
    RF_FAIL("%s: cannot cut the TensorBoard event file: %s", tb->path, strerror(errno));
  if (dropped)
    rf_log(RF_LOG_LEVEL_INFO, "%s: the steps after %lld (written after the checkpoint resumed from) removed",
           tb->path, (long long)resume_step);
  if (keep == 0) return rf_tb_write_event(tb, wall_time, 0, RF_TB_VERSION, 0, NULL, NULL);
  return 0;
}

int rf_run_tensorboard_scalars(struct rf_run_tensorboard *tb, int64_t step, double wall_time, int n,
                               const char *const *tags, const double *values) {
  if (!tb || n < 0 || (n > 0 && (!tags || !values)))
    RF_FAIL("rf_run_tensorboard_scalars: %s", !tb ? "the writer is missing" : "tags or values missing");
  if (step < 1) RF_FAIL("%s: step %lld: TensorBoard steps start at 1 here", tb->path, (long long)step);
  for (int i = 0; i < n; i++)
    if (!tags[i] || !*tags[i]) RF_FAIL("%s: scalar %d of step %lld has no tag", tb->path, i, (long long)step);
  return rf_tb_write_event(tb, wall_time, step, NULL, n, tags, values);
}

void rf_run_tensorboard_close(struct rf_run_tensorboard *tb) {
  if (!tb) return;
  if (tb->fd >= 0) close(tb->fd);
  free(tb->buf);
  free(tb);
}
