// MXFP4 routed experts at decode sizes, streaming form (M * topk <= DSV4_FP4_MOE_STREAM_MAX_SLOTS, E <=
// DSV4_FP4_MOE_STREAM_MAX_EXPERTS): the two kernels of kernel.cuh (same inner product: e2m1 decoded to bf16 in
// registers, m16n8k16, fp32 accumulation; same h / y workspaces) on a persistent grid, so that every warp streams
// weights without a break from its first work item to its last:
//
//   fp4_moe_stream_kernel<.., 1, ..>  gemm1: h[slot] = silu(min(g, l)) * clamp(u, -l, l), g|u = x W13^T
//   fp4_moe_stream_kernel<.., 2, ..>  gemm2: y[slot] = h[slot] W2^T (fp32); then out[t] = rsf * sum_k w[t,k] y[..]
//
// Routing, once per block (not per work item): the slot -> expert table, per-expert counts, their prefix sums and
// the pass list (an expert's slots in passes of 8 = the n of the MMA, slots in ascending order: deterministic) in
// shared memory. Work item = (pass, row tile): 16 gate + 16 up rows (gemm1) or 32 W2 rows (gemm2) over the whole K,
// taken by a group of `wpi` warps (1, 2 or 4; they split K step by step and add their fp32 partials in shared memory,
// fixed order). Items go round robin to the groups of the grid (item i -> group i mod G), consecutive items being
// consecutive row tiles of one pass, so the grid reads an expert's rows as one front. Each warp keeps kSt - 1 weight
// steps in flight in a register ring that runs across item boundaries (the next item's first steps are in flight
// while this one's epilogue runs), and the B operand one step ahead, also across items.
//
// gemm2's combine without a fence per item (a fence would wait for the ring's loads in flight): after its last item
// every thread fences once; then one warp per group counts, per (token, 32-column tile), the slots it finished
// (int32 counters zeroed by gemm1); the warp whose count completes a token's valid slots sums that token's tile
// (fixed k order) and writes it. Tokens without a valid slot are zeroed by the grid. No spin waits anywhere (no
// co-residency assumption), no atomics whose order reaches a result.
//
// PDL: gemm1 waits before reading anything (ids, x) and then lets gemm2 in; gemm2 routes (topk_ids were written
// before gemm1 passed its wait) and issues its first weight steps before its own wait, then reads h.
#pragma once
#include "fp4_moe/kernel.cuh"
#include "fp4_moe/kernel_stream_src.cuh"

namespace dsv4 {
namespace fp4moe {
namespace stream {

constexpr int kMaxSlots = DSV4_FP4_MOE_STREAM_MAX_SLOTS;
constexpr int kMaxExperts = DSV4_FP4_MOE_STREAM_MAX_EXPERTS;
constexpr int kMaxPasses = kMaxExperts + kMaxSlots / kCols;   // sum over experts of ceil(count / 8)
constexpr int kPerThread = kMaxExperts / kThreads;            // experts per thread in the count scan
static_assert(kMaxExperts % kThreads == 0 && kMaxExperts <= 1024, "pass entries keep the expert in 10 bits");
static_assert(kMaxSlots <= 2048, "pass entries keep the column offset in 11 bits; slots fit int16");
static_assert(kCols == 8, "pass entries keep ncols - 1 in 3 bits");

// Shared routing tables (~17.5 KB at 2048 slots / 1024 experts).
struct Routing {
  int16_t expert[kMaxSlots];   // expert of each slot, -1 when dropped
  int16_t cols[kMaxSlots];     // the valid slots grouped by expert (ascending), ascending inside an expert
  int cnt[kMaxExperts];        // slots per expert; after the scan: running column position
  int pass[kMaxPasses];        // expert | col_off << 10 | (ncols - 1) << 21
  int warp_sum[kWarps];
  int n_passes;
};

struct Item {
  int e, off, n, n0;   // expert, first column in cols[], columns (1..8), first weight row
};

__device__ __forceinline__ Item item_at(const Routing& R, int v, int tile, int rows_per_tile) {
  const int pk = R.pass[v];
  return {pk & 1023, (pk >> 10) & 2047, ((pk >> 21) & 7) + 1, tile * rows_per_tile};
}

__device__ __forceinline__ Item item_of(const Routing& R, int i, int tiles, int rows_per_tile) {
  const int v = i / tiles;
  return item_at(R, v, i - v * tiles, rows_per_tile);
}

// Item i = v * tiles + tile of a group, stepped by the grid's group count G without a division per item.
struct ItemCursor {
  int v, tile;
};

// Host-callable: tests/host/fp4_decode_check.cu checks it against i / tiles, i % tiles on the CPU.
__host__ __device__ __forceinline__ void advance(ItemCursor& ic, int g_div, int g_mod, int tiles) {
  ic.v += g_div;
  ic.tile += g_mod;
  if (ic.tile >= tiles) {
    ic.tile -= tiles;
    ++ic.v;
  }
}

// Every thread of the block calls it once.
__device__ __forceinline__ void route(const Fp4MoeDecodeParams& p, Routing& R) {
  const int S = (int)(p.M * p.topk), E = (int)p.E;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int e = tid; e < E; e += kThreads) R.cnt[e] = 0;
  for (int i = tid; i < S; i += kThreads) R.expert[i] = (int16_t)slot_expert(p, i);
  __syncthreads();
  for (int i = tid; i < S; i += kThreads) {
    const int e = R.expert[i];
    if (e >= 0) atomicAdd(&R.cnt[e], 1);   // totals only: independent of the order
  }
  __syncthreads();
  // exclusive scan over experts of (count << 16 | passes): column offsets and pass offsets in one go
  int pre[kPerThread];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = tid * kPerThread + j;
    const int v = e < E ? R.cnt[e] : 0;
    pre[j] = sum;
    sum += (v << 16) | ((v + kCols - 1) / kCols);
  }
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  if (lane == 31) R.warp_sum[warp] = incl;
  __syncthreads();
  int base = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    base += w < warp ? R.warp_sum[w] : 0;
    total += R.warp_sum[w];
  }
  const int excl = base + incl - sum;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int e = tid * kPerThread + j;
    const int v = e < E ? R.cnt[e] : 0;
    if (v > 0) {
      const int at = excl + pre[j];
      const int col_off = at >> 16, pass_off = at & 0xFFFF;
      for (int q = 0; q * kCols < v; ++q) {
        const int n = min(kCols, v - q * kCols);
        R.pass[pass_off + q] = e | ((col_off + q * kCols) << 10) | ((n - 1) << 21);
      }
      R.cnt[e] = col_off;
    }
  }
  if (tid == 0) {
    R.n_passes = total & 0xFFFF;
  }
  __syncthreads();
  if (warp == 0) {   // positions in slot order (deterministic): chunks of 32 slots, peers by expert
    for (int b = 0; b < S; b += 32) {
      const int i = b + lane;
      const int e = i < S ? R.expert[i] : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, e);
      if (e >= 0) R.cols[R.cnt[e] + __popc(peers & ((1u << lane) - 1u))] = (int16_t)i;
      __syncwarp();
      if (e >= 0 && lane == __ffs(peers) - 1) R.cnt[e] += __popc(peers);
      __syncwarp();
    }
  }
  __syncthreads();
}

__device__ __forceinline__ int valid_slots_of_token(const Routing& R, int t, int topk) {
  int n = 0;
  for (int k = 0; k < topk; ++k) n += R.expert[t * topk + k] >= 0;
  return n;
}

// The warps of a block form groups of wpi warps; group `gid` of G takes items gid, gid + G, ...
struct Groups {
  int wpi, gq, grp, gid, G;
};

__device__ __forceinline__ Groups make_groups(int64_t wpi_req, int nsteps) {
  int wpi = (wpi_req == 2 || wpi_req == 4) ? (int)wpi_req : 1;
  while (wpi > 1 && wpi > nsteps) wpi >>= 1;   // every warp of a group gets >= 1 K step
  const int warp = threadIdx.x >> 5, gpb = kWarps / wpi;
  Groups gr;
  gr.wpi = wpi;
  gr.gq = warp % wpi;
  gr.grp = warp / wpi;
  gr.gid = (int)blockIdx.x * gpb + gr.grp;
  gr.G = (int)gridDim.x * gpb;
  return gr;
}

// Named barrier of the group (ids 1..4; 0 is __syncthreads'). Literal ids, so that ptxas reserves 5 barriers, not 16.
__device__ __forceinline__ void group_bar(const Groups& gr) {
  const int n = 32 * gr.wpi;
  switch (gr.grp) {
    case 0: asm volatile("bar.sync 1, %0;\n" ::"r"(n) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;\n" ::"r"(n) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;\n" ::"r"(n) : "memory"); break;
    default: asm volatile("bar.sync 4, %0;\n" ::"r"(n) : "memory"); break;
  }
}

// out[t, n0 .. n0 + 32) = rsf * sum_k w[t,k] y[t*topk+k, ...] by the whole warp (lane = column: 128-byte loads),
// the token's y values loaded 8 slots at a time before they are summed (one L2 round trip for top-k <= 8).
__device__ __forceinline__ void combine_token_tile(const Fp4MoeDecodeParams& p, const Routing& R, int t, int n0,
                                                   int lane) {
  float acc = 0.f;
  const int topk = (int)p.topk;
  for (int k0 = 0; k0 < topk; k0 += 8) {
    float v[8], w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int slot = t * topk + k0 + i;
      const bool ok = k0 + i < topk && R.expert[slot] >= 0;
      w[i] = ok ? topk_weight(p, slot) : 0.f;
      v[i] = ok ? __ldcg(p.y + (int64_t)slot * p.hidden + n0 + lane) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)   // fixed order: bit-identical across runs
      if (k0 + i < topk) acc += w[i] * v[i];
  }
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  out[(int64_t)t * p.out_stride + n0 + lane] = __float2bfloat16_rn(acc * (float)p.rsf);
}

// kGemm 1 / 2; kSt weight steps in the ring (kSt - 1 in flight); kMinB blocks per SM (launch bounds); kSrc the weight
// source (kernel_stream_src.cuh: register ring or cp.async shared-memory ring); kAcc MMA accumulator chains per m16
// tile (2: the even and the odd k16 steps apart, summed in the epilogue: twice the MMA chains in flight per warp);
// kDiag a bench-only diagnostic (kernel_stream_src.cuh: 0 none, kDiagLoads, kDiagCompute).
template <bool kScaleF32, int kGemm, int kSt, int kMinB, int kSrc, int kAcc, int kDiag>
__global__ void __launch_bounds__(kThreads, kMinB) fp4_moe_stream_kernel(Fp4MoeStreamParams sp) {
  static_assert(kGemm == 1 || kGemm == 2, "gemm1 or gemm2");
  static_assert(kSt >= 2, "at least one weight step in flight");
  static_assert(kAcc == 1 || kAcc == 2, "one or two accumulator chains per tile");
  static_assert(kSrc == kSrcRegs || kSrc == kSrcSmem, "weight source");
  static_assert(kDiag == 0 || kDiag == kDiagLoads || (kDiag == kDiagCompute && kSrc == kSrcRegs), "diagnostic");
  constexpr bool kSmem = kSrc == kSrcSmem;
  const Fp4MoeDecodeParams& p = sp.d;
  __shared__ Routing R;
  __shared__ float part[kWarps][kRows][8][kCols];
  extern __shared__ __align__(16) uint8_t ring_smem[];   // kSrcSmem: kWarps x kSt stages of kStageBytes
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  constexpr int kTileRows = kGemm == 1 ? kGemm1Rows : kGemm2Rows;
  const int tiles = (int)((kGemm == 1 ? p.inter : p.hidden) / kTileRows);
  const int tiles2 = (int)(p.hidden / kGemm2Rows);
  if (kGemm == 1) {
    pdl_wait();                 // topk_ids and x come from earlier kernels; the previous call's gemm2 is done
    pdl_launch_dependents();    // gemm2 may get resident and prefetch its weights
    const int64_t nctr = p.M * tiles2;   // gemm2's (token, tile) counters
    for (int64_t i = (int64_t)blockIdx.x * kThreads + tid; i < nctr; i += (int64_t)gridDim.x * kThreads)
      p.counters[i] = 0;
  }
  route(p, R);   // gemm2: topk_ids were written before gemm1 passed its wait
  const int nsteps = (int)((kGemm == 1 ? p.hidden : p.inter) / kStepK);
  const Groups gr = make_groups(kGemm == 1 ? sp.wpi1 : sp.wpi2, nsteps);
  const int n_items = R.n_passes * tiles;
  const int nmy = n_items > gr.gid ? (n_items - gr.gid + gr.G - 1) / gr.G : 0;
  const int spw = (nsteps - gr.gq + gr.wpi - 1) / gr.wpi;   // K steps per item of this warp (>= 1)
  const int J = nmy * spw;                                 // this warp's steps over all its items
  const void* scales = kGemm == 1 ? p.s13 : p.s2;
  const int topk = (int)p.topk;

  const int g_div = gr.G / tiles, g_mod = gr.G - g_div * tiles;
  const ItemCursor first = {gr.gid / tiles, gr.gid - (gr.gid / tiles) * tiles};
  auto rows_at = [&](const ItemCursor& ic) -> Rows {
    const Item it = item_at(R, ic.v, ic.tile, kTileRows);
    return kGemm == 1 ? gemm1_rows(p, it.e, it.n0, g) : gemm2_rows(p, it.e, it.n0, g);
  };
  // this lane's B row (x or h of its column's slot) at the warp's first K step of an item; nullptr: no column
  auto brow_at = [&](const Item& it, bool exists) -> const __nv_bfloat16* {
    if (!exists || g >= it.n) return nullptr;
    const int slot = R.cols[it.off + g];
    const __nv_bfloat16* row =
        kGemm == 1 ? reinterpret_cast<const __nv_bfloat16*>(p.x) + (int64_t)(slot / topk) * p.x_stride
                   : reinterpret_cast<const __nv_bfloat16*>(p.h) + (int64_t)slot * p.inter;
    return row + gr.gq * kStepK + c * 32;
  };

  WeightStep ring[kSmem ? 1 : kSt];   // kSrcSmem: the step being computed only
  uint8_t* const my_ring = ring_smem + warp * (kSmem ? kSt * kStageBytes : 0);
  Rows lrows;
  ItemCursor lic = first;   // the load cursor: item lk, K step ls of it
  int lk = 0, ls = 0;
  if (J > 0) lrows = rows_at(lic);
  auto load_next = [&](int slot) {
    if (kSmem)
      copy_weights<kScaleF32>(my_ring + slot * kStageBytes, lrows, scales, gr.gq + ls * gr.wpi, lane, c);
    else
      load_weights<kScaleF32>(ring[kSmem ? 0 : slot], lrows, scales, gr.gq + ls * gr.wpi, c);
    if (++ls == spw) {
      ls = 0;
      advance(lic, g_div, g_mod, tiles);
      if (++lk < nmy) lrows = rows_at(lic);
    }
  };
  if (kDiag == kDiagCompute) {   // one real step, then the same registers every step
    if (J > 0) load_next(0);
#pragma unroll
    for (int t = 1; t < kSt; ++t) ring[t] = ring[0];
  } else {
#pragma unroll
    for (int t = 0; t < kSt - 1; ++t) {
      if (t < J) load_next(t);
      if (kSmem) cp_async_commit();   // one group per step, empty ones too: wait_group counts steps
    }
  }
  if (kGemm == 2) pdl_wait();   // h comes from gemm1

  // the compute cursor: item ck (cic), K step cs of it; bnext_item: this lane's B row of item ck + 1
  const int bstride = gr.wpi * kStepK;
  ItemCursor cic = first;
  const __nv_bfloat16* bcur = nmy > 0 ? brow_at(item_at(R, cic.v, cic.tile, kTileRows), true) : nullptr;
  const __nv_bfloat16* bnext_item = nullptr;
  if (nmy > 1) {
    ItemCursor n2 = cic;
    advance(n2, g_div, g_mod, tiles);
    bnext_item = brow_at(item_at(R, n2.v, n2.tile, kTileRows), true);
  }
  OperandStep op;
  load_operand(op, bcur, 0, 0);
  float acc[kTiles][4], acc1[kTiles][4];   // acc1: the odd k16 steps' chain (kAcc 2)
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = acc1[t][i] = 0.f;
  uint32_t fold = 0;   // kDiagLoads
  const int gt = gr.gq * 32 + lane, gthreads = 32 * gr.wpi, w0 = warp - gr.gq;
  const float limit = (float)p.swiglu_limit;

  auto epilogue = [&](const Item& it) {
    if (kAcc == 2) {
#pragma unroll
      for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] += acc1[t][i];
    }
    if (kDiag == kDiagLoads) acc[0][0] += __uint_as_float(fold & 0x007FFFFFu);   // a denormal: keeps the fold live
    store_partials(part[warp], acc, g, c);
    group_bar(gr);
    if (kGemm == 1) {
      __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(p.h);
      for (int pr = gt; pr < kGemm1Rows * kCols; pr += gthreads) {
        const int j = pr % kGemm1Rows, col = pr / kGemm1Rows;   // gate row n0 + j, column col
        if (col < it.n) {
          float gate = 0.f, up = 0.f;
          for (int w = 0; w < gr.wpi; ++w) {   // fixed order
            gate += part[w0 + w][j / 8][j % 8][col];
            up += part[w0 + w][kTiles + j / 8][j % 8][col];
          }
          if (p.swiglu) {
            gate = fminf(gate, limit);
            up = fminf(fmaxf(up, -limit), limit);
          }
          const float a = gate / (1.f + __expf(-gate)) * up;
          h[(int64_t)R.cols[it.off + col] * p.inter + it.n0 + j] = __float2bfloat16_rn(a);
        }
      }
    } else {
      for (int pr = gt; pr < kGemm2Rows * kCols; pr += gthreads) {
        const int j = pr % kGemm2Rows, col = pr / kGemm2Rows;   // output column n0 + j
        if (col < it.n) {
          float v = 0.f;
          for (int w = 0; w < gr.wpi; ++w) v += part[w0 + w][j / 8][j % 8][col];
          p.y[(int64_t)R.cols[it.off + col] * p.hidden + it.n0 + j] = v;
        }
      }
    }
    group_bar(gr);   // part[] is reused by the next item
  };

  int ck = 0, cs = 0;
  for (int j0 = 0; j0 < J; j0 += kSt) {
#pragma unroll
    for (int s = 0; s < kSt; ++s) {
      const int j = j0 + s;
      if (kDiag != kDiagCompute && j + kSt - 1 < J) load_next((s + kSt - 1) % kSt);
      if (kSmem) {
        cp_async_commit();
        cp_async_wait<kSt - 1>();   // this lane's copies of step j have landed
      }
      if (j < J) {
        const bool item_end = cs + 1 == spw;
        // B of the next step: this item's next K step, or the next item's first (stale registers for a lane
        // without a column there: that column's accumulators are never stored, and MMA columns are independent)
        const __nv_bfloat16* bnext = item_end ? bnext_item : (bcur != nullptr ? bcur + (cs + 1) * bstride : nullptr);
        WeightStep& st = ring[kSmem ? 0 : s];
        if (kSmem) read_stage<kScaleF32>(st, my_ring + s * kStageBytes, lane, c);
        if (kDiag == kDiagCompute) make_opaque(st);
        if (kDiag == kDiagLoads)
          diag_fold_step(fold, st, op, bnext);
        else if (kAcc == 2)
          compute_step(acc, acc1, st, op, bnext);
        else
          compute_step(acc, st, op, bnext);
        if (item_end) {
          epilogue(item_at(R, cic.v, cic.tile, kTileRows));
#pragma unroll
          for (int t = 0; t < kTiles; ++t)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][i] = acc1[t][i] = 0.f;
          cs = 0;
          ++ck;
          advance(cic, g_div, g_mod, tiles);
          bcur = bnext_item;
          bnext_item = nullptr;
          if (ck + 1 < nmy) {
            ItemCursor n2 = cic;
            advance(n2, g_div, g_mod, tiles);
            bnext_item = brow_at(item_at(R, n2.v, n2.tile, kTileRows), true);
          }
        } else {
          ++cs;
        }
      }
    }
  }
  if (kGemm == 1) return;

  // ---- gemm2: combine ------------------------------------------------------------------------------------
  pdl_launch_dependents();
  __threadfence();   // this thread's y stores are visible before any count that covers them
  group_bar(gr);
  if (gr.gq == 0) {
    // lane = (item k0 + lane / 8, column lane % 8); 8 rounds of 4 items issue their atomics before any combine
    for (int kb = 0; kb < nmy; kb += 32) {
      unsigned last_bits = 0;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int k = kb + 4 * r + (lane >> 3), col = lane & 7;
        if (k < nmy) {
          const int i = gr.gid + k * gr.G;
          const Item it = item_of(R, i, tiles, kGemm2Rows);
          if (col < it.n) {
            const int t = R.cols[it.off + col] / topk;
            const int old = atomicAdd(&p.counters[(int64_t)t * tiles2 + it.n0 / kGemm2Rows], 1);
            if (old + 1 == valid_slots_of_token(R, t, topk)) last_bits |= 1u << r;
          }
        }
      }
      if (__any_sync(0xffffffffu, last_bits != 0)) __threadfence();   // acquire: the other warps' y of these tiles
#pragma unroll 1
      for (int r = 0; r < 8; ++r) {
        unsigned m = __ballot_sync(0xffffffffu, (last_bits >> r) & 1u);
        while (m != 0) {   // each completed (token, tile) by the whole warp
          const int src = __ffs(m) - 1;
          m &= m - 1;
          const Item it = item_of(R, gr.gid + (kb + 4 * r + (src >> 3)) * gr.G, tiles, kGemm2Rows);
          combine_token_tile(p, R, R.cols[it.off + (src & 7)] / topk, it.n0, lane);
        }
      }
    }
  }
  // tokens without a valid slot: nobody combines them
  const int gw = (int)blockIdx.x * kWarps + warp, W = (int)gridDim.x * kWarps;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  for (int64_t idx = (int64_t)gw * 32 + lane; idx < p.M * tiles2; idx += (int64_t)W * 32) {
    const int t = (int)(idx / tiles2), n0 = (int)(idx % tiles2) * kGemm2Rows;
    if (valid_slots_of_token(R, t, topk) == 0)
      for (int i = 0; i < kGemm2Rows; ++i) out[(int64_t)t * p.out_stride + n0 + i] = __float2bfloat16_rn(0.f);
  }
}

}  // namespace stream
}  // namespace fp4moe
}  // namespace dsv4
