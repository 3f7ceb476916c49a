/* Atomic file writing (temporary name, fsync, rename, directory fsync) and
 * whole-file reading. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

int rf_file_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) RF_FAIL("%s: cannot open directory to sync it: %s", dir, strerror(errno));
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0 && err != EINVAL) RF_FAIL("%s: fsync of the directory failed: %s", dir, strerror(err));
  return 0;
}

/* The directory that holds `path` ("." for a bare name), into `out`. */
static void rf_file_dir_of(const char *path, char *out, size_t cap) {
  char tmp[RF_FILE_PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  snprintf(out, cap, "%s", dirname(tmp));
}

int rf_file_writer_open(struct rf_file_writer *w, const char *path) {
  memset(w, 0, sizeof *w);
  w->fd = -1;
  if (strlen(path) + 32 >= sizeof w->tmp) RF_FAIL("%s: path too long", path);
  snprintf(w->path, sizeof w->path, "%s", path);
  snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", path, (long)getpid());
  w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) RF_FAIL("%s: cannot create %s: %s", path, w->tmp, strerror(errno));
  return 0;
}

int rf_file_writer_pwrite(struct rf_file_writer *w, const void *buf, size_t bytes, uint64_t offset) {
  const uint8_t *p = buf;
  while (bytes > 0) {
    ssize_t n = pwrite(w->fd, p, bytes, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      RF_FAIL("%s: write failed at byte %llu: %s", w->tmp, (unsigned long long)offset, strerror(errno));
    p += n;
    bytes -= (size_t)n;
    offset += (uint64_t)n;
  }
  return 0;
}

int rf_file_writer_write(struct rf_file_writer *w, const void *buf, size_t bytes) {
  RF_TRY(rf_file_writer_pwrite(w, buf, bytes, w->bytes));
  w->bytes += bytes;
  return 0;
}

int rf_file_writer_commit(struct rf_file_writer *w) {
  RF_ASSERT(w->fd >= 0);
  if (fsync(w->fd) != 0) {
    int err = errno;
    rf_file_writer_abort(w);
    RF_FAIL("%s: fsync failed: %s", w->tmp, strerror(err));
  }
  if (close(w->fd) != 0) {
    int err = errno;
    w->fd = -1;
    rf_file_writer_abort(w);
    RF_FAIL("%s: close failed: %s", w->tmp, strerror(err));
  }
  w->fd = -1;
  if (rename(w->tmp, w->path) != 0) {
    int err = errno;
    rf_file_writer_abort(w);
    RF_FAIL("%s: rename from %s failed: %s", w->path, w->tmp, strerror(err));
  }
  char dir[RF_FILE_PATH_MAX];
  rf_file_dir_of(w->path, dir, sizeof dir);
  return rf_file_fsync_dir(dir);
}

void rf_file_writer_abort(struct rf_file_writer *w) {
  if (w->fd >= 0) close(w->fd);
  w->fd = -1;
  if (w->tmp[0]) unlink(w->tmp);
}

int rf_file_write_all(const char *path, const void *buf, size_t bytes) {
  struct rf_file_writer w;
  RF_TRY(rf_file_writer_open(&w, path));
  if (rf_file_writer_write(&w, buf, bytes) != 0) {
    rf_file_writer_abort(&w);
    return -1;
  }
  return rf_file_writer_commit(&w);
}

int rf_file_read_all(const char *path, char **out, size_t *bytes) {
  *out = NULL;
  *bytes = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) RF_FAIL("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    RF_FAIL("%s: cannot stat: %s", path, strerror(err));
  }
  size_t n = (size_t)st.st_size;
  char *buf = rf_xmalloc(n + 1);
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      close(fd);
      free(buf);
      RF_FAIL("%s: read failed after %zu of %zu bytes: %s", path, got, n,
              r < 0 ? strerror(err) : "end of file");
    }
    got += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  *out = buf;
  *bytes = n;
  return 0;
}

int rf_file_pread_all(int fd, void *buf, size_t bytes, uint64_t offset, const char *path) {
  uint8_t *p = buf;
  while (bytes > 0) {
    ssize_t n = pread(fd, p, bytes, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) RF_FAIL("%s: read failed at byte %llu: %s", path, (unsigned long long)offset, strerror(errno));
    if (n == 0) RF_FAIL("%s: truncated: end of file at byte %llu", path, (unsigned long long)offset);
    p += n;
    bytes -= (size_t)n;
    offset += (uint64_t)n;
  }
  return 0;
}
