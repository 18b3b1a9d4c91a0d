// LSTM layer for rlx_triton's Metal backend (torch.nn.LSTM semantics, gate order i, f, g, o).
//
// lstm_input_projection_<T>: gates_x[dir, t, b, g] = bias[dir, g] + sum_k w_ih[dir, g, k] *
//   x[t, b, k] for all timesteps and directions at once (bias = b_ih + b_hh). One thread per
//   output element.
// lstm_recurrence_step_<T>: one timestep of every direction: one thread per (dir, b, unit j);
//   direction 1 walks time backwards (t = seq - 1 - step). h is double-buffered by the launcher
//   (h_in -> h_out), c is updated in place (each thread owns its c).
// lstm_recurrence_persistent_<T>: the whole sequence in one launch: one threadgroup per
//   (dir, b) keeps h and c in threadgroup memory and loops over time with a barrier per step.
// Layouts: x T (seq, B, input); gates_x float (dirs, seq, B, 4H); w_ih float (dirs, 4H, input);
// w_hh float (dirs, 4H, H); bias float (dirs, 4H); h / c state float (dirs, B, H);
// y T (seq, B, dirs * H). State and gates in fp32; hidden <= 512.
#include <metal_stdlib>
using namespace metal;

constant constexpr int LSTM_MAX_HIDDEN = 512;

inline float lstm_sigmoid(float v) {
  return 1.0f / (1.0f + exp(-v));
}

template <typename T>
inline void lstm_input_projection_impl(device const T* x, device const float* w_ih,
                                       device const float* bias, device float* gates_x,
                                       long seq, long batch, long input_size, long hidden,
                                       long directions, uint index) {
  long gates = 4 * hidden;
  long total = directions * seq * batch * gates;
  if (long(index) >= total) {
    return;
  }
  long g = long(index) % gates;
  long tb = (long(index) / gates) % (seq * batch);
  long dir = long(index) / (gates * seq * batch);
  device const T* x_row = x + tb * input_size;
  device const float* w_row = w_ih + (dir * gates + g) * input_size;
  float acc = bias[dir * gates + g];
  for (long k = 0; k < input_size; ++k) {
    acc += w_row[k] * float(x_row[k]);
  }
  gates_x[index] = acc;
}

// Unit j's cell update: gates_x row plus w_hh times the previous h (read from threadgroup or
// device memory, whichever HiddenPointer points to).
template <typename HiddenPointer>
inline void lstm_cell(device const float* gates_x_row, device const float* w_hh_dir,
                      HiddenPointer h_prev, long hidden, long j, thread float& c,
                      thread float& h) {
  float pre[4];
  for (int gate = 0; gate < 4; ++gate) {
    long g = gate * hidden + j;
    device const float* w_row = w_hh_dir + g * hidden;
    float acc = gates_x_row[g];
    for (long k = 0; k < hidden; ++k) {
      acc += w_row[k] * h_prev[k];
    }
    pre[gate] = acc;
  }
  float input_gate = lstm_sigmoid(pre[0]);
  float forget_gate = lstm_sigmoid(pre[1]);
  float cell_gate = tanh(pre[2]);
  float output_gate = lstm_sigmoid(pre[3]);
  c = forget_gate * c + input_gate * cell_gate;
  h = output_gate * tanh(c);
}

template <typename T>
inline void lstm_recurrence_step_impl(device const float* gates_x, device const float* w_hh,
                                      device const float* h_in, device float* h_out,
                                      device float* c_state, device T* y, long step, long seq,
                                      long batch, long hidden, long directions, uint index) {
  long total = directions * batch * hidden;
  if (long(index) >= total) {
    return;
  }
  long j = long(index) % hidden;
  long b = (long(index) / hidden) % batch;
  long dir = long(index) / (hidden * batch);
  long t = dir == 0 ? step : seq - 1 - step;
  long gates = 4 * hidden;
  device const float* gates_x_row = gates_x + ((dir * seq + t) * batch + b) * gates;
  device const float* h_prev = h_in + (dir * batch + b) * hidden;
  float c = c_state[index];
  float h = 0.0f;
  lstm_cell(gates_x_row, w_hh + dir * gates * hidden, h_prev, hidden, j, c, h);
  c_state[index] = c;
  h_out[index] = h;
  y[(t * batch + b) * directions * hidden + dir * hidden + j] = static_cast<T>(h);
}

template <typename T>
inline void lstm_recurrence_persistent_impl(
    device const float* gates_x, device const float* w_hh, device const float* h0,
    device const float* c0, device T* y, device float* h_n, device float* c_n, long seq,
    long batch, long hidden, long directions, uint group_id, uint thread_index,
    uint threads_per_group, threadgroup float* h_shared, threadgroup float* h_next,
    threadgroup float* c_shared) {
  long dir = long(group_id) / batch;
  long b = long(group_id) % batch;
  long state = (dir * batch + b) * hidden;
  long gates = 4 * hidden;
  device const float* w_hh_dir = w_hh + dir * gates * hidden;
  for (long j = long(thread_index); j < hidden; j += long(threads_per_group)) {
    h_shared[j] = h0[state + j];
    c_shared[j] = c0[state + j];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (long step = 0; step < seq; ++step) {
    long t = dir == 0 ? step : seq - 1 - step;
    device const float* gates_x_row = gates_x + ((dir * seq + t) * batch + b) * gates;
    for (long j = long(thread_index); j < hidden; j += long(threads_per_group)) {
      float c = c_shared[j];
      float h = 0.0f;
      lstm_cell(gates_x_row, w_hh_dir, static_cast<threadgroup const float*>(h_shared), hidden, j,
                c, h);
      c_shared[j] = c;
      h_next[j] = h;
      y[(t * batch + b) * directions * hidden + dir * hidden + j] = static_cast<T>(h);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (long j = long(thread_index); j < hidden; j += long(threads_per_group)) {
      h_shared[j] = h_next[j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (long j = long(thread_index); j < hidden; j += long(threads_per_group)) {
    h_n[state + j] = h_shared[j];
    c_n[state + j] = c_shared[j];
  }
}

#define RLX_LSTM_KERNELS(T, SUFFIX)                                                              \
  kernel void lstm_input_projection_##SUFFIX(                                                    \
      device const T* x [[buffer(0)]], device const float* w_ih [[buffer(1)]],                   \
      device const float* bias [[buffer(2)]], device float* gates_x [[buffer(3)]],               \
      constant long& seq [[buffer(4)]], constant long& batch [[buffer(5)]],                      \
      constant long& input_size [[buffer(6)]], constant long& hidden [[buffer(7)]],              \
      constant long& directions [[buffer(8)]], uint index [[thread_position_in_grid]]) {         \
    lstm_input_projection_impl<T>(x, w_ih, bias, gates_x, seq, batch, input_size, hidden,        \
                                  directions, index);                                            \
  }                                                                                              \
  kernel void lstm_recurrence_step_##SUFFIX(                                                     \
      device const float* gates_x [[buffer(0)]], device const float* w_hh [[buffer(1)]],         \
      device const float* h_in [[buffer(2)]], device float* h_out [[buffer(3)]],                 \
      device float* c_state [[buffer(4)]], device T* y [[buffer(5)]],                            \
      constant long& step [[buffer(6)]], constant long& seq [[buffer(7)]],                       \
      constant long& batch [[buffer(8)]], constant long& hidden [[buffer(9)]],                   \
      constant long& directions [[buffer(10)]], uint index [[thread_position_in_grid]]) {        \
    lstm_recurrence_step_impl<T>(gates_x, w_hh, h_in, h_out, c_state, y, step, seq, batch,       \
                                 hidden, directions, index);                                     \
  }                                                                                              \
  kernel void lstm_recurrence_persistent_##SUFFIX(                                               \
      device const float* gates_x [[buffer(0)]], device const float* w_hh [[buffer(1)]],         \
      device const float* h0 [[buffer(2)]], device const float* c0 [[buffer(3)]],                \
      device T* y [[buffer(4)]], device float* h_n [[buffer(5)]], device float* c_n [[buffer(6)]], \
      constant long& seq [[buffer(7)]], constant long& batch [[buffer(8)]],                      \
      constant long& hidden [[buffer(9)]], constant long& directions [[buffer(10)]],             \
      uint group_id [[threadgroup_position_in_grid]],                                            \
      uint thread_index [[thread_position_in_threadgroup]],                                      \
      uint threads_per_group [[threads_per_threadgroup]]) {                                      \
    threadgroup float h_shared[LSTM_MAX_HIDDEN];                                                 \
    threadgroup float h_next[LSTM_MAX_HIDDEN];                                                   \
    threadgroup float c_shared[LSTM_MAX_HIDDEN];                                                 \
    lstm_recurrence_persistent_impl<T>(gates_x, w_hh, h0, c0, y, h_n, c_n, seq, batch, hidden,   \
                                       directions, group_id, thread_index, threads_per_group,    \
                                       h_shared, h_next, c_shared);                              \
  }

RLX_LSTM_KERNELS(float, float)
RLX_LSTM_KERNELS(half, half)
#if __METAL_VERSION__ >= 310
RLX_LSTM_KERNELS(bfloat, bfloat)
#endif
