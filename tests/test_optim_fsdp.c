/* rf-test: np=2,3 timeout=60
 * The optimizers on the runtime's own views (rf_optim_create_fsdp over an
 * rf_fsdp context), against the same context on MPI_COMM_SELF (the runtime's
 * initialization does not depend on W). Tensors: an embedding, per layer a norm,
 * a 67 x 40 and a 40 x 250 matrix and a 3-vector, a head; layouts planned
 * (equal and ragged shards), fsdp2 and flat, with 32-row blocks and 256-element
 * vector blocks as the trainer plans them for adamw8bit. The gradient of each
 * element is a function of (tensor, element, step, parameter), written straight
 * into the gradient shards. After 10 steps every rank's parameters equal the
 * one-rank run within 1e-5 relative (adamw, muon: every layout; adamw8bit: the
 * layouts whose blocks are whole, i.e. planned), and in the planned layouts no
 * 8-bit block is cut, while fsdp2 and flat cut some (their 8-bit state, and so
 * the parameters, then depend on W: printed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "optim/optim.h"
#include "rf_test.h"
#include "rfsdp.h"

#define STEPS 10
#define LAYERS 2

static struct rf_fsdp *build(MPI_Comm comm, enum rf_layout layout, enum rf_shard_mode shard) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = layout;
  opt.shard = shard;
  struct rf_optim_layout_needs needs; /* as the trainer plans them: 8-bit AdamW's blocks */
  rf_optim_layout_needs(RF_OPTIM_KIND_ADAMW8BIT, &needs);
  opt.block_rows = needs.block_rows;
  opt.vector_block = needs.vector_block;
  opt.seed = 5;
  struct rf_fsdp *f;
  if (rf_fsdp_create(&f, comm, &opt) != 0) RF_DIE("create: %s", rf_fsdp_error());
  int u = rf_fsdp_add_unit(f, "embed");
  int64_t es[2] = {50, 24};
  rf_fsdp_add_tensor(f, u, "model.embed_tokens.weight", 2, es, 0, (struct rf_init){RF_INIT_NORMAL, 0.5f});
  for (int l = 0; l < LAYERS; l++) {
    char nm[64];
    snprintf(nm, sizeof nm, "layer%d", l);
    u = rf_fsdp_add_unit(f, nm);
    int64_t ns[1] = {24}, a[2] = {67, 40}, b[2] = {40, 250}, c[1] = {3};
    snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
    rf_fsdp_add_tensor(f, u, nm, 1, ns, 0, (struct rf_init){RF_INIT_CONST, 1.0f});
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.up_proj.weight", l);
    rf_fsdp_add_tensor(f, u, nm, 2, a, 0, (struct rf_init){RF_INIT_NORMAL, 0.3f});
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.down_proj.weight", l);
    rf_fsdp_add_tensor(f, u, nm, 2, b, 0, (struct rf_init){RF_INIT_UNIFORM, 0.2f});
    snprintf(nm, sizeof nm, "model.layers.%d.bias", l);
    rf_fsdp_add_tensor(f, u, nm, 1, c, 0, (struct rf_init){RF_INIT_UNIFORM, 0.2f});
  }
  u = rf_fsdp_add_unit(f, "head");
  int64_t hs[2] = {24, 50};
  rf_fsdp_add_tensor(f, u, "lm_head.weight", 2, hs, 0, (struct rf_init){RF_INIT_NORMAL, 0.2f});
  if (rf_fsdp_finalize(f) != 0) RF_DIE("finalize: %s", rf_fsdp_error());
  return f;
}

static float hash_f32(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = a * 0x9E3779B97F4A7C15ull ^ b * 0xC2B2AE3D27D4EB4Full ^ c * 0x165667B19E3779F9ull;
  return rf_test_rand_f32(&s);
}

static void train(struct rf_fsdp *f, struct rf_optim *o) {
  for (int s = 0; s < STEPS; s++) {
    for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
      struct rf_tensor_view v;
      rf_fsdp_tensor(f, t, &v);
      for (int64_t i = v.begin; i < v.end; i++)
        v.grad[i - v.begin] = v.master[i - v.begin] - 0.3f * hash_f32((uint64_t)t, (uint64_t)i, 1) +
                              0.2f * hash_f32((uint64_t)t, (uint64_t)i, 10 + (uint64_t)s);
    }
    rf_optim_step(o, 0.01f);
  }
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  const char *layout_names[4] = {"planned/equal", "planned/ragged", "fsdp2", "flat"};
  for (int kind = 0; kind < 3; kind++)
    for (int lay = 0; lay < 4; lay++) {
      enum rf_layout layout = lay < 2 ? RF_LAYOUT_PLANNED : lay == 2 ? RF_LAYOUT_FSDP2 : RF_LAYOUT_FLAT;
      enum rf_shard_mode shard = lay == 1 ? RF_SHARD_MODE_RAGGED : RF_SHARD_MODE_EQUAL;
      struct rf_optim_options opt;
      rf_optim_options_default(&opt);
      opt.kind = (enum rf_optim_kind)kind;
      struct rf_fsdp *f = build(MPI_COMM_WORLD, layout, shard), *ref = build(MPI_COMM_SELF, layout, shard);
      struct rf_comm comm, self;
      rf_comm_init(&comm, rf_fsdp_comm(f));
      rf_comm_init(&self, rf_fsdp_comm(ref));
      struct rf_optim *o, *oref;
      int flags[2 + 4 * LAYERS] = {0}; /* the groups a model gives them, in build()'s order */
      for (int l = 0; l < LAYERS; l++) /* norm 0, up and down decay and Muon, bias 0 */
        flags[2 + 4 * l] = flags[3 + 4 * l] = RF_OPTIM_FLAG_DECAY | RF_OPTIM_FLAG_MATRIX;
      flags[1 + 4 * LAYERS] = RF_OPTIM_FLAG_DECAY; /* the head: decay, no Muon */
      RF_ASSERT(rf_optim_create_fsdp(&o, &opt, f, flags, &comm) == 0);
      RF_ASSERT(rf_optim_create_fsdp(&oref, &opt, ref, flags, &self) == 0);
      train(f, o);
      train(ref, oref);
      double worst = 0;
      for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
        struct rf_tensor_view v, rv;
        rf_fsdp_tensor(f, t, &v);
        rf_fsdp_tensor(ref, t, &rv);
        RF_ASSERT(rv.begin == 0 && rv.end == rv.numel && v.numel == rv.numel);
        if (v.end > v.begin)
          worst = rf_test_max(
              worst, rf_test_max_rel_diff(v.master, rv.master + v.begin, (size_t)(v.end - v.begin), 1e-3));
      }
      struct rf_optim_stats st;
      rf_optim_get_stats(o, &st);
      double all = worst;
      int64_t cut = st.tiles_cut;
      rf_comm_allreduce(&comm, &all, 1, RF_DTYPE_F64, RF_REDUCE_OP_MAX);
      rf_comm_allreduce(&comm, &cut, 1, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
      if (rank == 0)
        printf("%-9s %-14s W=%d: max rel diff to W=1 after %d steps %.3g; 8-bit blocks cut %lld\n",
               rf_optim_kind_name(opt.kind), layout_names[lay], world, STEPS, all, (long long)cut);
      int whole = lay < 2;
      if (opt.kind != RF_OPTIM_KIND_ADAMW8BIT || whole)
        RF_CHECK(worst <= 1e-5, "%s %s: max rel diff %.3g", rf_optim_kind_name(opt.kind), layout_names[lay],
                 worst);
      if (opt.kind == RF_OPTIM_KIND_ADAMW8BIT && whole)
        RF_CHECK(st.tiles_cut == 0, "%s: %lld blocks cut", layout_names[lay], (long long)st.tiles_cut);
      if (opt.kind == RF_OPTIM_KIND_ADAMW8BIT && !whole) /* the peers' layouts cut tiles of 67 x 40 */
        RF_CHECK(world == 1 || cut > 0, "%s: no block cut", layout_names[lay]);
      if (opt.kind == RF_OPTIM_KIND_MUON) {
        int64_t n_muon = 0, count = 0;
        for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
          n_muon += rf_optim_muon_owner(o, t) >= 0;
          count += rf_optim_muon_count(o, t);
        }
        rf_comm_allreduce(&comm, &count, 1, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
        RF_CHECK(n_muon == 2 * LAYERS && count == n_muon * STEPS,
                 "%s: %lld Muon matrices, %lld orthogonalized", layout_names[lay], (long long)n_muon,
                 (long long)count);
      }
      rf_optim_free(o);
      rf_optim_free(oref);
      rf_comm_free(&comm);
      rf_comm_free(&self);
      rf_fsdp_free(f);
      rf_fsdp_free(ref);
    }
  return rf_test_finish("test_optim_fsdp");
}
