/* rf-test: timeout=240
 * TensorBoard scalars (src/run/tensorboard.c, `rfsdp train --tensorboard`), against
 * TensorBoard's own reader:
 *  - CRC32C against the published check values (RFC 3720 B.4: 32 zeros, 32 0xff,
 *    "123456789");
 *  - a fixed run (steps 1..6, five tags, val/loss on steps 3 and 6) and a resumed one
 *    (steps 1..8 written, resumed at step 5, steps 6..9 written again with other
 *    values) written by this build equal byte for byte the committed event files of
 *    tests/data/tensorboard/, and tests/data/tensorboard/ref.json, what TensorBoard's
 *    EventFileLoader and EventAccumulator read from those files (tests/ref_tensorboard.py,
 *    tensorboard from PyPI), holds exactly the steps, wall times, tags and f32 values
 *    written: in the resumed file every step 1..9 once, 6..9 with the second run's values;
 *  - a torn last record (a crash mid-write) is cut at the next resume; a file of that
 *    name that is not TensorBoard's is refused naming it, its bytes unchanged;
 *  - `rfsdp train --tensorboard` at W = 2, then resumed at W = 3 from its step-3
 *    checkpoint into the same folder: the event file holds steps 1..8 once each, the
 *    losses and grad norms those of the JSONL logs (as f32), the tags named.
 * `test_tensorboard --write-ref DIR` writes the two synthetic files into DIR/fixed and
 * DIR/resumed (tests/ref_tensorboard.py runs it). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "rfsdp_run.h"

#define MAX_EVENTS 64
#define MAX_VALUES 16

/* One Event as an independent reader sees it. */
struct event {
  double wall_time;
  int64_t step;
  int version; /* the file version record */
  int n;
  char tag[MAX_VALUES][64];
  float value[MAX_VALUES];
};

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static uint32_t masked(const uint8_t *p, size_t n) {
  uint32_t c = rf_run_tensorboard_crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static int varint(const uint8_t *p, size_t n, size_t *i, uint64_t *v) {
  *v = 0;
  for (int shift = 0; *i < n && shift < 64; shift += 7) {
    uint8_t b = p[(*i)++];
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* Summary.Value {1 tag, 2 simple_value}. */
static int parse_value(const uint8_t *p, size_t n, struct event *e) {
  size_t i = 0;
  if (e->n >= MAX_VALUES) return -1;
  while (i < n) {
    uint64_t key, len;
    if (varint(p, n, &i, &key)) return -1;
    if (key == (1 << 3 | 2)) {
      if (varint(p, n, &i, &len) || len > n - i || len >= sizeof e->tag[0]) return -1;
      memcpy(e->tag[e->n], p + i, len);
      e->tag[e->n][len] = 0;
      i += len;
    } else if (key == (2 << 3 | 5)) {
      if (n - i < 4) return -1;
      uint32_t bits = (uint32_t)get_le(p + i, 4);
      memcpy(&e->value[e->n], &bits, 4);
      i += 4;
    } else {
      return -1;
    }
  }
  e->n++;
  return 0;
}

static int parse_event(const uint8_t *p, size_t n, struct event *e) {
  memset(e, 0, sizeof *e);
  size_t i = 0;
  while (i < n) {
    uint64_t key, v, len;
    if (varint(p, n, &i, &key)) return -1;
    switch (key) {
      case 1 << 3 | 1:
        if (n - i < 8) return -1;
        v = get_le(p + i, 8);
        memcpy(&e->wall_time, &v, 8);
        i += 8;
        break;
      case 2 << 3 | 0:
        if (varint(p, n, &i, &v)) return -1;
        e->step = (int64_t)v;
        break;
      case 3 << 3 | 2:
        if (varint(p, n, &i, &len) || len > n - i) return -1;
        e->version = len == 13 && memcmp(p + i, "brain.Event:2", 13) == 0;
        i += len;
        break;
      case 5 << 3 | 2: {
        if (varint(p, n, &i, &len) || len > n - i) return -1;
        size_t end = i + len;
        while (i < end) {
          uint64_t k2, l2;
          if (varint(p, end, &i, &k2) || k2 != (1 << 3 | 2) || varint(p, end, &i, &l2) || l2 > end - i)
            return -1;
          if (parse_value(p + i, l2, e)) return -1;
          i += l2;
        }
        break;
      }
      default:
        return -1;
    }
  }
  return 0;
}

/* Reads every record of path with its CRCs checked; -1 on a bad record. */
static int read_events(const char *path, struct event *ev, int cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  int n = 0;
  uint8_t head[12], buf[4096];
  while (fread(head, 1, 12, f) == 12) {
    uint64_t len = get_le(head, 8);
    if ((uint32_t)get_le(head + 8, 4) != masked(head, 8) || len + 4 > sizeof buf || n >= cap ||
        fread(buf, 1, len + 4, f) != len + 4 || (uint32_t)get_le(buf + len, 4) != masked(buf, len) ||
        parse_event(buf, len, &ev[n]) != 0) {
      fclose(f);
      return -1;
    }
    n++;
  }
  fclose(f);
  return n;
}

static const char *tags[] = {"train/loss", "train/grad_norm", "train/lr", "perf/tokens_per_s", "val/loss"};

/* The synthetic scalars of step s of segment `seg` (values of every magnitude; f32 rounding on the way). */
static void fixed_values(int seg, int64_t s, double *v) {
  v[0] = 5.5 - 0.37 * (double)s + 0.01 * seg;
  v[1] = 1.0 / (double)(s + 2) + seg;
  v[2] = 3e-3 * (double)s / 7.0;
  v[3] = 12345.678 * (double)s;
  v[4] = 4.75 - 0.11 * (double)s;
}

static double fixed_wall(int seg, int64_t s) { return 1.7e9 + 60.0 * seg + 0.25 * (double)s; }

static void write_steps(struct rf_run_tensorboard *tb, int seg, int64_t from, int64_t to) {
  for (int64_t s = from; s <= to; s++) {
    double v[5];
    fixed_values(seg, s, v);
    int n = s % 3 == 0 ? 5 : 4;
    RF_CHECK(rf_run_tensorboard_scalars(tb, s, fixed_wall(seg, s), n, tags, v) == 0, "step %lld: %s",
             (long long)s, rf_error_msg());
  }
}

static int write_fixed(const char *dir) {
  struct rf_run_tensorboard *tb;
  if (rf_run_tensorboard_open(&tb, dir) != 0 || rf_run_tensorboard_begin(tb, -1, fixed_wall(0, 0)) != 0)
    return -1;
  write_steps(tb, 0, 1, 6);
  rf_run_tensorboard_close(tb);
  return 0;
}

static int write_resumed(const char *dir) {
  struct rf_run_tensorboard *tb;
  if (rf_run_tensorboard_open(&tb, dir) != 0 || rf_run_tensorboard_begin(tb, -1, fixed_wall(0, 0)) != 0)
    return -1;
  write_steps(tb, 0, 1, 8);
  rf_run_tensorboard_close(tb);
  if (rf_run_tensorboard_open(&tb, dir) != 0 || rf_run_tensorboard_begin(tb, 5, fixed_wall(1, 0)) != 0)
    return -1;
  write_steps(tb, 1, 6, 9);
  rf_run_tensorboard_close(tb);
  return 0;
}

/* What the file should hold: steps first..last of the segments as written. */
static void check_events(const char *what, const struct event *ev, int n, int last, int resumed_from) {
  RF_CHECK(n == last + 1, "%s: %d events, expected %d (the version and steps 1..%d)", what, n, last + 1,
           last);
  if (n != last + 1) return;
  RF_CHECK(ev[0].version && ev[0].step == 0 && ev[0].wall_time == fixed_wall(0, 0), "%s: first event", what);
  for (int s = 1; s <= last; s++) {
    int seg = resumed_from > 0 && s > resumed_from;
    double v[5];
    fixed_values(seg, s, v);
    const struct event *e = &ev[s];
    int want = s % 3 == 0 ? 5 : 4;
    RF_CHECK(e->step == s && e->wall_time == fixed_wall(seg, s) && e->n == want,
             "%s: event %d: step %lld n %d", what, s, (long long)e->step, e->n);
    for (int i = 0; i < e->n && i < want; i++)
      RF_CHECK(strcmp(e->tag[i], tags[i]) == 0 && e->value[i] == (float)v[i],
               "%s step %d: %s = %.9g, wrote %.9g", what, s, e->tag[i], (double)e->value[i], v[i]);
  }
}

/* ref.json (TensorBoard's reading of the committed files) against the values written. */
static void check_reference(const char *json_path) {
  FILE *f = fopen(json_path, "rb");
  RF_CHECK(f != NULL, "%s: missing (tests/ref_tensorboard.py writes it)", json_path);
  if (!f) return;
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  cJSON *root = cJSON_Parse(text);
  RF_CHECK(root != NULL, "%s: not JSON", json_path);
  const char *names[] = {"fixed", "resumed"};
  for (int k = 0; k < 2 && root; k++) {
    const cJSON *events = cJSON_GetObjectItem(cJSON_GetObjectItem(root, names[k]), "events");
    struct event ev[MAX_EVENTS];
    int m = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
      if (m >= MAX_EVENTS) break;
      memset(&ev[m], 0, sizeof ev[m]);
      ev[m].wall_time = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "wall_time"));
      ev[m].step = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(e, "step"));
      const cJSON *fv = cJSON_GetObjectItem(e, "file_version");
      ev[m].version = cJSON_IsString(fv) && strcmp(fv->valuestring, "brain.Event:2") == 0;
      const cJSON *v;
      cJSON_ArrayForEach(v, cJSON_GetObjectItem(e, "values")) {
        if (ev[m].n >= MAX_VALUES) break;
        snprintf(ev[m].tag[ev[m].n], sizeof ev[m].tag[0], "%s",
                 cJSON_GetStringValue(cJSON_GetObjectItem(v, "tag")));
        ev[m].value[ev[m].n++] = (float)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "simple_value"));
      }
      m++;
    }
    char what[64];
    snprintf(what, sizeof what, "TensorBoard's reading of %s", names[k]);
    check_events(what, ev, m, k ? 9 : 6, k ? 5 : 0);
    /* EventAccumulator (the directory as TensorBoard's UI loads it): every step once per tag */
    const cJSON *acc = cJSON_GetObjectItem(cJSON_GetObjectItem(root, names[k]), "accumulator");
    const cJSON *loss = cJSON_GetObjectItem(acc, "train/loss");
    int steps = cJSON_GetArraySize(loss);
    RF_CHECK(steps == (k ? 9 : 6), "%s: the accumulator has %d train/loss points", what, steps);
    for (int i = 0; i < steps; i++) {
      const cJSON *pt = cJSON_GetArrayItem(loss, i);
      double v[5];
      fixed_values(k && i + 1 > 5, i + 1, v);
      RF_CHECK(cJSON_GetNumberValue(cJSON_GetArrayItem(pt, 0)) == i + 1 &&
                   (float)cJSON_GetNumberValue(cJSON_GetArrayItem(pt, 1)) == (float)v[0],
               "%s: accumulator point %d", what, i);
    }
  }
  cJSON_Delete(root);
}

static void check_synthetic(const char *tmp) {
  char a[512], b[512], pa[600], pb[600];
  /* CRC32C check values (RFC 3720, B.4) */
  uint8_t buf[32];
  memset(buf, 0, sizeof buf);
  RF_CHECK(rf_run_tensorboard_crc32c(buf, 32) == 0x8a9136aau, "crc32c of 32 zeros");
  memset(buf, 0xff, sizeof buf);
  RF_CHECK(rf_run_tensorboard_crc32c(buf, 32) == 0x62a8ab43u, "crc32c of 32 0xff");
  RF_CHECK(rf_run_tensorboard_crc32c("123456789", 9) == 0xe3069283u, "crc32c of 123456789");

  const char *names[] = {"fixed", "resumed"};
  for (int k = 0; k < 2; k++) {
    snprintf(a, sizeof a, "%s/%s", tmp, names[k]);
    RF_CHECK((k ? write_resumed(a) : write_fixed(a)) == 0, "%s: %s", names[k], rf_error_msg());
    snprintf(pa, sizeof pa, "%s/%s", a, RF_RUN_TENSORBOARD_FILE);
    snprintf(b, sizeof b, "tests/data/tensorboard/%s", names[k]);
    snprintf(pb, sizeof pb, "%s/%s", b, RF_RUN_TENSORBOARD_FILE);
    RF_CHECK(rf_test_files_equal(pa, pb), "%s: %s differs from the committed %s", names[k], pa, pb);
    struct event ev[MAX_EVENTS];
    int n = read_events(pa, ev, MAX_EVENTS);
    check_events(names[k], ev, n, k ? 9 : 6, k ? 5 : 0);
  }
  check_reference("tests/data/tensorboard/ref.json");

  /* a torn last record: cut at the next resume (step 9 of the resumed file is torn: 8 remain) */
  snprintf(pa, sizeof pa, "%s/resumed/%s", tmp, RF_RUN_TENSORBOARD_FILE);
  struct stat st;
  RF_CHECK(stat(pa, &st) == 0 && truncate(pa, st.st_size - 3) == 0, "cannot tear %s", pa);
  struct rf_run_tensorboard *tb;
  snprintf(a, sizeof a, "%s/resumed", tmp);
  RF_CHECK(rf_run_tensorboard_open(&tb, a) == 0 && rf_run_tensorboard_begin(tb, 9, 0) == 0, "torn: %s",
           rf_error_msg());
  rf_run_tensorboard_close(tb);
  struct event ev[MAX_EVENTS];
  int n = read_events(pa, ev, MAX_EVENTS);
  RF_CHECK(n == 9 && ev[8].step == 8, "torn: %d events readable after the cut, last step %lld", n,
           n > 0 ? (long long)ev[n - 1].step : -1LL);

  /* not TensorBoard's: refused, unchanged */
  snprintf(a, sizeof a, "%s/foreign", tmp);
  mkdir(a, 0777);
  snprintf(pa, sizeof pa, "%s/%s", a, RF_RUN_TENSORBOARD_FILE);
  FILE *f = fopen(pa, "wb");
  RF_ASSERT(f);
  fputs("these are not the records you are looking for\n", f);
  fclose(f);
  snprintf(pb, sizeof pb, "%s/copy", tmp);
  f = fopen(pb, "wb");
  RF_ASSERT(f);
  fputs("these are not the records you are looking for\n", f);
  fclose(f);
  tb = NULL;
  int rc = rf_run_tensorboard_open(&tb, a);
  RF_CHECK(rc != 0 && tb == NULL && strstr(rf_error_msg(), pa) && strstr(rf_error_msg(), "not a TensorBoard"),
           "foreign file: rc %d, message '%s'", rc, rf_error_msg());
  RF_CHECK(rf_test_files_equal(pa, pb), "foreign file changed");
}

/* rfsdp train --tensorboard at W=2, resumed at W=3 into the same folder. */
static void check_train(const char *tmp) {
  static char out[1 << 16];
  char data[256], model[256], tbdir[300], ck[300], log1[300], log2[300], from[400], path[400];
  int rc = rf_cli_setup_tiny(tmp, 1 << 16, data, sizeof data, model, sizeof model, out, sizeof out);
  RF_CHECK(rc == 0, "prepare: rc %d\n%s", rc, out);
  if (rc) return;
  snprintf(tbdir, sizeof tbdir, "%s/tb", tmp);
  snprintf(ck, sizeof ck, "%s/ck", tmp);
  snprintf(log1, sizeof log1, "%s/a.jsonl", tmp);
  snprintf(log2, sizeof log2, "%s/b.jsonl", tmp);
  const char *common = "--batch 6 --seq 16 --lr 3e-3 --seed 5 --peak-gflops 50 --print-every 0";
  rc = rf_cli_run_mpi(out, sizeof out, 2, 120,
                      "train --model %s --data %s %s --steps 6 --save-every 3 --ckpt-dir %s --log %s "
                      "--tensorboard %s --eval-every 3 --eval-batches 1",
                      model, data, common, ck, log1, tbdir);
  RF_CHECK(rc == 0, "W=2: rc %d\n%s", rc, out);
  snprintf(from, sizeof from, "%s/step-00000003", ck);
  rc = rf_cli_run_mpi(out, sizeof out, 3, 120,
                      "train --model %s --data %s %s --steps 8 --resume %s --log %s --tensorboard %s "
                      "--eval-every 3 --eval-batches 1",
                      model, data, common, from, log2, tbdir);
  RF_CHECK(rc == 0, "W=3 resumed: rc %d\n%s", rc, out);
  snprintf(path, sizeof path, "%s/%s", tbdir, RF_RUN_TENSORBOARD_FILE);
  struct event ev[MAX_EVENTS];
  int n = read_events(path, ev, MAX_EVENTS);
  RF_CHECK(n == 9, "the event file has %d records, expected the version and steps 1..8 once", n);
  double l1[8], l2[8], g1[8], g2[8];
  int n1 = rf_cli_log_field(log1, "\"loss\":", l1, 8), n2 = rf_cli_log_field(log2, "\"loss\":", l2, 8);
  rf_cli_log_field(log1, "\"grad_norm\":", g1, 8);
  rf_cli_log_field(log2, "\"grad_norm\":", g2, 8);
  RF_CHECK(n1 == 6 && n2 == 5, "logs: %d and %d steps", n1, n2);
  for (int s = 1; s < n && n == 9 && n1 == 6 && n2 == 5; s++) {
    double loss = s <= 3 ? l1[s - 1] : l2[s - 4], norm = s <= 3 ? g1[s - 1] : g2[s - 4];
    RF_CHECK(ev[s].step == s && strcmp(ev[s].tag[0], "train/loss") == 0 && ev[s].value[0] == (float)loss &&
                 strcmp(ev[s].tag[1], "train/grad_norm") == 0 && ev[s].value[1] == (float)norm,
             "step %d: event step %lld %s %.9g (log %.9g)", s, (long long)ev[s].step, ev[s].tag[0],
             (double)ev[s].value[0], loss);
    int has_val = ev[s].n > 0 && strcmp(ev[s].tag[ev[s].n - 1], "val/loss") == 0;
    RF_CHECK(has_val == (s % 3 == 0 || s == 8), "step %d: val/loss %s", s, has_val ? "present" : "absent");
  }
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--write-ref") == 0) {
    char a[512];
    snprintf(a, sizeof a, "%s/fixed", argv[2]);
    mkdir(argv[2], 0777);
    int rc = write_fixed(a);
    snprintf(a, sizeof a, "%s/resumed", argv[2]);
    rc |= write_resumed(a);
    if (rc) fprintf(stderr, "%s\n", rf_error_msg());
    return rc ? 1 : 0;
  }
  char tmp[] = "/tmp/rf_test_tensorboard.XXXXXX";
  RF_ASSERT(mkdtemp(tmp));
  check_synthetic(tmp);
  check_train(tmp);
  int rc = rf_test_finish("test_tensorboard");
  if (rc == 0) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  }
  return rc;
}
