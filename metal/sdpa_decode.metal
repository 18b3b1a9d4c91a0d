// Decode attention for rlx_triton's Metal backend: a few query tokens against a KV cache.
//
// Layouts (contiguous): query (B, Hq, Lq, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv),
// out (B, Hq, Lq, Dv), lse float (B, Hq, Lq), seqlens long (B,) valid keys per sequence,
// mask float (B, Hq, Lq, S) additive (read only when has_mask != 0).
// causal_mode: 0 none, 1 top-left (key j <= query i, torch is_causal), 2 bottom-right within each
// sequence's valid part (key j <= i + seqlen - Lq, the KV-cache convention).
// A query row is one (b, hq, i); query heads share KV head hq / (Hq / Hkv) (GQA/MQA).
//
// Kernels (all fp32 accumulation, T in float/half/bfloat):
//   sdpa_decode_one_pass_<T>: one threadgroup per query row over all its keys.
//   sdpa_decode_split_<T>:    one threadgroup per (row, partition); partition p holds keys
//                             [p * keys_per_partition, (p + 1) * keys_per_partition), writes the
//                             unnormalised partial output, its running max and its sum of exps.
//   sdpa_decode_combine_<T>:  one threadgroup per row merges the partitions (log-sum-exp rescale).
// Inside a threadgroup each simdgroup takes every n_simd-th key, its 32 lanes hold head-dim
// elements lane, lane + 32, ... (D, Dv <= 256), the score is a simd_sum, and the simdgroups' online
// softmax states are merged through threadgroup memory. Rows without any valid key give 0 and
// lse = -inf.
// Non-finite values follow torch's math SDPA over the keys a row's sequence reaches (its valid
// length; under top-left alignment at most Lq keys, the last query token's reach): every such key
// is read, and masking it (causal alignment, the additive mask) adds -inf to its score, so NaN or
// +inf in a query row, a key or the mask gives a NaN row and lse, and NaN or Inf in a value gives
// NaN (0 * NaN). Keys past the reach are never read.
#include <metal_stdlib>
using namespace metal;

constant constexpr int SDPA_LANES = 32;
constant constexpr int SDPA_MAX_PER_LANE = 8;      // head dims up to 32 * 8 = 256
constant constexpr int SDPA_MAX_SIMDGROUPS = 8;    // threadgroups up to 256 threads
constant constexpr int SDPA_MAX_HEAD_DIM = SDPA_LANES * SDPA_MAX_PER_LANE;

// The smaller of two 64-bit ints (written out: no reliance on 64-bit overloads of metal::min).
inline long sdpa_min(long a, long b) {
  return a < b ? a : b;
}

// The keys [0, reach) a sequence's rows read: its valid keys, and under top-left alignment no key
// past the last query token.
inline long sdpa_reach(long valid_keys, long query_len, long causal_mode) {
  return causal_mode == 1 ? sdpa_min(valid_keys, query_len) : valid_keys;
}

// The keys [0, end) that query row i of sequence b may see; the others in its reach are masked.
inline long sdpa_key_end(long valid_keys, long query_index, long query_len, long causal_mode) {
  if (causal_mode == 1) {
    return sdpa_min(valid_keys, query_index + 1);
  }
  if (causal_mode == 2) {
    return sdpa_min(valid_keys, valid_keys - query_len + query_index + 1);
  }
  return valid_keys;
}

// One simdgroup's online softmax over keys key_begin + simd_group, + n_simd, ... < key_end; keys at
// or past visible_end are masked (their score minus infinity).
template <typename T>
inline void sdpa_simdgroup_keys(device const T* query_row, device const T* key_head,
                                device const T* value_head, device const float* mask_row,
                                long has_mask, long head_dim, long head_dim_v, long key_begin,
                                long key_end, long visible_end, float scale, uint lane,
                                uint simd_group, uint n_simd, thread float& running_max,
                                thread float& running_sum, thread float* acc) {
  float q_reg[SDPA_MAX_PER_LANE];
  for (int i = 0; i < SDPA_MAX_PER_LANE; ++i) {
    long d = long(lane) + long(i) * SDPA_LANES;
    q_reg[i] = d < head_dim ? float(query_row[d]) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  running_max = -INFINITY;
  running_sum = 0.0f;
  for (long j = key_begin + long(simd_group); j < key_end; j += long(n_simd)) {
    device const T* key_row = key_head + j * head_dim;
    float partial = 0.0f;
    for (int i = 0; i < SDPA_MAX_PER_LANE; ++i) {
      long d = long(lane) + long(i) * SDPA_LANES;
      if (d < head_dim) {
        partial += q_reg[i] * float(key_row[d]);
      }
    }
    float score = simd_sum(partial);
    if (has_mask != 0) {
      score += mask_row[j];
    }
    if (j >= visible_end) {
      score -= INFINITY;
    }
    // a masked key still takes part with weight 0 (a NaN value stays NaN); max() drops a NaN score,
    // whose weight exp(NaN) then makes the sum NaN
    float new_max = max(running_max, score);
    float safe_max = new_max == -INFINITY ? 0.0f : new_max;
    float correction = exp(running_max - safe_max);
    float weight = exp(score - safe_max);
    running_sum = running_sum * correction + weight;
    device const T* value_row = value_head + j * head_dim_v;
    for (int i = 0; i < SDPA_MAX_PER_LANE; ++i) {
      long d = long(lane) + long(i) * SDPA_LANES;
      float v = d < head_dim_v ? float(value_row[d]) : 0.0f;
      acc[i] = acc[i] * correction + weight * v;
    }
    running_max = new_max;
  }
}

// Merge the simdgroups' states of one threadgroup; every thread returns the merged max and sum,
// and tg_acc holds the merged unnormalised output (head_dim_v floats) after the final barrier.
inline void sdpa_merge_simdgroups(thread float& running_max, thread float& running_sum,
                                  thread float* acc, long head_dim_v, uint lane, uint simd_group,
                                  uint n_simd, uint thread_index, uint threads_per_group,
                                  threadgroup float* tg_max, threadgroup float* tg_sum,
                                  threadgroup float* tg_acc, threadgroup float* tg_merged) {
  if (lane == 0) {
    tg_max[simd_group] = running_max;
    tg_sum[simd_group] = running_sum;
  }
  for (int i = 0; i < SDPA_MAX_PER_LANE; ++i) {
    long d = long(lane) + long(i) * SDPA_LANES;
    if (d < head_dim_v) {
      tg_acc[long(simd_group) * SDPA_MAX_HEAD_DIM + d] = acc[i];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float merged_max = -INFINITY;
  for (uint g = 0; g < n_simd; ++g) {
    merged_max = max(merged_max, tg_max[g]);
  }
  // a state without keys has weight exp(-inf) = 0, and a NaN state stays NaN: none is skipped
  float safe_max = merged_max == -INFINITY ? 0.0f : merged_max;
  float merged_sum = 0.0f;
  for (uint g = 0; g < n_simd; ++g) {
    merged_sum += tg_sum[g] * exp(tg_max[g] - safe_max);
  }
  for (long d = long(thread_index); d < head_dim_v; d += long(threads_per_group)) {
    float value = 0.0f;
    for (uint g = 0; g < n_simd; ++g) {
      value += tg_acc[long(g) * SDPA_MAX_HEAD_DIM + d] * exp(tg_max[g] - safe_max);
    }
    tg_merged[d] = value;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  running_max = merged_max;
  running_sum = merged_sum;
}

template <typename T>
inline void sdpa_decode_one_pass_impl(
    device const T* query, device const T* key, device const T* value, device const float* mask,
    device const long* seqlens, device T* out, device float* lse, long num_heads,
    long num_kv_heads, long query_len, long seq_kv, long head_dim, long head_dim_v, float scale,
    long causal_mode, long has_mask, uint group_id, uint thread_index, uint threads_per_group,
    uint lane, uint simd_group, threadgroup float* tg_max, threadgroup float* tg_sum,
    threadgroup float* tg_acc, threadgroup float* tg_merged) {
  uint n_simd = threads_per_group / SDPA_LANES;
  long row = long(group_id);
  long b = row / (num_heads * query_len);
  long hq = (row / query_len) % num_heads;
  long qi = row % query_len;
  long hkv = hq / (num_heads / num_kv_heads);
  long reach = sdpa_reach(seqlens[b], query_len, causal_mode);
  long visible_end = sdpa_key_end(seqlens[b], qi, query_len, causal_mode);
  device const T* key_head = key + (b * num_kv_heads + hkv) * seq_kv * head_dim;
  device const T* value_head = value + (b * num_kv_heads + hkv) * seq_kv * head_dim_v;
  float running_max;
  float running_sum;
  float acc[SDPA_MAX_PER_LANE];
  sdpa_simdgroup_keys<T>(query + row * head_dim, key_head, value_head, mask + row * seq_kv,
                         has_mask, head_dim, head_dim_v, 0, reach, visible_end, scale, lane,
                         simd_group, n_simd, running_max, running_sum, acc);
  sdpa_merge_simdgroups(running_max, running_sum, acc, head_dim_v, lane, simd_group, n_simd,
                        thread_index, threads_per_group, tg_max, tg_sum, tg_acc, tg_merged);
  // the sum is exactly 0 only when every score was -inf; a NaN sum keeps the row NaN
  float inverse_sum = running_sum == 0.0f ? 0.0f : 1.0f / running_sum;
  for (long d = long(thread_index); d < head_dim_v; d += long(threads_per_group)) {
    out[row * head_dim_v + d] = static_cast<T>(tg_merged[d] * inverse_sum);
  }
  if (thread_index == 0) {
    lse[row] = running_sum == 0.0f ? -INFINITY : running_max + log(running_sum);
  }
}

template <typename T>
inline void sdpa_decode_split_impl(
    device const T* query, device const T* key, device const T* value, device const float* mask,
    device const long* seqlens, device float* partial_out, device float* partial_max_sum,
    long num_heads, long num_kv_heads, long query_len, long seq_kv, long head_dim,
    long head_dim_v, float scale, long causal_mode, long has_mask, long partitions,
    long keys_per_partition, uint group_id, uint thread_index, uint threads_per_group, uint lane,
    uint simd_group, threadgroup float* tg_max, threadgroup float* tg_sum,
    threadgroup float* tg_acc, threadgroup float* tg_merged) {
  uint n_simd = threads_per_group / SDPA_LANES;
  long row = long(group_id) / partitions;
  long partition = long(group_id) % partitions;
  long b = row / (num_heads * query_len);
  long hq = (row / query_len) % num_heads;
  long qi = row % query_len;
  long hkv = hq / (num_heads / num_kv_heads);
  long reach = sdpa_reach(seqlens[b], query_len, causal_mode);
  long visible_end = sdpa_key_end(seqlens[b], qi, query_len, causal_mode);
  long part_begin = partition * keys_per_partition;
  long part_end = sdpa_min(part_begin + keys_per_partition, reach);
  device const T* key_head = key + (b * num_kv_heads + hkv) * seq_kv * head_dim;
  device const T* value_head = value + (b * num_kv_heads + hkv) * seq_kv * head_dim_v;
  float running_max;
  float running_sum;
  float acc[SDPA_MAX_PER_LANE];
  sdpa_simdgroup_keys<T>(query + row * head_dim, key_head, value_head, mask + row * seq_kv,
                         has_mask, head_dim, head_dim_v, part_begin, part_end, visible_end, scale,
                         lane, simd_group, n_simd, running_max, running_sum, acc);
  sdpa_merge_simdgroups(running_max, running_sum, acc, head_dim_v, lane, simd_group, n_simd,
                        thread_index, threads_per_group, tg_max, tg_sum, tg_acc, tg_merged);
  long slot = row * partitions + partition;
  for (long d = long(thread_index); d < head_dim_v; d += long(threads_per_group)) {
    partial_out[slot * head_dim_v + d] = tg_merged[d];
  }
  if (thread_index == 0) {
    partial_max_sum[slot * 2] = running_max;
    partial_max_sum[slot * 2 + 1] = running_sum;
  }
}

template <typename T>
inline void sdpa_decode_combine_impl(device const float* partial_out,
                                     device const float* partial_max_sum, device T* out,
                                     device float* lse, long head_dim_v, long partitions,
                                     uint group_id, uint thread_index, uint threads_per_group) {
  long row = long(group_id);
  device const float* max_sum = partial_max_sum + row * partitions * 2;
  float merged_max = -INFINITY;
  for (long p = 0; p < partitions; ++p) {
    merged_max = max(merged_max, max_sum[p * 2]);
  }
  // as in sdpa_merge_simdgroups: empty partitions weigh exp(-inf) = 0, NaN partitions stay NaN
  float safe_max = merged_max == -INFINITY ? 0.0f : merged_max;
  float merged_sum = 0.0f;
  for (long p = 0; p < partitions; ++p) {
    merged_sum += max_sum[p * 2 + 1] * exp(max_sum[p * 2] - safe_max);
  }
  float inverse_sum = merged_sum == 0.0f ? 0.0f : 1.0f / merged_sum;
  for (long d = long(thread_index); d < head_dim_v; d += long(threads_per_group)) {
    float value = 0.0f;
    for (long p = 0; p < partitions; ++p) {
      value += partial_out[(row * partitions + p) * head_dim_v + d] *
               exp(max_sum[p * 2] - safe_max);
    }
    out[row * head_dim_v + d] = static_cast<T>(value * inverse_sum);
  }
  if (thread_index == 0) {
    lse[row] = merged_sum == 0.0f ? -INFINITY : merged_max + log(merged_sum);
  }
}

#define RLX_SDPA_DECODE_KERNELS(T, SUFFIX)                                                       \
  kernel void sdpa_decode_one_pass_##SUFFIX(                                                     \
      device const T* query [[buffer(0)]], device const T* key [[buffer(1)]],                    \
      device const T* value [[buffer(2)]], device const float* mask [[buffer(3)]],               \
      device const long* seqlens [[buffer(4)]], device T* out [[buffer(5)]],                     \
      device float* lse [[buffer(6)]], constant long& num_heads [[buffer(7)]],                   \
      constant long& num_kv_heads [[buffer(8)]], constant long& query_len [[buffer(9)]],         \
      constant long& seq_kv [[buffer(10)]], constant long& head_dim [[buffer(11)]],              \
      constant long& head_dim_v [[buffer(12)]], constant float& scale [[buffer(13)]],            \
      constant long& causal_mode [[buffer(14)]], constant long& has_mask [[buffer(15)]],         \
      uint group_id [[threadgroup_position_in_grid]],                                            \
      uint thread_index [[thread_position_in_threadgroup]],                                      \
      uint threads_per_group [[threads_per_threadgroup]],                                        \
      uint lane [[thread_index_in_simdgroup]],                                                   \
      uint simd_group [[simdgroup_index_in_threadgroup]]) {                                      \
    threadgroup float tg_max[SDPA_MAX_SIMDGROUPS];                                               \
    threadgroup float tg_sum[SDPA_MAX_SIMDGROUPS];                                               \
    threadgroup float tg_acc[SDPA_MAX_SIMDGROUPS * SDPA_MAX_HEAD_DIM];                           \
    threadgroup float tg_merged[SDPA_MAX_HEAD_DIM];                                              \
    sdpa_decode_one_pass_impl<T>(query, key, value, mask, seqlens, out, lse, num_heads,          \
                                 num_kv_heads, query_len, seq_kv, head_dim, head_dim_v, scale,   \
                                 causal_mode, has_mask, group_id, thread_index,                  \
                                 threads_per_group, lane, simd_group, tg_max, tg_sum, tg_acc,    \
                                 tg_merged);                                                     \
  }                                                                                              \
  kernel void sdpa_decode_split_##SUFFIX(                                                        \
      device const T* query [[buffer(0)]], device const T* key [[buffer(1)]],                    \
      device const T* value [[buffer(2)]], device const float* mask [[buffer(3)]],               \
      device const long* seqlens [[buffer(4)]], device float* partial_out [[buffer(5)]],         \
      device float* partial_max_sum [[buffer(6)]], constant long& num_heads [[buffer(7)]],       \
      constant long& num_kv_heads [[buffer(8)]], constant long& query_len [[buffer(9)]],         \
      constant long& seq_kv [[buffer(10)]], constant long& head_dim [[buffer(11)]],              \
      constant long& head_dim_v [[buffer(12)]], constant float& scale [[buffer(13)]],            \
      constant long& causal_mode [[buffer(14)]], constant long& has_mask [[buffer(15)]],         \
      constant long& partitions [[buffer(16)]],                                                  \
      constant long& keys_per_partition [[buffer(17)]],                                          \
      uint group_id [[threadgroup_position_in_grid]],                                            \
      uint thread_index [[thread_position_in_threadgroup]],                                      \
      uint threads_per_group [[threads_per_threadgroup]],                                        \
      uint lane [[thread_index_in_simdgroup]],                                                   \
      uint simd_group [[simdgroup_index_in_threadgroup]]) {                                      \
    threadgroup float tg_max[SDPA_MAX_SIMDGROUPS];                                               \
    threadgroup float tg_sum[SDPA_MAX_SIMDGROUPS];                                               \
    threadgroup float tg_acc[SDPA_MAX_SIMDGROUPS * SDPA_MAX_HEAD_DIM];                           \
    threadgroup float tg_merged[SDPA_MAX_HEAD_DIM];                                              \
    sdpa_decode_split_impl<T>(query, key, value, mask, seqlens, partial_out, partial_max_sum,    \
                              num_heads, num_kv_heads, query_len, seq_kv, head_dim, head_dim_v,  \
                              scale, causal_mode, has_mask, partitions, keys_per_partition,      \
                              group_id, thread_index, threads_per_group, lane, simd_group,       \
                              tg_max, tg_sum, tg_acc, tg_merged);                                \
  }                                                                                              \
  kernel void sdpa_decode_combine_##SUFFIX(                                                      \
      device const float* partial_out [[buffer(0)]],                                             \
      device const float* partial_max_sum [[buffer(1)]], device T* out [[buffer(2)]],            \
      device float* lse [[buffer(3)]], constant long& head_dim_v [[buffer(4)]],                  \
      constant long& partitions [[buffer(5)]], uint group_id [[threadgroup_position_in_grid]],   \
      uint thread_index [[thread_position_in_threadgroup]],                                      \
      uint threads_per_group [[threads_per_threadgroup]]) {                                      \
    sdpa_decode_combine_impl<T>(partial_out, partial_max_sum, out, lse, head_dim_v, partitions,  \
                                group_id, thread_index, threads_per_group);                      \
  }

RLX_SDPA_DECODE_KERNELS(float, float)
RLX_SDPA_DECODE_KERNELS(half, half)
#if __METAL_VERSION__ >= 310
RLX_SDPA_DECODE_KERNELS(bfloat, bfloat)
#endif
