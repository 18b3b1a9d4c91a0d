// Linux shim for the Metal Shading Language subset used by rlx_triton's shaders.
//
// No Metal compiler exists on Linux, so tests/metal compiles every metal/*.metal file as C++
// against this header:
//   syntax check  g++ -std=c++17 -fsyntax-only -Wno-attributes -I metal/shim -x c++ file.metal
//   CPU execution the same source plus metal_exec.h (threads, barriers, simd_sum), see
//                 tests/metal/shader_exec.py
// It declares the MSL address spaces, scalar types, thread-position attributes' types and library
// functions the shaders use. half and bfloat convert from float only explicitly (MSL rejects the
// implicit conversion) and round to nearest even like the GPU. It cannot catch address-space
// mistakes, resource limits or Metal-only semantics.
#pragma once

#ifndef __METAL_VERSION__
#define __METAL_VERSION__ 310
#endif

// Address spaces and the kernel qualifier disappear; attributes ([[buffer(i)]], ...) are ignored
// by g++ under -Wno-attributes.
#define kernel
#define device
#define constant
#define threadgroup
#define thread

#define INFINITY __builtin_inff()

typedef unsigned int uint;
typedef unsigned long ulong;

struct uint2 { uint x, y; };
struct uint3 { uint x, y, z; };

namespace rlx_shim {
inline unsigned short float_to_half_bits(float value) {
  unsigned int x = __builtin_bit_cast(unsigned int, value);
  unsigned int sign = (x >> 16) & 0x8000u;
  unsigned int mantissa = x & 0x7fffffu;
  int exponent = int((x >> 23) & 0xffu);
  if (exponent == 0xff) {
    return (unsigned short)(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  }
  int half_exponent = exponent - 127 + 15;
  if (half_exponent >= 0x1f) {
    return (unsigned short)(sign | 0x7c00u);
  }
  if (half_exponent <= 0) {
    if (half_exponent < -10) {
      return (unsigned short)sign;
    }
    mantissa |= 0x800000u;
    unsigned int shift = unsigned(14 - half_exponent);
    unsigned int bits = mantissa >> shift;
    unsigned int rest = mantissa & ((1u << shift) - 1u);
    unsigned int halfway = 1u << (shift - 1u);
    bits += (rest > halfway || (rest == halfway && (bits & 1u))) ? 1u : 0u;
    return (unsigned short)(sign | bits);
  }
  unsigned int bits = sign | (unsigned(half_exponent) << 10) | (mantissa >> 13);
  unsigned int rest = mantissa & 0x1fffu;
  bits += (rest > 0x1000u || (rest == 0x1000u && (bits & 1u))) ? 1u : 0u;
  return (unsigned short)bits;
}

inline float half_bits_to_float(unsigned short half_bits) {
  unsigned int sign = unsigned(half_bits & 0x8000u) << 16;
  int exponent = (half_bits >> 10) & 0x1f;
  unsigned int mantissa = half_bits & 0x3ffu;
  unsigned int bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {
      exponent = 1;
      while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (unsigned(exponent + 127 - 15) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else {
    bits = sign | (unsigned(exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  return __builtin_bit_cast(float, bits);
}

inline unsigned short float_to_bfloat_bits(float value) {
  unsigned int x = __builtin_bit_cast(unsigned int, value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return (unsigned short)((x >> 16) | 0x40u);  // quiet NaN
  }
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
}  // namespace rlx_shim

struct half {
  unsigned short bits;
  half() = default;
  explicit half(float value) : bits(rlx_shim::float_to_half_bits(value)) {}
  operator float() const { return rlx_shim::half_bits_to_float(bits); }
};

#if __METAL_VERSION__ >= 310
struct bfloat {
  unsigned short bits;
  bfloat() = default;
  explicit bfloat(float value) : bits(rlx_shim::float_to_bfloat_bits(value)) {}
  operator float() const { return __builtin_bit_cast(float, unsigned(bits) << 16); }
};
#endif

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };

// Cooperative built-ins: defined by the CPU execution runtime (metal_exec.h).
void threadgroup_barrier(mem_flags);
float simd_sum(float);
float simd_max(float);

namespace metal {
inline float exp(float x) { return __builtin_expf(x); }
inline float log(float x) { return __builtin_logf(x); }
inline float tanh(float x) { return __builtin_tanhf(x); }
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
inline float abs(float x) { return __builtin_fabsf(x); }
inline float fabs(float x) { return __builtin_fabsf(x); }
inline float max(float x, float y) { return __builtin_fmaxf(x, y); }
inline float min(float x, float y) { return __builtin_fminf(x, y); }
inline float fmax(float x, float y) { return __builtin_fmaxf(x, y); }
inline float fmin(float x, float y) { return __builtin_fminf(x, y); }
inline float cos(float x) { return __builtin_cosf(x); }
inline float sin(float x) { return __builtin_sinf(x); }
inline float pow(float x, float y) { return __builtin_powf(x, y); }
inline float fma(float x, float y, float z) { return __builtin_fmaf(x, y, z); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isnan(float x) { return __builtin_isnan(x); }
inline long max(long x, long y) { return x > y ? x : y; }
inline long min(long x, long y) { return x < y ? x : y; }
inline uint max(uint x, uint y) { return x > y ? x : y; }
inline uint min(uint x, uint y) { return x < y ? x : y; }
namespace precise {
inline float exp(float x) { return __builtin_expf(x); }
inline float log(float x) { return __builtin_logf(x); }
inline float tanh(float x) { return __builtin_tanhf(x); }
}  // namespace precise
}  // namespace metal
