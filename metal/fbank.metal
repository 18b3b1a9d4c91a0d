// Kaldi-compatible log-mel filterbank (torchaudio.compliance.kaldi.fbank) for rlx_triton's Metal
// backend: one threadgroup per (batch, frame) does framing, DC removal, raw log-energy,
// pre-emphasis, window, a direct DFT against a twiddle table, power or magnitude, the mel
// projection and the log floor, all in fp32.
//
// Layouts: wave T (B, samples); window float (window_size,); twiddle_cos / twiddle_sin float
// (fft_size,) with cos(2*pi*j/fft_size) and sin(2*pi*j/fft_size) rounded once from float64;
// mel float (num_mel, fft_size / 2 + 1) (torchaudio's banks with the zero Nyquist column);
// out T (B, frames, num_mel); log_energy float (B, frames).
// Frame f reads samples f * shift + n - pad for n < window_size, reflected at both ends
// (snip_edges=False: pad = window_size / 2 - shift / 2; snip_edges=True: pad = 0, no reflection
// needed). Energy: log(max(sum x^2, eps)) taken before pre-emphasis when raw_energy != 0, else
// after the window; then max(., log_energy_floor). NaN and Inf samples give NaN frames, as in
// torchaudio: the floors keep NaN.
#include <metal_stdlib>
using namespace metal;

constant constexpr int FBANK_MAX_FFT = 1024;
constant constexpr int FBANK_MAX_BINS = FBANK_MAX_FFT / 2 + 1;
constant constexpr int FBANK_MAX_SIMDGROUPS = 32;

// Sum of one value per thread over the threadgroup; every thread gets the total.
inline float fbank_group_sum(float value, uint thread_index, uint threads_per_group, uint lane,
                             uint simd_group, threadgroup float* scratch) {
  float simd_total = simd_sum(value);
  if (lane == 0) {
    scratch[simd_group] = simd_total;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  uint n_simd = (threads_per_group + 31) / 32;
  for (uint g = 0; g < n_simd; ++g) {
    total += scratch[g];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}

// max(x, floor) that keeps a NaN x: torch.max(x, floor) propagates NaN (a frame holding a NaN or Inf
// sample is NaN in torchaudio), where MSL's max() would return the floor.
inline float fbank_floor(float x, float floor) {
  return isnan(x) ? x : max(x, floor);
}

// Sample index of a frame position, reflected the way torchaudio pads for snip_edges=False.
inline long fbank_reflect(long index, long samples) {
  if (index < 0) {
    return -index - 1;
  }
  if (index >= samples) {
    return 2 * samples - 1 - index;
  }
  return index;
}

template <typename T>
inline void fbank_frame_impl(
    device const T* wave, device const float* window, device const float* twiddle_cos,
    device const float* twiddle_sin, device const float* mel, device T* out,
    device float* log_energy, long samples, long frames, long window_size, long fft_size,
    long shift, long pad, long num_mel, long remove_dc_offset, long raw_energy, long use_power,
    long use_log_fbank, float preemphasis, float epsilon, float log_energy_floor, uint group_id,
    uint thread_index, uint threads_per_group, uint lane, uint simd_group,
    threadgroup float* raw, threadgroup float* framed, threadgroup float* spectrum,
    threadgroup float* scratch) {
  long b = long(group_id) / frames;
  long f = long(group_id) % frames;
  device const T* wave_row = wave + b * samples;
  long start = f * shift - pad;
  float local_sum = 0.0f;
  for (long n = long(thread_index); n < window_size; n += long(threads_per_group)) {
    float x = float(wave_row[fbank_reflect(start + n, samples)]);
    raw[n] = x;
    local_sum += x;
  }
  float mean = fbank_group_sum(local_sum, thread_index, threads_per_group, lane, simd_group,
                               scratch) / float(window_size);
  float local_energy = 0.0f;
  for (long n = long(thread_index); n < window_size; n += long(threads_per_group)) {
    float x = remove_dc_offset != 0 ? raw[n] - mean : raw[n];
    raw[n] = x;
    local_energy += x * x;
  }
  float raw_sum_squares = fbank_group_sum(local_energy, thread_index, threads_per_group, lane,
                                          simd_group, scratch);
  // pre-emphasis x[n] - c * x[n - 1] with x[-1] = x[0], then the window; zero padding to fft_size
  float local_windowed_energy = 0.0f;
  for (long n = long(thread_index); n < fft_size; n += long(threads_per_group)) {
    float x = 0.0f;
    if (n < window_size) {
      float previous = n > 0 ? raw[n - 1] : raw[0];
      x = (raw[n] - preemphasis * previous) * window[n];
    }
    framed[n] = x;
    local_windowed_energy += x * x;
  }
  float windowed_sum_squares = fbank_group_sum(local_windowed_energy, thread_index,
                                               threads_per_group, lane, simd_group, scratch);
  long bins = fft_size / 2 + 1;
  for (long k = long(thread_index); k < bins; k += long(threads_per_group)) {
    float real = 0.0f;
    float imag = 0.0f;
    long phase = 0;
    for (long n = 0; n < window_size; ++n) {
      real += framed[n] * twiddle_cos[phase];
      imag -= framed[n] * twiddle_sin[phase];
      phase += k;
      if (phase >= fft_size) {
        phase -= fft_size;
      }
    }
    float power = real * real + imag * imag;
    spectrum[k] = use_power != 0 ? power : sqrt(power);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  long row = b * frames + f;
  for (long m = long(thread_index); m < num_mel; m += long(threads_per_group)) {
    device const float* weights = mel + m * bins;
    float energy = 0.0f;
    for (long k = 0; k < bins; ++k) {
      energy += weights[k] * spectrum[k];
    }
    float feature = use_log_fbank != 0 ? log(fbank_floor(energy, epsilon)) : energy;
    out[row * num_mel + m] = static_cast<T>(feature);
  }
  if (thread_index == 0) {
    float sum_squares = raw_energy != 0 ? raw_sum_squares : windowed_sum_squares;
    log_energy[row] = fbank_floor(log(fbank_floor(sum_squares, epsilon)), log_energy_floor);
  }
}

#define RLX_FBANK_KERNELS(T, SUFFIX)                                                             \
  kernel void fbank_frames_##SUFFIX(                                                             \
      device const T* wave [[buffer(0)]], device const float* window [[buffer(1)]],              \
      device const float* twiddle_cos [[buffer(2)]],                                             \
      device const float* twiddle_sin [[buffer(3)]], device const float* mel [[buffer(4)]],      \
      device T* out [[buffer(5)]], device float* log_energy [[buffer(6)]],                       \
      constant long& samples [[buffer(7)]], constant long& frames [[buffer(8)]],                 \
      constant long& window_size [[buffer(9)]], constant long& fft_size [[buffer(10)]],          \
      constant long& shift [[buffer(11)]], constant long& pad [[buffer(12)]],                    \
      constant long& num_mel [[buffer(13)]], constant long& remove_dc_offset [[buffer(14)]],     \
      constant long& raw_energy [[buffer(15)]], constant long& use_power [[buffer(16)]],         \
      constant long& use_log_fbank [[buffer(17)]], constant float& preemphasis [[buffer(18)]],   \
      constant float& epsilon [[buffer(19)]], constant float& log_energy_floor [[buffer(20)]],   \
      uint group_id [[threadgroup_position_in_grid]],                                            \
      uint thread_index [[thread_position_in_threadgroup]],                                      \
      uint threads_per_group [[threads_per_threadgroup]],                                        \
      uint lane [[thread_index_in_simdgroup]],                                                   \
      uint simd_group [[simdgroup_index_in_threadgroup]]) {                                      \
    threadgroup float raw[FBANK_MAX_FFT];                                                        \
    threadgroup float framed[FBANK_MAX_FFT];                                                     \
    threadgroup float spectrum[FBANK_MAX_BINS];                                                  \
    threadgroup float scratch[FBANK_MAX_SIMDGROUPS];                                             \
    fbank_frame_impl<T>(wave, window, twiddle_cos, twiddle_sin, mel, out, log_energy, samples,   \
                        frames, window_size, fft_size, shift, pad, num_mel, remove_dc_offset,    \
                        raw_energy, use_power, use_log_fbank, preemphasis, epsilon,              \
                        log_energy_floor, group_id, thread_index, threads_per_group, lane,       \
                        simd_group, raw, framed, spectrum, scratch);                             \
  }

RLX_FBANK_KERNELS(float, float)
RLX_FBANK_KERNELS(half, half)
#if __METAL_VERSION__ >= 310
RLX_FBANK_KERNELS(bfloat, bfloat)
#endif
