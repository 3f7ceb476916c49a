/* cuda-emu's NCCL (include/nccl.h) over MPI, on the CPU.
 *
 * Communicators: ncclGetUniqueId writes the creating process's MPI_COMM_WORLD rank and a
 * nonce into the id; ncclCommInitRank sends (rank, world rank) to that process, which
 * must be a member (rfsdp's rank 0 makes the ids), gets back every member's world
 * rank, and makes an MPI communicator of them in NCCL rank order
 * (MPI_Comm_create_group: collective over the members only, as ncclCommInitRank is).
 * MPI must run with MPI_THREAD_MULTIPLE: collectives run on the streams' worker threads
 * (each stream its own), while the program's own MPI calls go on in its threads.
 *
 * Operations: checked when called, as NCCL checks them (a refusal returns the error and
 * says why on stderr; ncclGetLastError repeats it): buffers must be device memory
 * inside one live allocation (host memory is refused, as NCCL refuses unregistered
 * host memory); in place only in NCCL's shapes -- an all-gather's sendbuff is
 * recvbuff + rank * count, a reduce-scatter's recvbuff is sendbuff + rank * recvcount,
 * the others sendbuff == recvbuff -- any other overlap is refused; the stream belongs to
 * the communicator's device; a communicator finalized, aborted or destroyed takes
 * nothing. Then queued on the stream: each communicator's operations run in the order
 * they were called (an operation waits for the previous one of its communicator, on
 * whatever stream), each as MPI calls on the communicator's own MPI communicator.
 * Reductions gather every rank's data and reduce in rank order, each step of bf16 and
 * f16 computed in f32 and rounded to the type (as NCCL's ring rounds each step). A group (ncclGroupStart/End)
 * queues its operations at the outermost ncclGroupEnd, one unit per communicator and stream: its collectives
 * in order, then its sends and receives all posted at once (MPI_Isend/Irecv, waited together), so a group of
 * send/receive pairs never deadlocks.
 *
 * Failures: RF_EMU_NCCL_FAIL=K makes the K-th operation of this process fail as a
 * broken link does: it never completes, ncclCommGetAsyncError reports ncclSystemError,
 * and only ncclCommAbort releases the stream. RF_EMU_NCCL_HANG=K makes it hang as one
 * whose peer stopped does: it never completes and nothing reports an error (only
 * ncclCommAbort releases the stream). ncclCommFinalize waits for every queued
 * operation; ncclCommDestroy is refused before ncclCommFinalize (unless aborted) and
 * frees the MPI communicator. */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <vector>

#include "emu.h"
#include "nccl.h"

#define RF_EMU_NCCL_MAGIC "rf-emu-nccl-id"

struct rf_emu_nccl_comm {
  MPI_Comm mpi;
  int rank, nranks, device;
  std::atomic<int> async_error;
  std::atomic<int> aborted;
  int finalized;
  uint64_t issued, done; /* units queued, finished (g_mu) */
};

namespace {

std::mutex g_mu;
std::condition_variable g_done;
std::set<ncclComm_t> g_live;
std::atomic<uint64_t> g_ops{0};
__thread char tls_last[1024];

ncclResult_t refuse(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t refuse(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_last, sizeof tls_last, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuda-emu: NCCL: %s (%s)\n", tls_last, ncclGetErrorString(r));
  return r;
}

struct nccl_id {
  char magic[16];
  int creator; /* MPI_COMM_WORLD rank */
  uint64_t nonce;
};

enum kind { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_SEND, K_RECV };
const char *kind_name(kind k) {
  static const char *names[] = {"ncclAllReduce",     "ncclBroadcast", "ncclReduce", "ncclAllGather",
                                "ncclReduceScatter", "ncclSend",      "ncclRecv"};
  return names[k];
}

struct nccl_op {
  kind k;
  const char *send; /* the stand-in's views */
  char *recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int peer; /* root, or peer */
  ncclComm_t comm;
  rf_emu::stream *s;
  uint64_t number; /* 1-based, in this process */
};

__thread int tls_group_depth;
__thread std::vector<nccl_op> *tls_group;

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

template <typename T>
T apply(ncclRedOp_t op, T a, T b) {
  switch (op) {
    case ncclSum:
    case ncclAvg:
      return a + b;
    case ncclProd:
      return a * b;
    case ncclMax:
      return b > a ? b : a;
    case ncclMin:
      return b < a ? b : a;
    default:
      return a;
  }
}

float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* dst[i] = op over r of src + r * stride, in rank order */
template <typename T>
void reduce_typed(void *dst, const char *src, size_t stride, int n, size_t count, ncclRedOp_t op) {
  for (size_t i = 0; i < count; i++) {
    T acc, x;
    memcpy(&acc, src + i * sizeof(T), sizeof acc);
    for (int r = 1; r < n; r++) {
      memcpy(&x, src + (size_t)r * stride + i * sizeof(T), sizeof x);
      acc = apply(op, acc, x);
    }
    if (op == ncclAvg) acc = (T)(acc / (T)n);
    memcpy((char *)dst + i * sizeof(T), &acc, sizeof acc);
  }
}

void reduce(char *dst, const char *src, size_t stride, int n, size_t count, ncclDataType_t t,
            ncclRedOp_t op) {
  switch (t) {
    case ncclInt8:
      return reduce_typed<int8_t>(dst, src, stride, n, count, op);
    case ncclUint8:
      return reduce_typed<uint8_t>(dst, src, stride, n, count, op);
    case ncclInt32:
      return reduce_typed<int32_t>(dst, src, stride, n, count, op);
    case ncclUint32:
      return reduce_typed<uint32_t>(dst, src, stride, n, count, op);
    case ncclInt64:
      return reduce_typed<int64_t>(dst, src, stride, n, count, op);
    case ncclUint64:
      return reduce_typed<uint64_t>(dst, src, stride, n, count, op);
    case ncclFloat32:
      return reduce_typed<float>(dst, src, stride, n, count, op);
    case ncclFloat64:
      return reduce_typed<double>(dst, src, stride, n, count, op);
    case ncclFloat16: /* each step computed in f32 and rounded to the type */
      for (size_t i = 0; i < count; i++) {
        _Float16 acc = ((const _Float16 *)src)[i];
        for (int r = 1; r < n; r++)
          acc = (_Float16)apply(op, (float)acc, (float)((const _Float16 *)(src + (size_t)r * stride))[i]);
        if (op == ncclAvg) acc = (_Float16)((float)acc / (float)n);
        ((_Float16 *)dst)[i] = acc;
      }
      return;
    case ncclBfloat16:
      for (size_t i = 0; i < count; i++) {
        uint16_t acc = ((const uint16_t *)src)[i];
        for (int r = 1; r < n; r++)
          acc = f32_to_bf16(
              apply(op, bf16_to_f32(acc), bf16_to_f32(((const uint16_t *)(src + (size_t)r * stride))[i])));
        if (op == ncclAvg) acc = f32_to_bf16(bf16_to_f32(acc) / (float)n);
        ((uint16_t *)dst)[i] = acc;
      }
      return;
    default:
      rf_emu::die("NCCL: a reduction on datatype %d", (int)t);
  }
}

void mpi_check(int rc, ncclComm_t c, const char *call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fprintf(stderr, "cuda-emu: NCCL: %s failed: %s\n", call, msg);
  c->async_error = ncclSystemError;
}

/* One collective of a unit, on the worker. */
void run_collective(const nccl_op &o) {
  ncclComm_t c = o.comm;
  size_t size = type_size(o.type), bytes = o.count * size;
  int n = c->nranks;
  switch (o.k) {
    case K_ALLREDUCE: {
      std::vector<char> all(bytes * (size_t)n);
      mpi_check(MPI_Allgather(o.send, (int)bytes, MPI_BYTE, all.data(), (int)bytes, MPI_BYTE, c->mpi), c,
                "MPI_Allgather");
      reduce(o.recv, all.data(), bytes, n, o.count, o.type, o.op);
      break;
    }
    case K_REDUCE: {
      std::vector<char> all(c->rank == o.peer ? bytes * (size_t)n : 1);
      mpi_check(MPI_Gather(o.send, (int)bytes, MPI_BYTE, all.data(), (int)bytes, MPI_BYTE, o.peer, c->mpi), c,
                "MPI_Gather");
      if (c->rank == o.peer) reduce(o.recv, all.data(), bytes, n, o.count, o.type, o.op);
      break;
    }
    case K_REDUCESCATTER: { /* each rank's block r to rank r */
      std::vector<char> mine(bytes * (size_t)n);
      mpi_check(MPI_Alltoall(o.send, (int)bytes, MPI_BYTE, mine.data(), (int)bytes, MPI_BYTE, c->mpi), c,
                "MPI_Alltoall");
      reduce(o.recv, mine.data(), bytes, n, o.count, o.type, o.op);
      break;
    }
    case K_ALLGATHER: {
      std::vector<char> all(bytes * (size_t)n);
      mpi_check(MPI_Allgather(o.send, (int)bytes, MPI_BYTE, all.data(), (int)bytes, MPI_BYTE, c->mpi), c,
                "MPI_Allgather");
      memcpy(o.recv, all.data(), all.size());
      break;
    }
    case K_BROADCAST:
      if (c->rank == o.peer && o.send != o.recv) memcpy(o.recv, o.send, bytes);
      mpi_check(MPI_Bcast(o.recv, (int)bytes, MPI_BYTE, o.peer, c->mpi), c, "MPI_Bcast");
      break;
    case K_SEND:
    case K_RECV:
      break;
  }
}

/* A unit: one communicator's operations on one stream from one call or group. */
void run_unit(const std::vector<nccl_op> &ops, uint64_t index) {
  ncclComm_t c = ops[0].comm;
  {
    std::unique_lock<std::mutex> lock(g_mu);
    g_done.wait(lock, [c, index] { return c->done + 1 == index || c->aborted; });
  }
  uint64_t fail_at = rf_emu::env_u64("RF_EMU_NCCL_FAIL", 0), hang_at = rf_emu::env_u64("RF_EMU_NCCL_HANG", 0);
  for (const nccl_op &o : ops)
    if (o.number == hang_at && !c->aborted) {
      fprintf(stderr,
              "cuda-emu: NCCL: %s (operation %llu of rank %d) hangs as one whose peer stopped does "
              "(RF_EMU_NCCL_HANG=%llu): it never completes and reports no error\n",
              kind_name(o.k), (unsigned long long)o.number, c->rank, (unsigned long long)hang_at);
      while (!c->aborted) {
        struct timespec pause = {0, 2 * 1000 * 1000};
        nanosleep(&pause, NULL);
      }
    }
  for (const nccl_op &o : ops)
    if (o.number == fail_at && !c->aborted) {
      fprintf(stderr,
              "cuda-emu: NCCL: %s (operation %llu of rank %d) fails as a broken link does "
              "(RF_EMU_NCCL_FAIL=%llu): "
              "it never completes; ncclCommGetAsyncError reports ncclSystemError\n",
              kind_name(o.k), (unsigned long long)o.number, c->rank, (unsigned long long)fail_at);
      c->async_error = ncclSystemError;
      while (!c->aborted) {
        struct timespec pause = {0, 2 * 1000 * 1000};
        nanosleep(&pause, NULL);
      }
    }
  if (!c->aborted) {
    for (const nccl_op &o : ops)
      if (o.k != K_SEND && o.k != K_RECV) run_collective(o);
    std::vector<MPI_Request> reqs;
    for (const nccl_op &o : ops) {
      if (o.k != K_SEND && o.k != K_RECV) continue;
      MPI_Request r;
      int bytes = (int)(o.count * type_size(o.type));
      if (o.k == K_SEND)
        mpi_check(MPI_Isend(o.send, bytes, MPI_BYTE, o.peer, 7, c->mpi, &r), c, "MPI_Isend");
      else
        mpi_check(MPI_Irecv(o.recv, bytes, MPI_BYTE, o.peer, 7, c->mpi, &r), c, "MPI_Irecv");
      reqs.push_back(r);
    }
    if (!reqs.empty())
      mpi_check(MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE), c, "MPI_Waitall");
  }
  std::lock_guard<std::mutex> lock(g_mu);
  c->done = index;
  g_done.notify_all();
}

void submit(std::vector<nccl_op> &ops) {
  /* units: one per (communicator, stream), in the order each first appears */
  std::vector<std::vector<nccl_op>> units;
  for (const nccl_op &o : ops) {
    size_t u = 0;
    while (u < units.size() && (units[u][0].comm != o.comm || units[u][0].s != o.s)) u++;
    if (u == units.size()) units.emplace_back();
    units[u].push_back(o);
  }
  for (auto &unit : units) {
    uint64_t index;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      index = ++unit[0].comm->issued;
    }
    rf_emu::enqueue(unit[0].s, "NCCL", [unit, index] { run_unit(unit, index); });
  }
}

int live(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(g_mu);
  return c && g_live.count(c);
}

ncclResult_t check_comm(ncclComm_t c, const char *api) {
  if (!live(c)) return refuse(ncclInvalidArgument, "%s: communicator %p is not live", api, (void *)c);
  if (c->aborted) return refuse(ncclInvalidUsage, "%s: the communicator was aborted", api);
  if (c->finalized) return refuse(ncclInvalidUsage, "%s: the communicator was finalized", api);
  return ncclSuccess;
}

/* A device buffer of `bytes` for `what`: the stand-in's view of it, or NULL after refusing. */
ncclResult_t device_buffer(const void *p, size_t bytes, ncclComm_t c, const char *api, const char *what) {
  if (bytes == 0) return ncclSuccess;
  struct rf_emu::where w = rf_emu::locate(p);
  if (w.place != rf_emu::PLACE_DEVICE)
    return refuse(ncclInvalidArgument, "%s: %s %p is %s, not device memory", api, what, p,
                  w.place == rf_emu::PLACE_PINNED     ? "pinned host memory"
                  : w.place == rf_emu::PLACE_PAGEABLE ? "host memory"
                                                      : "a device address no live allocation holds");
  if (w.device != c->device)
    return refuse(ncclInvalidArgument, "%s: %s %p is memory of device %d, the communicator's is %d", api,
                  what, p, w.device, c->device);
  if ((const char *)p + bytes > w.base + w.size)
    return refuse(ncclInvalidArgument, "%s: %s: %zu bytes at %p run past their allocation (%zu bytes at %p)",
                  api, what, bytes, p, w.size, (const void *)w.base);
  return ncclSuccess;
}

int overlap(const void *a, size_t na, const void *b, size_t nb) {
  const char *x = (const char *)a, *y = (const char *)b;
  return na && nb && x < y + nb && y < x + na;
}

ncclResult_t issue(nccl_op o, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
                   cudaStream_t stream) {
  const char *api = kind_name(o.k);
  ncclResult_t r = check_comm(o.comm, api);
  if (r != ncclSuccess) return r;
  if (type_size(o.type) == 0) return refuse(ncclInvalidArgument, "%s: datatype %d", api, (int)o.type);
  int reduces = o.k == K_ALLREDUCE || o.k == K_REDUCE || o.k == K_REDUCESCATTER;
  if (reduces &&
      ((int)o.op < 0 || o.op >= ncclNumOps || o.type == ncclFloat8e4m3 || o.type == ncclFloat8e5m2))
    return refuse(ncclInvalidArgument, "%s: reduction %d on datatype %d", api, (int)o.op, (int)o.type);
  if ((o.k == K_BROADCAST || o.k == K_REDUCE || o.k == K_SEND || o.k == K_RECV) &&
      (o.peer < 0 || o.peer >= o.comm->nranks))
    return refuse(ncclInvalidArgument, "%s: rank %d of %d", api, o.peer, o.comm->nranks);
  /* which buffers this rank uses */
  int uses_send = o.k != K_RECV && !(o.k == K_BROADCAST && o.comm->rank != o.peer);
  int uses_recv = o.k != K_SEND && !(o.k == K_REDUCE && o.comm->rank != o.peer);
  if (uses_send && (r = device_buffer(send, send_bytes, o.comm, api, "sendbuff")) != ncclSuccess) return r;
  if (uses_recv && (r = device_buffer(recv, recv_bytes, o.comm, api, "recvbuff")) != ncclSuccess) return r;
  if (uses_send && uses_recv && o.count > 0) {
    size_t size = type_size(o.type);
    if (o.k == K_ALLGATHER) {
      const char *mine = (const char *)recv + (size_t)o.comm->rank * o.count * size;
      if (send != mine && overlap(send, send_bytes, recv, recv_bytes))
        return refuse(
            ncclInvalidArgument,
            "%s: sendbuff %p overlaps recvbuff %p; in place needs sendbuff == recvbuff + rank * count "
            "(%p for rank %d)",
            api, send, recv, (const void *)mine, o.comm->rank);
    } else if (o.k == K_REDUCESCATTER) {
      const char *mine = (const char *)send + (size_t)o.comm->rank * o.count * size;
      if (recv != mine && overlap(send, send_bytes, recv, recv_bytes))
        return refuse(ncclInvalidArgument,
                      "%s: recvbuff %p overlaps sendbuff %p; in place needs recvbuff == sendbuff + rank * "
                      "recvcount (%p for rank %d)",
                      api, recv, send, (const void *)mine, o.comm->rank);
    } else if (send != recv && overlap(send, send_bytes, recv, recv_bytes)) {
      return refuse(ncclInvalidArgument, "%s: sendbuff %p and recvbuff %p overlap without being equal", api,
                    send, recv);
    }
  }
  o.s = rf_emu::stream_of(stream, api);
  if (!o.s) return refuse(ncclInvalidArgument, "%s: the stream is not usable here (above)", api);
  if (rf_emu::stream_device(o.s) != o.comm->device)
    return refuse(ncclInvalidArgument, "%s: a stream of device %d for a communicator of device %d", api,
                  rf_emu::stream_device(o.s), o.comm->device);
  o.send = (const char *)rf_emu::view(send);
  o.recv = (char *)rf_emu::view(recv);
  o.number = ++g_ops;
  rf_emu::count(&rf_emu::stats.nccl_ops, 1);
  if (tls_group_depth > 0) {
    tls_group->push_back(o);
    return ncclSuccess;
  }
  std::vector<nccl_op> one{o};
  submit(one);
  return ncclSuccess;
}

}  // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return tls_last;
}

ncclResult_t ncclGetVersion(int *version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited)
    return refuse(ncclInvalidUsage, "ncclGetUniqueId: the stand-in bootstraps over MPI: MPI_Init first");
  static std::atomic<uint64_t> made{0};
  nccl_id x;
  memset(&x, 0, sizeof x);
  memcpy(x.magic, RF_EMU_NCCL_MAGIC, sizeof RF_EMU_NCCL_MAGIC);
  MPI_Comm_rank(MPI_COMM_WORLD, &x.creator);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  x.nonce =
      rf_emu::mix((uint64_t)getpid() ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (++made << 40));
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &x, sizeof x);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id_in, int rank) {
  int inited = 0, level = 0;
  MPI_Initialized(&inited);
  if (!inited)
    return refuse(ncclInvalidUsage, "ncclCommInitRank: the stand-in bootstraps over MPI: MPI_Init first");
  MPI_Query_thread(&level);
  if (level != MPI_THREAD_MULTIPLE)
    return refuse(ncclInvalidUsage,
                  "ncclCommInitRank: the stand-in runs collectives on stream threads: MPI_Init_thread with "
                  "MPI_THREAD_MULTIPLE first");
  nccl_id id;
  memcpy(&id, id_in.internal, sizeof id);
  if (memcmp(id.magic, RF_EMU_NCCL_MAGIC, sizeof RF_EMU_NCCL_MAGIC) != 0)
    return refuse(ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return refuse(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int tag = 17000 + (int)(id.nonce % 10000);
  std::vector<int> members((size_t)nranks, -1);
  if (me == id.creator) {
    members[(size_t)rank] = me;
    for (int i = 1; i < nranks; i++) {
      int who[2];
      MPI_Status status;
      MPI_Recv(who, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &status);
      if (who[0] < 0 || who[0] >= nranks || members[(size_t)who[0]] != -1)
        rf_emu::die("ncclCommInitRank: world rank %d claims NCCL rank %d of %d twice or out of range", who[1],
                    who[0], nranks);
      members[(size_t)who[0]] = who[1];
    }
    for (int r = 0; r < nranks; r++)
      if (members[(size_t)r] != me)
        MPI_Send(members.data(), nranks, MPI_INT, members[(size_t)r], tag, MPI_COMM_WORLD);
  } else {
    int who[2] = {rank, me};
    MPI_Send(who, 2, MPI_INT, id.creator, tag, MPI_COMM_WORLD);
    MPI_Recv(members.data(), nranks, MPI_INT, id.creator, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Group world, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, nranks, members.data(), &group);
  rf_emu_nccl_comm *c = new rf_emu_nccl_comm();
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) return refuse(ncclSystemError, "ncclCommInitRank: MPI_Comm_create_group failed");
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  c->rank = rank;
  c->nranks = nranks;
  c->device = rf_emu::current_device();
  c->async_error = ncclSuccess;
  c->aborted = 0;
  std::lock_guard<std::mutex> lock(g_mu);
  g_live.insert(c);
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (!live(c))
    return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: communicator %p is not live", (void *)c);
  *err = (ncclResult_t)c->async_error.load();
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
  ncclResult_t r = check_comm(c, "ncclCommFinalize");
  if (r != ncclSuccess) return r;
  rf_emu::count_host_wait();
  std::unique_lock<std::mutex> lock(g_mu);
  g_done.wait(lock, [c] { return c->done >= c->issued || c->aborted; });
  c->finalized = 1;
  return (ncclResult_t)c->async_error.load();
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!live(c)) return refuse(ncclInvalidArgument, "ncclCommAbort: communicator %p is not live", (void *)c);
  c->aborted = 1; /* operations waiting in the stand-in end; one inside MPI stays there */
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live.erase(c);
    g_done.notify_all();
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!live(c)) return refuse(ncclInvalidArgument, "ncclCommDestroy: communicator %p is not live", (void *)c);
  if (!c->finalized)
    return refuse(
        ncclInvalidUsage,
        "ncclCommDestroy before ncclCommFinalize: finalize first (it completes the queued operations "
        "and reports their errors), or ncclCommAbort");
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live.erase(c);
  }
  MPI_Comm_free(&c->mpi);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  if (!live(c)) return refuse(ncclInvalidArgument, "ncclCommCount: not live");
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device) {
  if (!live(c)) return refuse(ncclInvalidArgument, "ncclCommCuDevice: not live");
  *device = c->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  if (!live(c)) return refuse(ncclInvalidArgument, "ncclCommUserRank: not live");
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  size_t bytes = count * type_size(type);
  return issue(nccl_op{K_ALLREDUCE, NULL, NULL, count, type, op, 0, comm, NULL, 0}, send, bytes, recv, bytes,
               stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  size_t bytes = count * type_size(type);
  return issue(nccl_op{K_BROADCAST, NULL, NULL, count, type, ncclSum, root, comm, NULL, 0}, send, bytes, recv,
               bytes, stream);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  size_t bytes = count * type_size(type);
  return issue(nccl_op{K_REDUCE, NULL, NULL, count, type, op, root, comm, NULL, 0}, send, bytes, recv, bytes,
               stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  size_t bytes = count * type_size(type), n = live(comm) ? (size_t)comm->nranks : 1;
  return issue(nccl_op{K_ALLGATHER, NULL, NULL, count, type, ncclSum, 0, comm, NULL, 0}, send, bytes, recv,
               bytes * n, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  size_t bytes = count * type_size(type), n = live(comm) ? (size_t)comm->nranks : 1;
  return issue(nccl_op{K_REDUCESCATTER, NULL, NULL, count, type, op, 0, comm, NULL, 0}, send, bytes * n, recv,
               bytes, stream);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(nccl_op{K_SEND, NULL, NULL, count, type, ncclSum, peer, comm, NULL, 0}, send,
               count * type_size(type), NULL, 0, stream);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(nccl_op{K_RECV, NULL, NULL, count, type, ncclSum, peer, comm, NULL, 0}, NULL, 0, recv,
               count * type_size(type), stream);
}

ncclResult_t ncclGroupStart(void) {
  if (tls_group_depth++ == 0) {
    if (!tls_group) tls_group = new std::vector<nccl_op>();
    tls_group->clear();
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (tls_group_depth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--tls_group_depth > 0) return ncclSuccess;
  std::vector<nccl_op> ops;
  ops.swap(*tls_group);
  submit(ops);
  return ncclSuccess;
}

} /* extern "C" */
