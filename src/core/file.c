/* Atomic file writing (temporary name, fsync, rename, directory fsync), with
 * O_DIRECT through a bounce buffer where asked, and whole-file reading. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
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

static uint64_t rf_file_n_direct;      /* files committed with O_DIRECT (atomic) */
static int rf_file_refuse_direct_hook; /* rf_file_test_refuse_direct: 1 at open, 2 at the first write */

uint64_t rf_file_direct_files(void) { return __atomic_load_n(&rf_file_n_direct, __ATOMIC_RELAXED); }

void rf_file_test_refuse_direct(int refuse) {
  __atomic_store_n(&rf_file_refuse_direct_hook, refuse, __ATOMIC_RELAXED);
}

/* Removes the temporary files of `path` that a writer killed before its rename left
 * ("PATH.tmp.PID", PID a process that is gone; issue 37: a resumed run's re-save of
 * a step killed mid-write kept the killed run's rank files, the checkpoint's size
 * doubled). Only ours: the exact name with a number, never a live process's. */
static void rf_file_remove_stale(const char *path) {
  char dir[RF_FILE_PATH_MAX], tmp[RF_FILE_PATH_MAX];
  rf_file_dir_of(path, dir, sizeof dir);
  snprintf(tmp, sizeof tmp, "%s", path);
  const char *base = basename(tmp);
  size_t n = strlen(base);
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    const char *s = e->d_name;
    if (strncmp(s, base, n) != 0 || strncmp(s + n, ".tmp.", 5) != 0) continue;
    char *end = NULL;
    long pid = strtol(s + n + 5, &end, 10);
    if (end == s + n + 5 || *end || pid <= 0 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to know) */
    char stale[2 * RF_FILE_PATH_MAX + 8];
    snprintf(stale, sizeof stale, "%s/%s", dir, s);
    if (unlink(stale) == 0) rf_log_debug("%s: removed the temporary file of a writer that is gone", stale);
  }
  closedir(d);
}

/* The temporary file, opened with `flags` added; errno is open's on failure. */
static int rf_file_writer_create(struct rf_file_writer *w, const char *path, int flags) {
  rf_file_remove_stale(path);
  memset(w, 0, sizeof *w);
  w->fd = -1;
  if (strlen(path) + 32 >= sizeof w->tmp) RF_FAIL("%s: path too long", path);
  snprintf(w->path, sizeof w->path, "%s", path);
  snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", path, (long)getpid());
  if ((flags & O_DIRECT) && __atomic_load_n(&rf_file_refuse_direct_hook, __ATOMIC_RELAXED) == 1) {
    errno = EINVAL; /* as a filesystem without O_DIRECT answers */
    return -1;
  }
  w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | flags, 0644);
  return w->fd < 0 ? -1 : 0;
}

int rf_file_writer_open(struct rf_file_writer *w, const char *path) {
  if (rf_file_writer_create(w, path, 0) != 0)
    RF_FAIL("%s: cannot create %s: %s", path, w->tmp, strerror(errno));
  return 0;
}

int rf_file_writer_open_direct(struct rf_file_writer *w, const char *path, void *bounce, size_t bounce_cap) {
  RF_ASSERT(bounce && bounce_cap > 0 && bounce_cap % RF_FILE_DIRECT_ALIGN == 0 &&
            (uintptr_t)bounce % RF_FILE_DIRECT_ALIGN == 0);
  if (rf_file_writer_create(w, path, O_DIRECT) == 0) {
    w->direct = 1;
  } else {
    if (errno != EINVAL) RF_FAIL("%s: cannot create %s: %s", path, w->tmp, strerror(errno));
    rf_log_debug("%s: the filesystem refuses O_DIRECT; writing it buffered", path);
    RF_TRY(rf_file_writer_open(w, path));
  }
  w->bounce = bounce;
  w->bounce_cap = bounce_cap;
  return 0;
}

/* pwrite of all `bytes`; 0, or the errno of the failed write (EIO when none). */
static int rf_file_pwrite_fd(int fd, const uint8_t *p, size_t bytes, uint64_t offset) {
  while (bytes > 0) {
    ssize_t n = pwrite(fd, p, bytes, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    p += n;
    bytes -= (size_t)n;
    offset += (uint64_t)n;
  }
  return 0;
}

/* Stops writing with O_DIRECT (the tail under one block, or a filesystem that
 * refused it at the first write). */
static int rf_file_writer_end_direct(struct rf_file_writer *w) {
  int flags = fcntl(w->fd, F_GETFL);
  if (flags < 0 || fcntl(w->fd, F_SETFL, flags & ~O_DIRECT) != 0)
    RF_FAIL("%s: cannot turn O_DIRECT off: %s", w->tmp, strerror(errno));
  w->direct = 0;
  return 0;
}

/* Writes the bounce's first `len` bytes (whole blocks while direct) at `flushed`. */
static int rf_file_writer_flush(struct rf_file_writer *w, size_t len) {
  int refused = w->direct && __atomic_load_n(&rf_file_refuse_direct_hook, __ATOMIC_RELAXED) == 2; /* (hook) */
  int err = refused ? EINVAL : rf_file_pwrite_fd(w->fd, w->bounce, len, w->flushed);

  if (err == EINVAL && w->direct) { /* opened, but the filesystem takes no direct writes */
    rf_log_debug("%s: the filesystem refuses O_DIRECT writes; writing it buffered", w->path);
    RF_TRY(rf_file_writer_end_direct(w));
    err = rf_file_pwrite_fd(w->fd, w->bounce, len, w->flushed);
  }
  if (err != 0)
    RF_FAIL("%s: write failed at byte %llu: %s", w->tmp, (unsigned long long)w->flushed, strerror(err));
  w->flushed += len;
  return 0;
}

int rf_file_writer_pwrite(struct rf_file_writer *w, const void *buf, size_t bytes, uint64_t offset) {
  if (w->bounce) { /* only bytes not flushed yet */
    if (offset < w->flushed || offset + bytes > w->bytes)
      RF_FAIL("%s: cannot rewrite bytes [%llu, %llu): a direct writer rewrites only [%llu, %llu)", w->tmp,
              (unsigned long long)offset, (unsigned long long)(offset + bytes),
              (unsigned long long)w->flushed, (unsigned long long)w->bytes);
    memcpy(w->bounce + (offset - w->flushed), buf, bytes);
    return 0;
  }
  int err = rf_file_pwrite_fd(w->fd, buf, bytes, offset);
  if (err != 0)
    RF_FAIL("%s: write failed at byte %llu: %s", w->tmp, (unsigned long long)offset, strerror(err));
  return 0;
}

int rf_file_writer_write(struct rf_file_writer *w, const void *buf, size_t bytes) {
  if (!w->bounce) {
    RF_TRY(rf_file_writer_pwrite(w, buf, bytes, w->bytes));
    w->bytes += bytes;
    return 0;
  }
  const uint8_t *p = buf;
  while (bytes > 0) {
    size_t used = (size_t)(w->bytes - w->flushed);
    size_t n = bytes < w->bounce_cap - used ? bytes : w->bounce_cap - used;
    memcpy(w->bounce + used, p, n);
    w->bytes += n;
    p += n;
    bytes -= n;
    if (used + n == w->bounce_cap) RF_TRY(rf_file_writer_flush(w, w->bounce_cap));
  }
  return 0;
}

/* A direct writer's last bytes: the whole blocks with O_DIRECT, the rest buffered. */
static int rf_file_writer_drain(struct rf_file_writer *w) {
  size_t used = (size_t)(w->bytes - w->flushed);
  size_t whole = used / RF_FILE_DIRECT_ALIGN * RF_FILE_DIRECT_ALIGN;
  if (whole > 0) RF_TRY(rf_file_writer_flush(w, whole));
  if (used == whole) return 0;
  int direct = w->direct;
  if (direct) RF_TRY(rf_file_writer_end_direct(w));
  w->direct = direct; /* (still counted as a direct file) */
  int err = rf_file_pwrite_fd(w->fd, w->bounce + whole, used - whole, w->flushed);
  if (err != 0)
    RF_FAIL("%s: write failed at byte %llu: %s", w->tmp, (unsigned long long)w->flushed, strerror(err));
  w->flushed += used - whole;
  return 0;
}

int rf_file_writer_commit(struct rf_file_writer *w) {
  RF_ASSERT(w->fd >= 0);
  if (w->bounce && rf_file_writer_drain(w) != 0) {
    rf_file_writer_abort(w);
    return -1;
  }
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
  if (w->direct) __atomic_fetch_add(&rf_file_n_direct, 1, __ATOMIC_RELAXED);
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
