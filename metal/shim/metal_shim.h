// Linux syntax-check shim for the Metal Shading Language subset used by rlx_triton's shaders.
//
// No Metal compiler exists on Linux, so tests/metal compiles every metal/*.metal file as C++17
// (`g++ -std=c++17 -fsyntax-only -Wno-attributes -I metal/shim -x c++ file.metal`): this header
// declares the MSL address spaces, scalar types, attributes' built-ins and library functions the
// shaders use. It catches undefined names, type errors, wrong argument counts and implicit
// float -> half/bfloat conversions (MSL rejects those, so the constructors here are explicit).
// It cannot catch address-space mistakes, resource limits or Metal-only semantics.
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

// half and bfloat: explicit construction from float (as MSL requires for bfloat and for
// static_cast-style conversions), implicit widening to float.
struct half {
  unsigned short bits;
  half() = default;
  explicit half(float);
  operator float() const;
};

#if __METAL_VERSION__ >= 310
struct bfloat {
  unsigned short bits;
  bfloat() = default;
  explicit bfloat(float);
  operator float() const;
};
#endif

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
void threadgroup_barrier(mem_flags);

float simd_sum(float);
float simd_max(float);
float simd_min(float);

namespace metal {
float exp(float);
float log(float);
float tanh(float);
float sqrt(float);
float rsqrt(float);
float abs(float);
float fabs(float);
float max(float, float);
float min(float, float);
float fmax(float, float);
float fmin(float, float);
float cos(float);
float sin(float);
float pow(float, float);
float fma(float, float, float);
bool isinf(float);
bool isnan(float);
long max(long, long);
long min(long, long);
uint max(uint, uint);
uint min(uint, uint);
namespace precise {
float exp(float);
float log(float);
float tanh(float);
}  // namespace precise
}  // namespace metal
