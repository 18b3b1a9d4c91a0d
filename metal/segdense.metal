// Dense head of pyannote's segmentation model for rlx_triton's Metal backend, in one kernel:
// (Linear + leaky ReLU) x (num_layers - 1), then the classifier Linear and the final activation.
//
// One threadgroup per row (one frame of one chunk). layer_dims long (num_layers + 1,) holds
// [in_features, hidden_1, ..., classes]; weights float packs each layer's (out, in) matrix one
// after another, biases float packs each layer's (out,) vector. activation: 0 none,
// 1 log-softmax over classes, 2 sigmoid. Widths up to 1024; fp32 accumulation.
// Layouts: x T (rows, in_features); out T (rows, classes).
#include <metal_stdlib>
using namespace metal;

constant constexpr int SEGDENSE_MAX_WIDTH = 1024;

template <typename T>
inline void segdense_head_impl(device const T* x, device const float* weights,
                               device const float* biases, device const long* layer_dims,
                               device T* out, long num_layers, float negative_slope,
                               long activation, uint group_id, uint thread_index,
                               uint threads_per_group, threadgroup float* current,
                               threadgroup float* next) {
  long row = long(group_id);
  long in_features = layer_dims[0];
  for (long k = long(thread_index); k < in_features; k += long(threads_per_group)) {
    current[k] = float(x[row * in_features + k]);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  long weight_offset = 0;
  long bias_offset = 0;
  for (long layer = 0; layer < num_layers; ++layer) {
    long width_in = layer_dims[layer];
    long width_out = layer_dims[layer + 1];
    bool hidden_layer = layer + 1 < num_layers;
    for (long j = long(thread_index); j < width_out; j += long(threads_per_group)) {
      device const float* w_row = weights + weight_offset + j * width_in;
      float acc = biases[bias_offset + j];
      for (long k = 0; k < width_in; ++k) {
        acc += w_row[k] * current[k];
      }
      if (hidden_layer) {
        acc = acc >= 0.0f ? acc : negative_slope * acc;
      }
      next[j] = acc;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (long j = long(thread_index); j < width_out; j += long(threads_per_group)) {
      current[j] = next[j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    weight_offset += width_out * width_in;
    bias_offset += width_out;
  }
  long classes = layer_dims[num_layers];
  float log_normalizer = 0.0f;
  if (activation == 1) {
    float largest = -INFINITY;
    for (long j = 0; j < classes; ++j) {
      largest = max(largest, current[j]);
    }
    float total = 0.0f;
    for (long j = 0; j < classes; ++j) {
      total += exp(current[j] - largest);
    }
    log_normalizer = largest + log(total);
  }
  for (long j = long(thread_index); j < classes; j += long(threads_per_group)) {
    float logit = current[j];
    float y = logit;
    if (activation == 1) {
      y = logit - log_normalizer;
    } else if (activation == 2) {
      y = 1.0f / (1.0f + exp(-logit));
    }
    out[row * classes + j] = static_cast<T>(y);
  }
}

#define RLX_SEGDENSE_KERNELS(T, SUFFIX)                                                          \
  kernel void segdense_head_##SUFFIX(                                                            \
      device const T* x [[buffer(0)]], device const float* weights [[buffer(1)]],                \
      device const float* biases [[buffer(2)]], device const long* layer_dims [[buffer(3)]],     \
      device T* out [[buffer(4)]], constant long& num_layers [[buffer(5)]],                      \
      constant float& negative_slope [[buffer(6)]], constant long& activation [[buffer(7)]],     \
      uint group_id [[threadgroup_position_in_grid]],                                            \
      uint thread_index [[thread_position_in_threadgroup]],                                      \
      uint threads_per_group [[threads_per_threadgroup]]) {                                      \
    threadgroup float current[SEGDENSE_MAX_WIDTH];                                               \
    threadgroup float next[SEGDENSE_MAX_WIDTH];                                                  \
    segdense_head_impl<T>(x, weights, biases, layer_dims, out, num_layers, negative_slope,       \
                          activation, group_id, thread_index, threads_per_group, current, next); \
  }

RLX_SEGDENSE_KERNELS(float, float)
RLX_SEGDENSE_KERNELS(half, half)
#if __METAL_VERSION__ >= 310
RLX_SEGDENSE_KERNELS(bfloat, bfloat)
#endif
