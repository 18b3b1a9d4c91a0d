// CPU execution runtime behind metal_exec.h: threadgroups of OS threads with real barriers and
// simdgroup reductions (tests only; see metal_exec.h).
#include <barrier>
#include <memory>
#include <thread>
#include <vector>

using Worker = std::thread;

#include "metal_shim.h"
#include "metal_exec.h"

namespace rlx_exec {
namespace {

constexpr long kSimdWidth = 32;

struct Context {
  std::barrier<>* group = nullptr;
  std::barrier<>* simd = nullptr;
  float* simd_slots = nullptr;
  long lane = 0;
};

thread_local Context context;

template <class Reduce>
float simd_reduce(float value, Reduce reduce) {
  context.simd_slots[context.lane] = value;
  context.simd->arrive_and_wait();
  float result = context.simd_slots[0];
  for (long lane = 1; lane < kSimdWidth; ++lane) {
    result = reduce(result, context.simd_slots[lane]);
  }
  context.simd->arrive_and_wait();
  return result;
}

}  // namespace

void launch(long groups, long group_size, ThreadBody body, const KernelArguments& arguments) {
  long simdgroups = (group_size + kSimdWidth - 1) / kSimdWidth;
  for (long group = 0; group < groups; ++group) {
    std::barrier<> group_barrier(group_size);
    std::vector<std::unique_ptr<std::barrier<>>> simd_barriers;
    for (long s = 0; s < simdgroups; ++s) {
      long lanes = group_size - s * kSimdWidth;
      simd_barriers.push_back(std::make_unique<std::barrier<>>(lanes < kSimdWidth ? lanes : kSimdWidth));
    }
    std::vector<float> slots(size_t(simdgroups * kSimdWidth), 0.0f);
    std::vector<Worker> workers;
    workers.reserve(size_t(group_size));
    for (long t = 0; t < group_size; ++t) {
      workers.emplace_back([&, t] {
        long simdgroup = t / kSimdWidth;
        context = Context{&group_barrier, simd_barriers[size_t(simdgroup)].get(),
                          slots.data() + simdgroup * kSimdWidth, t % kSimdWidth};
        ThreadIds ids{unsigned(group * group_size + t), unsigned(group), unsigned(t), unsigned(group_size),
                      unsigned(t % kSimdWidth), unsigned(simdgroup)};
        body(ids, arguments);
      });
    }
    for (Worker& worker : workers) {
      worker.join();
    }
  }
}

}  // namespace rlx_exec

void threadgroup_barrier(mem_flags) { rlx_exec::context.group->arrive_and_wait(); }
float simd_sum(float value) { return rlx_exec::simd_reduce(value, [](float a, float b) { return a + b; }); }
float simd_max(float value) { return rlx_exec::simd_reduce(value, [](float a, float b) { return a > b ? a : b; }); }
