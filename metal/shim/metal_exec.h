// CPU execution interface for rlx_triton's shaders compiled as C++ with metal_shim.h (tests only).
//
// A kernel runs over its grid the way Metal's dispatchThreads does, one threadgroup at a time:
// every thread of the group is an OS thread, threadgroup_barrier is a barrier over the group, and
// simd_sum / simd_max exchange values through per-simdgroup slots between two barriers
// (metal_exec.cpp, compiled once). Threadgroup arrays become `static` (shared by the group's
// threads; groups run one after another) by a textual rewrite in tests/metal/shader_exec.py.
#pragma once

namespace rlx_exec {

struct ThreadIds {
  unsigned int thread_position_in_grid;
  unsigned int threadgroup_position_in_grid;
  unsigned int thread_position_in_threadgroup;
  unsigned int threads_per_threadgroup;
  unsigned int thread_index_in_simdgroup;
  unsigned int simdgroup_index_in_threadgroup;
};

// A kernel's arguments as the host passes them: buffers, long scalars and float scalars, each in
// [[buffer(i)]] order within its kind.
struct KernelArguments {
  void** buffers;
  long* longs;
  float* floats;
};

using ThreadBody = void (*)(const ThreadIds&, const KernelArguments&);

void launch(long groups, long group_size, ThreadBody body, const KernelArguments& arguments);

}  // namespace rlx_exec
