// Plain POD parameter block for the sparse FP8 MLA decode kernel.
// Every field is 8 bytes wide (pointer, int64_t or double) so the ctypes mirror in
// deepseek_v4_kernel/_ext.py has no padding surprises. Keep the order in sync.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Most position-list splits per call (the combine kernel holds the split lse values in two registers
// per lane); checked once at the C ABI (api.cu). Python's ops/sparse_decode.MAX_SPLITS matches it.
#define DSV4_SPARSE_DECODE_MAX_SPLITS 64

typedef struct SparseDecodeParams {
  const void* q;            // bf16 [b, s_q, h_q, 512]; last dim contiguous
  int64_t q_stride_b;       // strides in elements
  int64_t q_stride_s;
  int64_t q_stride_h;

  const void* k_cache;      // uint8 paged fp8_ds_mla cache (main)
  int64_t k_page_stride;    // bytes between pages (stride(0) of the uint8 view)
  int64_t k_page_size;      // tokens per page
  int64_t k_num_pages;
  const int32_t* indices;   // int32 [b, s_q, topk]
  int64_t idx_stride_b;     // strides in elements
  int64_t idx_stride_s;
  int64_t idx_stride_k;
  int64_t topk;
  const int32_t* topk_length;   // int32 [b] or NULL
  int64_t topk_length_stride;

  const void* extra_k_cache;    // NULL when no extra cache
  int64_t extra_page_stride;
  int64_t extra_page_size;
  int64_t extra_num_pages;
  const int32_t* extra_indices;
  int64_t extra_idx_stride_b;
  int64_t extra_idx_stride_s;
  int64_t extra_idx_stride_k;
  int64_t extra_topk;           // 0 when no extra cache
  const int32_t* extra_topk_length;
  int64_t extra_topk_length_stride;

  const float* attn_sink;   // fp32 [h_q] or NULL

  void* out;                // bf16 [b, s_q, h_q, 512] contiguous
  float* lse;               // fp32 [b, h_q, s_q] contiguous
  float* o_part;            // fp32 [num_splits, b*s_q, h_q, 512] (only when num_splits > 1)
  float* lse_part;          // fp32 [num_splits, b*s_q, h_q]

  int64_t b;
  int64_t s_q;
  int64_t h_q;
  int64_t num_splits;       // >= 1
  int64_t split_tokens;     // positions (of topk + extra_topk) per split, multiple of the token tile
  double softmax_scale;
  int64_t impl;             // 0: SIMT kernel (16 heads/block), 1: mma.sync kernel (32 heads/block),
                            // 2: mma64 kernel (64 heads/block), 3 / 4: mma64 kernel with 32 / 16 heads/block,
                            // 5: warp-specialised 64-head kernel (kernel_ws.cuh), 6 / 7: the same with 32 / 16
                            //    heads/block, 8: 16 heads/block with the deep gather (two staging areas)
  int64_t plain_launch;     // 1: the call's first grid is launched without PDL, so none of its blocks gets resident
                            // before the previous kernel of the stream has completed (ops/sparse_decode.py sets it
                            // on the whole waves of a batch it cuts, launched after the rest; see batch_parts);
                            // 0: with PDL
} SparseDecodeParams;

#ifdef __cplusplus
}
#endif
