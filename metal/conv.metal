// 1-D convolution blocks for rlx_triton's Metal backend (pyannote SincNet and Conv1d blocks).
//
// conv1d_pool_<T>: out[b, co, p] = max over j < pool_size of act(bias[co] + sum over ci, t of
//   weight[co, ci, t] * x[b, ci, (p * pool_stride + j) * stride + t * dilation - padding]),
//   act = |.| when apply_abs != 0 (SincNet's conv | abs | max-pool), else identity; then
//   leaky(v) = v >= 0 ? v : negative_slope * v (negative_slope 1: identity). pool_size 1 and
//   pool_stride 1 give a plain Conv1d. Zero padding; conv positions past conv_len are not pooled
//   (MaxPool1d without padding never reaches them). A NaN pools to NaN, as in torch's max_pool1d
//   (Metal's max() would drop it). One thread per output element, each walking (ci, t) in the same
//   order, so equal input windows give bit-equal outputs: an exactly constant input row gives an
//   exactly constant output row.
// instance_norm_act_<T>: y[b, c, l] = leaky((x - mean) / sqrt(var + eps) * gamma[c] + beta[c]),
//   mean and biased variance over l; leaky(v) = v >= 0 ? v : slope * v (slope 1: identity).
//   One threadgroup per (b, c); has_affine == 0 ignores gamma and beta. The statistics are taken
//   from shifted data, x - center with center = x[b, c, 0], and the output is formed as
//   (x - center) * scale + (beta - mean(x - center) * scale): an exactly constant row sums to exactly
//   0, so its variance is exactly 0 and its output exactly leaky(beta), and an offset row (DC) keeps
//   the digits its offset would cancel. A NaN or Inf anywhere in a row gives a NaN row, as in torch.
// Layouts: x T (B, C_in, L_in); weight float (C_out, C_in, taps); bias float (C_out,) (read when
// has_bias != 0); out T (B, C_out, L_out). Accumulation in fp32.
#include <metal_stdlib>
using namespace metal;

constant constexpr int CONV_MAX_SIMDGROUPS = 32;

template <typename T>
inline void conv1d_pool_impl(device const T* x, device const float* weight,
                             device const float* bias, device T* out, long batch, long c_in,
                             long c_out, long length_in, long taps, long stride, long padding,
                             long dilation, long conv_len, long pool_size, long pool_stride,
                             long length_out, long has_bias, long apply_abs,
                             float negative_slope, uint index) {
  long total = batch * c_out * length_out;
  if (long(index) >= total) {
    return;
  }
  long p = long(index) % length_out;
  long co = (long(index) / length_out) % c_out;
  long b = long(index) / (length_out * c_out);
  device const T* x_batch = x + b * c_in * length_in;
  device const float* w_out = weight + co * c_in * taps;
  float best = -INFINITY;
  for (long j = 0; j < pool_size; ++j) {
    long position = p * pool_stride + j;
    if (position >= conv_len) {
      break;
    }
    long origin = position * stride - padding;
    float acc = has_bias != 0 ? bias[co] : 0.0f;
    for (long ci = 0; ci < c_in; ++ci) {
      device const T* x_row = x_batch + ci * length_in;
      device const float* w_row = w_out + ci * taps;
      for (long t = 0; t < taps; ++t) {
        long source = origin + t * dilation;
        if (source >= 0 && source < length_in) {
          acc += w_row[t] * float(x_row[source]);
        }
      }
    }
    float activated = apply_abs != 0 ? abs(acc) : acc;
    best = (activated > best || isnan(activated)) ? activated : best;
  }
  best = best >= 0.0f ? best : negative_slope * best;
  out[index] = static_cast<T>(best);
}

template <typename T>
inline void instance_norm_act_impl(device const T* x, device const float* gamma,
                                   device const float* beta, device T* out, long channels,
                                   long length, long has_affine, float eps, float negative_slope,
                                   uint group_id, uint thread_index, uint threads_per_group,
                                   uint lane, uint simd_group, threadgroup float* scratch) {
  long row = long(group_id);
  long c = row % channels;
  device const T* x_row = x + row * length;
  uint n_simd = (threads_per_group + 31) / 32;
  float center = float(x_row[0]);
  float local_sum = 0.0f;
  for (long l = long(thread_index); l < length; l += long(threads_per_group)) {
    local_sum += float(x_row[l]) - center;
  }
  float simd_total = simd_sum(local_sum);
  if (lane == 0) {
    scratch[simd_group] = simd_total;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint g = 0; g < n_simd; ++g) {
    total += scratch[g];
  }
  float shifted_mean = total / float(length);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float local_squares = 0.0f;
  for (long l = long(thread_index); l < length; l += long(threads_per_group)) {
    float centered = (float(x_row[l]) - center) - shifted_mean;
    local_squares += centered * centered;
  }
  float simd_squares = simd_sum(local_squares);
  if (lane == 0) {
    scratch[simd_group] = simd_squares;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float squares = 0.0f;
  for (uint g = 0; g < n_simd; ++g) {
    squares += scratch[g];
  }
  float inverse_std = 1.0f / sqrt(squares / float(length) + eps);
  float scale = has_affine != 0 ? gamma[c] * inverse_std : inverse_std;
  float shift = (has_affine != 0 ? beta[c] : 0.0f) - shifted_mean * scale;
  for (long l = long(thread_index); l < length; l += long(threads_per_group)) {
    float y = (float(x_row[l]) - center) * scale + shift;
    y = y >= 0.0f ? y : negative_slope * y;
    out[row * length + l] = static_cast<T>(y);
  }
}

#define RLX_CONV_KERNELS(T, SUFFIX)                                                              \
  kernel void conv1d_pool_##SUFFIX(                                                              \
      device const T* x [[buffer(0)]], device const float* weight [[buffer(1)]],                 \
      device const float* bias [[buffer(2)]], device T* out [[buffer(3)]],                       \
      constant long& batch [[buffer(4)]], constant long& c_in [[buffer(5)]],                     \
      constant long& c_out [[buffer(6)]], constant long& length_in [[buffer(7)]],                \
      constant long& taps [[buffer(8)]], constant long& stride [[buffer(9)]],                    \
      constant long& padding [[buffer(10)]], constant long& dilation [[buffer(11)]],             \
      constant long& conv_len [[buffer(12)]], constant long& pool_size [[buffer(13)]],           \
      constant long& pool_stride [[buffer(14)]], constant long& length_out [[buffer(15)]],       \
      constant long& has_bias [[buffer(16)]], constant long& apply_abs [[buffer(17)]],           \
      constant float& negative_slope [[buffer(18)]], uint index [[thread_position_in_grid]]) {   \
    conv1d_pool_impl<T>(x, weight, bias, out, batch, c_in, c_out, length_in, taps, stride,       \
                        padding, dilation, conv_len, pool_size, pool_stride, length_out,         \
                        has_bias, apply_abs, negative_slope, index);                             \
  }                                                                                              \
  kernel void instance_norm_act_##SUFFIX(                                                        \
      device const T* x [[buffer(0)]], device const float* gamma [[buffer(1)]],                  \
      device const float* beta [[buffer(2)]], device T* out [[buffer(3)]],                       \
      constant long& channels [[buffer(4)]], constant long& length [[buffer(5)]],                \
      constant long& has_affine [[buffer(6)]], constant float& eps [[buffer(7)]],                \
      constant float& negative_slope [[buffer(8)]],                                              \
      uint group_id [[threadgroup_position_in_grid]],                                            \
      uint thread_index [[thread_position_in_threadgroup]],                                      \
      uint threads_per_group [[threads_per_threadgroup]],                                        \
      uint lane [[thread_index_in_simdgroup]],                                                   \
      uint simd_group [[simdgroup_index_in_threadgroup]]) {                                      \
    threadgroup float scratch[CONV_MAX_SIMDGROUPS];                                              \
    instance_norm_act_impl<T>(x, gamma, beta, out, channels, length, has_affine, eps,            \
                              negative_slope, group_id, thread_index, threads_per_group, lane,   \
                              simd_group, scratch);                                              \
  }

RLX_CONV_KERNELS(float, float)
RLX_CONV_KERNELS(half, half)
#if __METAL_VERSION__ >= 310
RLX_CONV_KERNELS(bfloat, bfloat)
#endif
