// Sparse FP8 MLA decode, warp-specialised block of 64 heads ("mma64ws", impl 5) or 32 / 16 heads
// ("mma64wsh32" / "mma64wsh16", impl 6 / 7; template MT = heads / 16). Same contract, split-KV scheme, staging and
// dequantisation as kernel_mma64.cuh; instructions shared by SM90 and SM120 only (mma.sync m16n8k16 bf16, ldmatrix,
// cp.async, named barriers, setmaxnreg).
//
// Why: the 8-warp mma64 block holds Q (64 registers) and O (128) in every warp, so it runs two warps per
// scheduler, the S, softmax and PV phases of a tile one after the other, and the tensor pipe idles in
// the softmax and the S partial exchange (27 % of the mma.sync ceiling at b = 128, docs/sparse_decode.md
// H100). Here the two register-hungry states live in different warps, and the two phases of
// consecutive tiles run at the same time:
//   S warps  (kWsSWarps = 4, warps 8..11, one per scheduler): warp mq holds Q of heads 16 mq .. 16 mq + 15
//            over all 512 dims (128 registers, no partials to exchange), computes S of tile i from K/V
//            buffer i % 2, the online softmax of its rows, and writes P and alpha of tile i into their
//            buffer i % 2.
//   PV warps (kWsPvWarps = 8, warps 0..7, two per scheduler): warp w owns O[64 heads, dims 64 w ..
//            64 w + 63] (128 registers), does O = O * alpha + P V of tile i, then dequantises tile i + 2
//            from the staging rows into buffer i % 2 (chunk w, lane = token) and issues the cp.async of
//            tile i + 3; the PV warps also do the prologue (tiles 0 and 1) and the epilogue.
//   So while the PV warps work on tile i, the S warps work on tile i + 1: 3 warps per scheduler, all
//   issuing mma.sync. 384 threads get 168 registers each; setmaxnreg (sm_90a and sm_120a) then moves
//   registers from the PV warps (kWsPvRegs = 160) to the S warps (kWsSRegs = 184): with 168 the S loop had
//   no register to load K fragments ahead and ran 1.24x slower at b = 128 (H100).
// 32 / 16 heads (MT = 2 / 1; a TP rank's heads, H100): the same roles, with the 4 S warps splitting S over the
// dims (warp w: m16 tile w % MT, dims 128 MT (w / MT) ..; 64 / 32 registers of Q) and the warps w / MT > 0 handing
// their partials to the softmax warps w / MT = 0 through the P region's tail (barriers kWsBarSxFull / kWsBarSxFree,
// among the S warps); the PV warps own MT m16 tiles of O, so a tile costs them the dequantisation and the gather
// issue plus a quarter / half of the P V. Why: the 8-warp kernel with one or two m16 tiles issues a tile's copies
// with every warp, then waits for them behind a short S and softmax, three block barriers per tile; here the PV
// warps' gather of the next tiles overlaps the S warps' work (H100: 0.83-0.92x the 8-warp kernel's time on
// every 16 / 32-head launch with >= 9 tiles per block). No setmaxnreg: 168 registers are enough for both kinds.
// 16 heads with a deep gather ("mma64wsh16deep", impl 8; kDeep, H100): the H100 ablations say the 16 / 32-head
// blocks gain nothing from running S(i + 1) next to P V(i) (no S or P V mma loop: 0.97-1.01x) and wait on the rows;
// so here K/V buffer 1's space is a second staging area for good: one bf16 K/V tile, each tile runs dequantisation ->
// S -> softmax -> P V in turn while the rows of the next two tiles are in flight (one before). H100: 0.88-0.97x the
// two-buffer block's time from 4 tiles per block (0.88-0.92x from 10), up to 3 % slower with 3; 32-head blocks gained
// nothing (0.97-1.02x), hence MT = 1 only, and "auto" takes it from DEEP_MIN_TILES tiles per block
// (ops/sparse_decode.py).
// Not SM80 ISA: setmaxnreg (arch-specific targets only: ws_setmaxnreg).
// Hand-offs (named barriers, count = producers' bar.arrive + consumers' bar.sync):
//   kWsBarKReady + j (384): PV warps -> S warps, K/V buffer j holds its next tile (and its valid flags)
//   kWsBarPReady + j (256 + 32 MT): softmax S warps -> PV warps, P / alpha buffer j hold the tile of buffer j
//   kWsBarPv (256): among the PV warps, around the staging area and the K/V buffer they rewrite.
// A buffer's next use is ordered by these alone: the S warps rewrite P / alpha j (tile i + 2) only after
// kWsBarKReady + j for tile i + 2, which the PV warps arrive at after PV(i) has read P / alpha j.
#pragma once
#include "kernel_mma64.cuh"

namespace dsv4 {

constexpr int kWsPvWarps = 8;
constexpr int kWsSWarps = 4;                                     // kM64Heads / 16: one m16 tile each
constexpr int kWsPvThreads = 32 * kWsPvWarps;                    // 256 = 8 threads per token of a tile
constexpr int kWsThreads = 32 * (kWsPvWarps + kWsSWarps);        // 384
// registers per thread: the launch gives each thread 65536 / 384 -> 168 (multiple of 8); the PV warps give
// 8 of theirs to the S warps (256 * 8 / 128 = 16 more each)
constexpr int kWsLaunchRegs = 65536 / kWsThreads / 8 * 8;        // 168
constexpr int kWsPvRegs = 160;
constexpr int kWsSRegs = (kWsLaunchRegs * kWsThreads - kWsPvThreads * kWsPvRegs) / (kWsThreads - kWsPvThreads) / 8 * 8;
static_assert(kWsSRegs == 184, "register split: PV warps 160, S warps 184");
constexpr int kWsBarPv = 1, kWsBarKReady = 2, kWsBarPReady = 4;  // named barrier ids (0 = __syncthreads)
constexpr int kWsBarSxFull = 6, kWsBarSxFree = 7;                // MT < 4: the S warps' partials (among the S warps)
// shared memory (64 heads: padded K/V rows of kKPitch bf16, as the unsplit mma64 kernel; 16 / 32 heads: swizzled rows of
// kDim bf16 in the same space, see kSwz in the kernel):
constexpr int kWsSmemStage = kM64StageBytes;                     // 18816 B raw rows, scales, flags of one tile
constexpr int kWsSmemK = 2 * kM64Tok * kKPitch * 2;              // 66560 B two bf16 K/V tiles
constexpr int kWsSmemP = 2 * kM64Heads * kPPitch * 2;            // 10240 B two P tiles (bf16, pitch 40)
constexpr int kWsSmemAlpha = 2 * kM64Heads * 4;                  //   512 B two alpha vectors
constexpr int kWsSmemValid = 2 * kM64Tok * 4;                    //   256 B valid flags per K/V buffer
constexpr int kWsSmemML = 5 * kM64Heads * 4;                     //  1280 B final m, l, lse, factor, attn_sink
constexpr int kWsSmemIdx = 4 * kM64Tok * 4;                      //   512 B raw slot indices, next 2 (deep: 4) tiles
// + 128 B of slack: the 16 / 32-head blocks keep their K/V tiles in kernel_mma64.cuh's XOR-swizzled layout (rows of
// 1024 B, see kM64KTile; the XOR addresses need 128-byte-aligned rows) and align their regions themselves
constexpr int kWsSmemBytes =
    kWsSmemStage + kWsSmemK + kWsSmemP + kWsSmemAlpha + kWsSmemValid + kWsSmemML + kWsSmemIdx + 128;  // 98304 B
static_assert(kWsSmemBytes <= 101376, "SM120: at most 101376 B dynamic smem per block");
static_assert(kWsPvThreads == kM64Tok * 8, "cp.async mapping: 8 threads per token");
static_assert(kWsSWarps * 16 == kM64Heads && kWsPvWarps * 64 == kDim, "warp roles cover the block");
static_assert(kWsPvWarps * kM64WarpScratch <= kWsSmemStage + kWsSmemK, "the epilogue's scratch: staging + K/V buffers");
static_assert(kWsSWarps * 2048 <= kWsSmemP, "ws_load_q: 2 KB of the P buffers per S warp");

// setmaxnreg exists for the arch-specific ("a") targets only (sm_90a, sm_100a, sm_120a, ...; both builds of this
// library are such targets). Built for another arch the kernel keeps 168 registers in every warp: the same
// results, with a slower S loop.
template <int kRegs, bool kInc>
__device__ __forceinline__ void ws_setmaxnreg() {
#if defined(__CUDA_ARCH_SPECIFIC__)
  if constexpr (kInc)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Q A-fragments of an S warp (heads hl0 .. hl0 + 15, dims d0 .. d0 + 16 kKSteps - 1) through 2 KB of shared memory
// `sw` (the S warps' Q loads are done before any of them writes P or partials: kWsBarSxFree after the load): whole
// 128-byte rows by 16-byte loads (8 lanes per row), written into sw (16-byte piece k of row r at k ^ (r & 7)) and read
// back as A-fragments by ldmatrix, 64 dims at a time. Why: the SM moves global data at a rate per 32-byte sector
// however full (an inference from H100 traces), and the 4-byte fragment loads of m64_load_q fill half sectors: a
// 64-head block's Q reached the S warps ~6 us after the start at b = 128, this way ~5 us (~5 -> ~3.2 at b = 32).
// Alone that did not shorten the call (the P V warps' two first tiles were the longer chain); with the prologue
// that fetches both at once (below) the call is ~1.5 % faster at b 4-32 (median; up to 5 %), the same at b >= 128.
// Every load is issued before the first store (the raw rows wait in qf: chunk c's 64 dims in qf[4 c .. 4 c + 3],
// which its ldmatrix results then replace). Rows need 16-byte alignment (strides multiples of 8 elements, 16-byte
// aligned base), else m64_load_q.
template <int kKSteps>
__device__ __forceinline__ void ws_load_q(const SparseDecodeParams& p, uint32_t (&qf)[kKSteps][4], int64_t bi,
                                          int64_t si, int hl0, int h_end, int d0, int lane, unsigned char* sw) {
  if (((p.q_stride_b | p.q_stride_s | p.q_stride_h) & 7) != 0 || ((uintptr_t)p.q & 15) != 0) {
    m64_load_q<kKSteps>(p, qf, bi, si, hl0 + (lane >> 2), h_end, d0, lane & 3);
    return;
  }
  const __nv_bfloat16* q = (const __nv_bfloat16*)p.q + bi * p.q_stride_b + si * p.q_stride_s + d0;
  const int k = lane & 7;
#pragma unroll
  for (int c = 0; c < kKSteps / 4; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = hl0 + 4 * j + (lane >> 3);
      const uint4 v = h < h_end ? __ldg((const uint4*)(q + (int64_t)h * p.q_stride_h + 64 * c + 8 * k))
                                : make_uint4(0u, 0u, 0u, 0u);
      qf[4 * c + j][0] = v.x; qf[4 * c + j][1] = v.y; qf[4 * c + j][2] = v.z; qf[4 * c + j][3] = v.w;
    }
#pragma unroll
  for (int c = 0; c < kKSteps / 4; ++c) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = 4 * j + (lane >> 3);
      *(uint4*)(sw + r * 128 + ((k ^ (r & 7)) << 4)) =
          make_uint4(qf[4 * c + j][0], qf[4 * c + j][1], qf[4 * c + j][2], qf[4 * c + j][3]);
    }
    __syncwarp();
    // ldmatrix.x4 of k-step kk: lanes 0-15 address rows 0-15 at piece 2 kk, lanes 16-31 the same rows at 2 kk + 1
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      ldmatrix_x4(qf[4 * c + kk], sw + (lane & 15) * 128 + (((2 * kk + (lane >> 4)) ^ (lane & 7)) << 4));
    __syncwarp();
  }
}

// MT: m16 tiles of heads per block (4: 64 heads; 2 / 1: 32 / 16, impl 6 / 7). With MT < 4 the 4 S warps split the dims
// of S (warp w: m16 tile w % MT, dims [128 MT (w / MT), +128 MT)) and the warps w / MT > 0 hand their partials to the
// warps w / MT = 0 (softmax) through the P region's tail (see kWsSmemP); the P V warps own MT m16 tiles of O.
// kDeep ("mma64wsh16deep", impl 8; MT = 1 only, see the file comment): one bf16 K/V buffer, the second one's space a
// second staging area.
template <int MT, bool kDeep = false>
__global__ void __launch_bounds__(kWsThreads, 1)
sparse_decode_ws_kernel(const SparseDecodeParams p) {
  static_assert(MT == 4 || MT == 2 || MT == 1, "m16 tiles per block: 4, 2 or 1");
  static_assert(!kDeep || MT == 1, "the deep gather: 16-head blocks only (H100: 32-head ones gained nothing)");
  constexpr int kHeads = 16 * MT;               // heads per block
  constexpr int kSDims = kDim * MT / kWsSWarps; // dims of S per S warp: 512 / 256 / 128
  constexpr int kSKSteps = kSDims / 16;
  // kWsBarPReady + j: the P V warps sync, the MT softmax S warps (w / MT = 0) arrive
  constexpr int kPReadyThreads = kWsPvThreads + 32 * MT;
  // K/V tiles XOR-swizzled for 16 / 32 heads per block (kernel_mma64.cuh's layout; the dequantisation's 16-byte stores
  // are 2-way bank conflicted in the padded one, 4.2-way on average over the 64-head kernel's shared stores by Nsight
  // Compute). H100: 0.960-1.002x the padded layout's time on the 20 rows of the A/B that launch 16 / 32-head
  // blocks (19 of them faster), but 1.004-1.026x on the 10 that launch 64-head blocks (as the 8-warp kernel's unsplit
  // 64-head blocks, H100), which stay padded
  constexpr bool kSwz = MT < 4;
  constexpr int kPitchKV = kSwz ? kDim : kKPitch;   // bf16 elements per K/V row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* const smem = kSwz ? smem_raw + m64_align128_offset(smem_raw) : smem_raw;
  pdl_launch_dependents();   // the combine grid gets scheduled early; it waits for this grid's completion
  pdl_wait();                // inputs written by the previous kernel of the stream are visible
  unsigned char* ring = smem;
  __nv_bfloat16* Kb = (__nv_bfloat16*)(smem + kWsSmemStage);
  __nv_bfloat16* Pb = (__nv_bfloat16*)(smem + kWsSmemStage + kWsSmemK);
  float* Ab = (float*)(smem + kWsSmemStage + kWsSmemK + kWsSmemP);
  int* Vf = (int*)(Ab + 2 * kM64Heads);
  float* Mf = (float*)(Vf + 2 * kM64Tok);   // final m, l, and (no split) lse and output factor of each head row
  float* Lf = Mf + kM64Heads;
  float* Lse = Lf + kM64Heads;
  float* Inv = Lse + kM64Heads;
  float* Sf = Inv + kM64Heads;
  int* Ix = (int*)(Sf + kM64Heads);
  constexpr int kTileKV = kM64Tok * kPitchKV;   // bf16 elements per K/V buffer
  constexpr int kTileP = kHeads * kPPitch;     // bf16 elements per P buffer
  // MT < 4: the partial S of the warps w / MT > 0, (4 - MT) of them, 16 rows of kSxPitch floats each, after the two P
  // buffers: 2 x 16 MT x kPPitch bf16 + (4 - MT) x 16 x kSxPitch floats = 10240 B = kWsSmemP for every MT
  float* const Sx = (float*)(Pb + 2 * kTileP);
  static_assert(2 * kTileP * 2 + (4 - MT) * 16 * kSxPitch * 4 <= kWsSmemP, "P buffers + S partials: the P region");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int head_blocks = (int)((p.h_q + kHeads - 1) / kHeads);
  const int64_t row = blockIdx.x / head_blocks;
  const int h0 = (int)(blockIdx.x - row * head_blocks) * kHeads;
  const int h_end = (int)min((int64_t)h0 + kHeads, p.h_q);
  const int64_t bi = row / p.s_q, si = row - bi * p.s_q;
  const int split = blockIdx.z;
  const int64_t total = p.topk + p.extra_topk;
  const int64_t pos_begin = (int64_t)split * p.split_tokens;
  const int64_t pos_end = min(total, pos_begin + p.split_tokens);
  const int64_t ntiles = pos_end > pos_begin ? (pos_end - pos_begin + kM64Tok - 1) / kM64Tok : 0;

  if (warp >= kWsPvWarps) {
    // ================= S warps: S = Q K^T and the online softmax of heads 16 mq .. 16 mq + 15 =================
    if constexpr (MT == 4) ws_setmaxnreg<kWsSRegs, true>();
    const int sw = warp - kWsPvWarps, mq = MT == 4 ? sw : sw % MT, kq = MT == 4 ? 0 : sw / MT;
    uint32_t qf[kSKSteps][4];   // A-fragments: heads h0 + 16 mq + g (+8), dims kSDims kq + 16 ks + 2 t4 (+8)
    // through 2 KB of the P region per S warp; the P rows and partials of other S warps overlap it, hence the barrier
    // (earlier the 64-head kernel relied on P of tile 0 coming two global round trips after the Q loads)
    ws_load_q<kSKSteps>(p, qf, bi, si, h0 + mq * 16, h_end, kSDims * kq, lane, (unsigned char*)Pb + sw * 2048);
    named_bar_sync(kWsBarSxFree, 32 * kWsSWarps);   // every S warp's Q is out of the P region
    // the sink values of the rows' final factors, loaded here while the first tile is staged (lane t4 = 0 reads them
    // in m64_store_final; as registers of the PV warps, who used to apply them, they made ptxas spill, H100)
    if (kq == 0 && t4 == 0) {
      const int hl = h0 + mq * 16 + g, hh = hl + 8;
      const bool with_sink = p.num_splits == 1 && p.attn_sink != nullptr;
      Sf[mq * 16 + g] = with_sink && hl < h_end ? p.attn_sink[hl] : 0.f;
      Sf[mq * 16 + g + 8] = with_sink && hh < h_end ? p.attn_sink[hh] : 0.f;
    }
    const float scale2 = (float)(p.softmax_scale * 1.4426950408889634);
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;   // rows g, g + 8 of this m16 tile
    for (int64_t it = 0; it < ntiles; ++it) {
      const int buf = (int)(it & 1);
      named_bar_sync(kWsBarKReady + buf, kWsThreads);   // buffer buf holds tile it
      const int kbuf = kDeep ? 0 : buf;   // deep: one K/V buffer
      const __nv_bfloat16* Ks = Kb + kbuf * kTileKV;
      const int* vf = Vf + kbuf * kM64Tok;
      float sacc[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.f;
      // B-fragments: ldmatrix.x4 = 2 k-steps of one n-tile (tokens 8 j ..), lane addresses as kernel_mma64.cuh's
      const M64KFrags<kSwz> kfrag(Ks, kSDims * kq, lane);
#pragma unroll
      for (int ks = 0; ks < kSKSteps; ks += 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t b[4];
          kfrag.load(b, j, ks);
          mma_bf16_16816(sacc[j], qf[ks], b);
          mma_bf16_16816(sacc[j], qf[ks + 1], b + 2);
        }
      }
      if constexpr (MT < 4) {
        // partials: warps kq > 0 write theirs (after the softmax warps have read the previous tile's: SxFree) and
        // go on to the next tile; the softmax warps add them in kq order (the same order on every launch)
        float* const sxw = Sx + ((kq - 1) * MT + mq) * 16 * kSxPitch;
        if (kq > 0) {
          if (it > 0) named_bar_sync(kWsBarSxFree, 32 * kWsSWarps);
          float* sx = sxw + g * kSxPitch + 2 * t4;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            *(float2*)(sx + 8 * j) = make_float2(sacc[j][0], sacc[j][1]);
            *(float2*)(sx + 8 * kSxPitch + 8 * j) = make_float2(sacc[j][2], sacc[j][3]);
          }
          named_bar_arrive(kWsBarSxFull, 32 * kWsSWarps);
          continue;
        }
        named_bar_sync(kWsBarSxFull, 32 * kWsSWarps);
#pragma unroll
        for (int r = 0; r < kWsSWarps / MT - 1; ++r) {
          const float* sx = Sx + (r * MT + mq) * 16 * kSxPitch + g * kSxPitch + 2 * t4;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 lo = *(const float2*)(sx + 8 * j);
            const float2 hi = *(const float2*)(sx + 8 * kSxPitch + 8 * j);
            sacc[j][0] += lo.x; sacc[j][1] += lo.y; sacc[j][2] += hi.x; sacc[j][3] += hi.y;
          }
        }
        if (it + 1 < ntiles) named_bar_arrive(kWsBarSxFree, 32 * kWsSWarps);
      }
      m64_softmax_tile(sacc, vf, scale2, m_lo, m_hi, l_lo, l_hi, Pb + buf * kTileP, Ab + buf * kM64Heads, mq * 16 + g,
                       t4);
      named_bar_arrive(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it in buffer buf
    }
    if (kq == 0)
      m64_store_final(m_lo, m_hi, l_lo, l_hi, Sf, p.num_splits == 1, p.attn_sink != nullptr, Mf, Lf, Lse, Inv,
                      mq * 16 + g, t4);
    __syncthreads();   // E: each row's final m, l (lse, factor) visible to the PV warps, which store the output
    return;
  }

  // ================= PV warps: gather, dequantisation, O = O * alpha + P V, epilogue =================
  if constexpr (MT == 4) ws_setmaxnreg<kWsPvRegs, false>();
  int64_t main_lim, extra_lim;
  slot_limits(p, bi, &main_lim, &extra_lim);
  // cp.async of one tile's raw rows into the staging area (kernel_mma64.cuh's m64_stage_rows)
  const int gn = tid >> 3, gj = tid & 7;
  auto issue = [&](int64_t t0, int raw_idx) {
    m64_stage_rows(p, ring, t0, raw_idx, gn, gj, pos_end, main_lim, extra_lim);
  };
  // chunk c = warp (0..6 fp8 NoPE, 7 RoPE copy) of every token (lane = token) from the staged rows at src (the staging
  // area; tile 0: see below) into K/V buffer buf, exact; rotated 16-byte order (conflict-free staging reads). Chunk 0
  // also copies the flags.
  auto dequant = [&](int buf, const unsigned char* src) {
    const int n = lane, c = warp;
    if (c == 0) Vf[buf * kM64Tok + n] = ((const int*)(src + kM64StageData + kM64StageScale))[n];
    unsigned char* dst = (unsigned char*)(Kb + buf * kTileKV + n * kPitchKV + c * 64);
    const int sw = kSwz ? (n & 7) : 0;   // swizzled: 16-byte unit u of the chunk at u ^ (n & 7)
    if (c < 7) {
      const float sc = ue8m0_to_float(src[kM64StageData + n * kScaleBytes + c]);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // staging unit kk: distinct among the rows of one parity in a quarter warp (conflict-free reads); swizzled,
        // the stores too (m64_swz_nope_unit)
        const int kk = kSwz ? m64_swz_nope_unit(n, s) : (s + (n >> 1)) & 3;
        const uint4 raw = *(const uint4*)(src + n * kRowBytes + c * 64 + 16 * kk);
        uint4 o0, o1;
        o0.x = e4m3x2_to_bf16x2(raw.x, sc); o0.y = e4m3x2_to_bf16x2(raw.x >> 16, sc);
        o0.z = e4m3x2_to_bf16x2(raw.y, sc); o0.w = e4m3x2_to_bf16x2(raw.y >> 16, sc);
        o1.x = e4m3x2_to_bf16x2(raw.z, sc); o1.y = e4m3x2_to_bf16x2(raw.z >> 16, sc);
        o1.z = e4m3x2_to_bf16x2(raw.w, sc); o1.w = e4m3x2_to_bf16x2(raw.w >> 16, sc);
        ((uint4*)dst)[(2 * kk) ^ sw] = o0;
        ((uint4*)dst)[(2 * kk + 1) ^ sw] = o1;
      }
    } else {
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int kk = kSwz ? m64_swz_rope_unit(n, s) : (s + (n >> 1)) & 7;
        ((uint4*)dst)[kk ^ sw] = *(const uint4*)(src + n * kRowBytes + kNope + 16 * kk);
      }
    }
  };
  constexpr int kIxMask = kDeep ? 3 : 1;   // Ix slots: 2 (deep: 4)
  // raw slot index of tile t's token gn -> Ix[t % 2][gn] (deep: Ix[t % 4]) by a 4-byte cp.async committed with the
  // rows of tile t - 1 (deep: t - 2), so that no register holds it in flight (one did, and ptxas spilled it: the spill
  // store waited for the load, ~1000 cycles per tile, H100). A position beyond the split reads nothing; it resolves
  // to -1.
  auto index_async = [&](int64_t t) {
    if (gj != 0) return;
    const int64_t pos = pos_begin + t * kM64Tok + gn;
    const int32_t* src = p.indices;
    int nb = 0;
    if (pos < pos_end) {
      nb = 4;
      src = pos < p.topk ? p.indices + bi * p.idx_stride_b + si * p.idx_stride_s + pos * p.idx_stride_k
                         : p.extra_indices + bi * p.extra_idx_stride_b + si * p.extra_idx_stride_s +
                               (pos - p.topk) * p.extra_idx_stride_k;
    }
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(Ix + (int)(t & kIxMask) * kM64Tok + gn);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(nb));
  };
  // tile t from the staging area into K/V buffer t % 2, handed to the S warps; then the copies of tile t + 1
  // (slot indices from Ix) and the slot indices of tile t + 2
  auto stage_next = [&](int64_t t) {
    cp_async_wait<0>();
    named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile t landed; buffer t % 2 is no longer read
    dequant((int)(t & 1), ring);
    named_bar_sync(kWsBarPv, kWsPvThreads);    // the staging area is free
    named_bar_arrive(kWsBarKReady + (int)(t & 1), kWsThreads);
    if (t + 1 < ntiles) issue(pos_begin + (t + 1) * kM64Tok, Ix[(int)((t + 1) & 1) * kM64Tok + gn]);
    if (t + 2 < ntiles) index_async(t + 2);
    cp_async_commit();
  };

  // tiles 0 and 1 fetched at once (both slot indices, then both tiles' rows). Not deep: tile 0's raw rows in K/V
  // buffer 1's space (nothing is in it before tile 1 is dequantised there), tile 1's in the staging area (before
  // tile 1's rows went out only after tile 0 was dequantised, one more global round trip before the first P V). Deep:
  // K/V buffer 1's space is the second staging area for good, tile k's rows in staging area k % 2; copy group G(k) =
  // the rows of tile k + the slot indices of tile k + 2 (Ix slot (k + 2) % 4), committed for every k (empty or not).
  unsigned char* const ring1 = (unsigned char*)(Kb + kTileKV);
  const int raw0 = ntiles > 0 ? slot_load(p, bi, si, pos_begin + gn, pos_end) : -1;
  const int raw1 = ntiles > 1 ? slot_load(p, bi, si, pos_begin + kM64Tok + gn, pos_end) : -1;
  if constexpr (kDeep) {
    if (ntiles > 0) issue(pos_begin, raw0);
    if (ntiles > 2) index_async(2);
    cp_async_commit();
    if (ntiles > 1) m64_stage_rows(p, ring1, pos_begin + kM64Tok, raw1, gn, gj, pos_end, main_lim, extra_lim);
    if (ntiles > 3) index_async(3);
    cp_async_commit();
  } else {
    if (ntiles > 0) m64_stage_rows(p, ring1, pos_begin, raw0, gn, gj, pos_end, main_lim, extra_lim);
    cp_async_commit();
    if (ntiles > 1) issue(pos_begin + kM64Tok, raw1);
    if (ntiles > 2) index_async(2);
    cp_async_commit();
  }
  float acc[4][8][4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;
  if constexpr (!kDeep) {
    if (ntiles > 0) {
      cp_async_wait<1>();
      named_bar_sync(kWsBarPv, kWsPvThreads);    // every copy of tile 0 landed
      dequant(0, ring1);
      named_bar_sync(kWsBarPv, kWsPvThreads);    // K/V buffer 1's space is free for tile 1
      named_bar_arrive(kWsBarKReady, kWsThreads);
    }
    if (ntiles > 1) stage_next(1);
  }

  for (int64_t it = 0; it < ntiles; ++it) {
    const int buf = (int)(it & 1);
    if constexpr (kDeep) {
      // tile it: G(it) landed (G(it + 1) may still be in flight) and every P V warp is past P V(it - 1), the last
      // reader of the K/V buffer (the S warps read it before P ready(it - 1)): dequantise tile it into it, hand it to
      // the S warps, then fetch tile it + 2 into the staging area it came from. stage_next's steps with other buffers;
      // as one routine for both (in a review) the deep kernel's register allocation changed and it ran 1.0 %
      // slower (median of 16 launch shapes, H100), so the two stay apart
      unsigned char* const rg = (it & 1) ? ring1 : ring;
      cp_async_wait<1>();
      named_bar_sync(kWsBarPv, kWsPvThreads);    // tile it's rows and tile it + 2's slot indices visible to all
      dequant(0, rg);
      named_bar_sync(kWsBarPv, kWsPvThreads);    // staging area rg free
      named_bar_arrive(kWsBarKReady + buf, kWsThreads);
      if (it + 2 < ntiles) {
        const int64_t t2 = it + 2;
        m64_stage_rows(p, rg, pos_begin + t2 * kM64Tok, Ix[(int)(t2 & kIxMask) * kM64Tok + gn], gn, gj, pos_end,
                       main_lim, extra_lim);
      }
      if (it + 4 < ntiles) index_async(it + 4);
      cp_async_commit();
    }
    named_bar_sync(kWsBarPReady + buf, kPReadyThreads);   // P, alpha of tile it
    const __nv_bfloat16* Ks = Kb + (kDeep ? 0 : buf) * kTileKV;
    const __nv_bfloat16* Ps = Pb + buf * kTileP;
    m64_rescale_o<MT>(acc, Ab + buf * kM64Heads, g);
#pragma unroll
    for (int kk = 0; kk < kM64Tok; kk += 16) {
      uint32_t pa[4][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) ldmatrix_x4(pa[m], Ps + (m * 16 + (lane & 15)) * kPPitch + kk + 8 * (lane >> 4));
      const M64VFrags<kSwz> vfrag(Ks, kk, 64 * warp, lane);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bb[4];
        vfrag.load(bb, np);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma_bf16_16816(acc[m][2 * np], pa[m], bb);
          mma_bf16_16816(acc[m][2 * np + 1], pa[m], bb + 2);
        }
      }
    }
    if (!kDeep && it + 2 < ntiles) stage_next(it + 2);
  }
  cp_async_wait<0>();

  // ---- epilogue (m64_store_rows, as the 8-warp kernel's): unsplit, each row's lse and factor as the S warps left
  //      them, the bf16 rows staged in the staging area + K/V buffers (free now: every copy landed, every warp is
  //      past E); split, the factors from the final m, l here, as before
  __syncthreads();   // E
  auto final_of = [&](int, int, int r) {
    return p.num_splits == 1 ? RowFinal{Lse[r], Inv[r]} : finalize_row(Mf[r], Lf[r], false, 0.f);
  };
  m64_store_rows<MT, true>(p, acc, final_of, row, bi, si, split, h0, h_end, warp, g, t4, smem);
}

}  // namespace dsv4
