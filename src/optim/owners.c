/* src/optim: the matrix-owner transport. Each whole matrix has one owner rank
 * chosen by cost; per group, one all-to-all-v takes every rank's pieces to the
 * owners and one brings the owners' results back, overlapped with the owners'
 * computation. Muon uses it; Shampoo will. See optim.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

/* The matrices of one group: one all-to-all-v out, one back. Owns its arrays. */
struct rf_optim_owners_group {
  int *members; /* matrix indices, in order */
  int n_members;
  int64_t *send_counts, *send_displs, *recv_counts, *recv_displs; /* world each, elements, from the slot */
};

struct rf_optim_owners {
  const struct rf_comm *comm; /* borrowed */
  /* the host device that moves the staging (host memory: MPI moves it from the host thread; the owner's
   * stages are host code), counting into the optimizer's device's counters */
  struct rf_device host;
  int rank, world;
  int n;
  struct rf_optim_owners_matrix *mats; /* owned copy (starts borrowed) */
  int *owner;                          /* n */
  int64_t *send_off;                   /* n: this rank's piece in its group's send slot */
  int n_groups;
  struct rf_optim_owners_group *groups;
  /* staging in slots (group g uses slot g % n_slots): send = this rank's pieces
   * by destination; recv = the pieces of the matrices it owns, by source */
  float *send, *recv;
  int n_slots;
  int64_t slot_send, slot_recv;           /* elements per slot */
  struct rf_comm_req *fwd_req, *back_req; /* n_slots each */
  float *full;                            /* the largest owned matrix and its scratch */
  int64_t *cursor;                        /* world entries */
  struct rf_optim_owners_stats stats;
};

/* ---- create / free ---------------------------------------------------------- */

static void rf_optim_owners_assign(struct rf_optim_owners *t) {
  int n = t->n;
  int *order = rf_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
  double *load = rf_xcalloc((size_t)t->world, sizeof(double));
  for (int k = 0; k < n; k++) order[k] = k;
  for (int k = 1; k < n; k++) { /* insertion sort: stable, deterministic */
    int x = order[k], j = k;
    while (j > 0 && t->mats[order[j - 1]].cost < t->mats[x].cost) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = x;
  }
  for (int k = 0; k < n; k++) {
    const struct rf_optim_owners_matrix *m = &t->mats[order[k]];
    double lmin = load[0];
    for (int r = 1; r < t->world; r++) lmin = fmin(lmin, load[r]);
    int best = -1;
    int64_t best_held = -1;
    for (int r = 0; r < t->world; r++) {
      if (load[r] > lmin + 0.5 * m->cost) continue;
      int64_t held = m->starts[r + 1] - m->starts[r];
      if (held > best_held || (held == best_held && load[r] < load[best])) {
        best = r;
        best_held = held;
      }
    }
    t->owner[order[k]] = best;
    load[best] += m->cost;
  }
  t->stats.owned_cost = load[t->rank];
  free(order);
  free(load);
}

/* Staging layouts: send = per group, per destination rank, pieces in order;
 * recv = per group, per source rank, the owned matrices' pieces in order. */
static void rf_optim_owners_layout(struct rf_optim_owners *t, struct rf_optim_owners_group *gr,
                                   int64_t *max_full) {
  int world = t->world, me = t->rank;
  int64_t send_pos = 0, recv_pos = 0;
  gr->send_counts = rf_xcalloc((size_t)world * 4, sizeof(int64_t));
  gr->send_displs = gr->send_counts + world;
  gr->recv_counts = gr->send_displs + world;
  gr->recv_displs = gr->recv_counts + world;
  for (int r = 0; r < world; r++) {
    gr->send_displs[r] = send_pos;
    for (int k = 0; k < gr->n_members; k++) {
      int x = gr->members[k];
      if (t->owner[x] != r) continue;
      t->send_off[x] = send_pos;
      send_pos += t->mats[x].starts[me + 1] - t->mats[x].starts[me];
    }
    gr->send_counts[r] = send_pos - gr->send_displs[r];
  }
  for (int s = 0; s < world; s++) {
    gr->recv_displs[s] = recv_pos;
    for (int k = 0; k < gr->n_members; k++) {
      int x = gr->members[k];
      if (t->owner[x] != me) continue;
      recv_pos += t->mats[x].starts[s + 1] - t->mats[x].starts[s];
    }
    gr->recv_counts[s] = recv_pos - gr->recv_displs[s];
  }
  t->slot_send = rf_max_i64(t->slot_send, send_pos);
  t->slot_recv = rf_max_i64(t->slot_recv, recv_pos);
  for (int k = 0; k < gr->n_members; k++) {
    const struct rf_optim_owners_matrix *m = &t->mats[gr->members[k]];
    if (t->owner[gr->members[k]] == me) *max_full = rf_max_i64(*max_full, m->rows * m->cols + m->work);
  }
  for (int r = 0; r < world; r++) {
    if (r == me) continue;
    t->stats.step_bytes_sent += (uint64_t)(gr->send_counts[r] + gr->recv_counts[r]) * 4;
    t->stats.step_bytes_recv += (uint64_t)(gr->recv_counts[r] + gr->send_counts[r]) * 4;
  }
}

void rf_optim_owners_create(struct rf_optim_owners **out, const struct rf_comm *comm, struct rf_device *dev,
                            struct rf_device_stream *stream, const struct rf_optim_owners_matrix *mats, int n,
                            int overlap, int measure) {
  struct rf_optim_owners *t = rf_xcalloc(1, sizeof *t);
  (void)stream;
  rf_device_host_init(&t->host, dev->counters);
  size_t nn = (size_t)(n > 0 ? n : 1);
  t->comm = comm;
  t->rank = comm->rank;
  t->world = comm->world;
  t->n = n;
  t->mats = rf_xcalloc(nn, sizeof *t->mats);
  if (n > 0) memcpy(t->mats, mats, (size_t)n * sizeof *mats);
  t->owner = rf_xcalloc(nn, sizeof(int));
  t->send_off = rf_xcalloc(nn, sizeof(int64_t));
  rf_optim_owners_assign(t);
  /* groups in order of first appearance */
  t->groups = rf_xcalloc(nn, sizeof *t->groups);
  int *ids = rf_xcalloc(nn, sizeof(int)); /* the caller's group id of each group */
  for (int k = 0; k < n; k++) {
    int g = 0;
    while (g < t->n_groups && ids[g] != mats[k].group) g++;
    if (g == t->n_groups) {
      ids[g] = mats[k].group;
      t->groups[g].members = rf_xmalloc(nn * sizeof(int));
      t->n_groups++;
    }
    t->groups[g].members[t->groups[g].n_members++] = k;
  }
  free(ids);
  int64_t max_full = 0;
  for (int g = 0; g < t->n_groups; g++) rf_optim_owners_layout(t, &t->groups[g], &max_full);
  /* three slots let one group's results travel back and the next group's pieces
   * travel out while a third is computed */
  t->n_slots = overlap ? (int)rf_min_i64(3, rf_max_i64(t->n_groups, 1)) : 1;
  int64_t send_elems = t->n_slots * t->slot_send, recv_elems = t->n_slots * t->slot_recv;
  t->stats.workspace_bytes = (send_elems + recv_elems + max_full) * (int64_t)sizeof(float);
  if (measure) {
    *out = t;
    return;
  }
  t->send = rf_xaligned(64, (size_t)rf_max_i64(send_elems, 1) * sizeof(float));
  t->recv = rf_xaligned(64, (size_t)rf_max_i64(recv_elems, 1) * sizeof(float));
  t->full = rf_xaligned(64, (size_t)rf_max_i64(max_full, 1) * sizeof(float));
  t->cursor = rf_xcalloc((size_t)t->world, sizeof(int64_t));
  t->fwd_req = rf_xcalloc((size_t)t->n_slots, sizeof(struct rf_comm_req));
  t->back_req = rf_xcalloc((size_t)t->n_slots, sizeof(struct rf_comm_req));
  for (int k = 0; k < t->n_slots; k++) {
    rf_comm_req_init(&t->fwd_req[k], t->world);
    rf_comm_req_init(&t->back_req[k], t->world);
  }
  *out = t;
}

void rf_optim_owners_free(struct rf_optim_owners *t) {
  if (!t) return;
  for (int g = 0; g < t->n_groups; g++) {
    free(t->groups[g].members);
    free(t->groups[g].send_counts);
  }
  free(t->groups);
  free(t->mats);
  free(t->owner);
  free(t->send_off);
  free(t->send);
  free(t->recv);
  for (int k = 0; k < t->n_slots && t->fwd_req; k++) {
    rf_comm_req_free(&t->fwd_req[k]);
    rf_comm_req_free(&t->back_req[k]);
  }
  free(t->fwd_req);
  free(t->back_req);
  free(t->full);
  free(t->cursor);
  free(t);
}

int rf_optim_owners_owner(const struct rf_optim_owners *t, int k) {
  RF_ASSERT(k >= 0 && k < t->n);
  return t->owner[k];
}

void rf_optim_owners_get_stats(const struct rf_optim_owners *t, struct rf_optim_owners_stats *out) {
  *out = t->stats;
}

/* ---- run ------------------------------------------------------------------------ */

static float *rf_optim_owners_slot_send(const struct rf_optim_owners *t, int g) {
  return t->send + (g % t->n_slots) * t->slot_send;
}
static float *rf_optim_owners_slot_recv(const struct rf_optim_owners *t, int g) {
  return t->recv + (g % t->n_slots) * t->slot_recv;
}

static void rf_optim_owners_pack(struct rf_optim_owners *t, int g, const struct rf_optim_owners_fns *fns,
                                 void *ctx) {
  const struct rf_optim_owners_group *gr = &t->groups[g];
  for (int k = 0; k < gr->n_members; k++)
    fns->pack(ctx, gr->members[k], rf_optim_owners_slot_send(t, g) + t->send_off[gr->members[k]]);
}

static void rf_optim_owners_unpack(struct rf_optim_owners *t, int g, const struct rf_optim_owners_fns *fns,
                                   void *ctx) {
  const struct rf_optim_owners_group *gr = &t->groups[g];
  for (int k = 0; k < gr->n_members; k++)
    fns->unpack(ctx, gr->members[k], rf_optim_owners_slot_send(t, g) + t->send_off[gr->members[k]]);
}

/* The group's all-to-all-v: out (pieces to owners) or back (results to holders);
 * blocking, or started on the slot's request. */
static void rf_optim_owners_transfer(struct rf_optim_owners *t, int g, int back, int start) {
  const struct rf_optim_owners_group *gr = &t->groups[g];
  uint64_t out = 0, in = 0;
  for (int r = 0; r < t->world; r++) {
    if (r == t->rank) continue;
    out += (uint64_t)(back ? gr->recv_counts[r] : gr->send_counts[r]);
    in += (uint64_t)(back ? gr->send_counts[r] : gr->recv_counts[r]);
  }
  t->stats.bytes_sent += out * sizeof(float);
  t->stats.bytes_recv += in * sizeof(float);
  float *snd = rf_optim_owners_slot_send(t, g), *rcv = rf_optim_owners_slot_recv(t, g);
  const int64_t *sc = back ? gr->recv_counts : gr->send_counts,
                *sd = back ? gr->recv_displs : gr->send_displs;
  const int64_t *rc = back ? gr->send_counts : gr->recv_counts,
                *rd = back ? gr->send_displs : gr->recv_displs;
  const float *from = back ? rcv : snd;
  float *to = back ? snd : rcv;
  if (start) {
    struct rf_comm_req *req = back ? &t->back_req[g % t->n_slots] : &t->fwd_req[g % t->n_slots];
    rf_comm_ialltoallv(t->comm, from, sc, sd, to, rc, rd, RF_DTYPE_F32, req);
  } else {
    uint64_t t0 = rf_time_ns();
    rf_comm_alltoallv(t->comm, from, sc, sd, to, rc, rd, RF_DTYPE_F32);
    t->stats.wait_ns += rf_time_ns() - t0;
  }
}

static void rf_optim_owners_wait(struct rf_optim_owners *t, struct rf_comm_req *req) {
  uint64_t t0 = rf_time_ns();
  rf_comm_wait(req);
  t->stats.wait_ns += rf_time_ns() - t0;
}

/* Between the owner's kernels: lets MPI progress the transfers in flight. */
static void rf_optim_owners_poll(void *arg) {
  struct rf_optim_owners *t = arg;
  for (int k = 0; k < t->n_slots; k++) {
    rf_comm_test(&t->fwd_req[k]);
    rf_comm_test(&t->back_req[k]);
  }
}

/* The owner assembles each of its matrices of the group from the receive slot,
 * computes, and writes the pieces back in place. */
static void rf_optim_owners_compute(struct rf_optim_owners *t, int g, const struct rf_optim_owners_fns *fns,
                                    void *ctx) {
  const struct rf_optim_owners_group *gr = &t->groups[g];
  float *rcv = rf_optim_owners_slot_recv(t, g);
  int world = t->world;
  for (int s = 0; s < world; s++) t->cursor[s] = gr->recv_displs[s];
  for (int k = 0; k < gr->n_members; k++) {
    int x = gr->members[k];
    if (t->owner[x] != t->rank) continue;
    const int64_t *st = t->mats[x].starts;
    for (int s = 0; s < world; s++)
      rf_move_copy(&t->host, t->full + st[s], rcv + t->cursor[s], (size_t)(st[s + 1] - st[s]) * sizeof(float),
                   NULL);
    fns->compute(ctx, x, t->full, t->full + t->mats[x].rows * t->mats[x].cols,
                 t->n_slots > 1 ? rf_optim_owners_poll : NULL, t);
    for (int s = 0; s < world; s++) {
      rf_move_copy(&t->host, rcv + t->cursor[s], t->full + st[s], (size_t)(st[s + 1] - st[s]) * sizeof(float),
                   NULL);
      t->cursor[s] += st[s + 1] - st[s];
    }
  }
}

/* Blocking: per group, pack, out, compute, back, unpack. Overlapped (3 slots):
 * group g+1's pieces travel out and group g-1's results travel back while group
 * g is computed; every rank starts the collectives in the same order. */
void rf_optim_owners_run(struct rf_optim_owners *t, const struct rf_optim_owners_fns *fns, void *ctx) {
  int G = t->n_groups, S = t->n_slots;
  if (S == 1) {
    for (int g = 0; g < G; g++) {
      rf_optim_owners_pack(t, g, fns, ctx);
      rf_optim_owners_transfer(t, g, 0, 0);
      rf_optim_owners_compute(t, g, fns, ctx);
      rf_optim_owners_transfer(t, g, 1, 0);
      rf_optim_owners_unpack(t, g, fns, ctx);
    }
    return;
  }
  int done = 0;
  rf_optim_owners_pack(t, 0, fns, ctx);
  rf_optim_owners_transfer(t, 0, 0, 1);
  for (int g = 0; g < G; g++) {
    if (g + 1 < G) {
      if (g + 1 - S >= 0) { /* the slot of group g+1 is group g+1-S's */
        rf_optim_owners_wait(t, &t->back_req[(g + 1) % S]);
        rf_optim_owners_unpack(t, done++, fns, ctx);
      }
      rf_optim_owners_pack(t, g + 1, fns, ctx);
      rf_optim_owners_transfer(t, g + 1, 0, 1);
    }
    rf_optim_owners_wait(t, &t->fwd_req[g % S]);
    rf_optim_owners_compute(t, g, fns, ctx);
    rf_optim_owners_transfer(t, g, 1, 1);
  }
  for (; done < G; done++) {
    rf_optim_owners_wait(t, &t->back_req[done % S]);
    rf_optim_owners_unpack(t, done, fns, ctx);
  }
}
