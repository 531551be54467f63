// The parallel compaction plan shared by the CPU kernels that keep a
// data-dependent subset (nonzero, boolean_mask): split the input into chunks,
// count each chunk in parallel, take an exclusive prefix sum, then let each
// chunk write its part of the output independently.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torch_masked {
namespace cpu {

struct CompactionPlan {
  int64_t chunk_size = 1;
  // offsets[c] is the first output position of chunk c; offsets.back() the total.
  std::vector<int64_t> offsets{0};

  int64_t total() const { return offsets.back(); }
  int64_t num_chunks() const { return static_cast<int64_t>(offsets.size()) - 1; }

  // Runs fn(begin, end, out_begin, out_end) for every chunk, in parallel.
  template <typename Fn>
  void for_each_chunk(int64_t n, const Fn& fn) const {
    at::parallel_for(0, num_chunks(), 1, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        const int64_t begin = c * chunk_size;
        fn(begin, std::min(n, begin + chunk_size), offsets[c], offsets[c + 1]);
      }
    });
  }
};

// count(begin, end) returns how many of [begin, end) are kept. Chunks are at
// least min_chunk items so that small inputs stay on one thread, and several
// per thread so that uneven densities still balance.
template <typename Count>
CompactionPlan plan_compaction(int64_t n, const Count& count, int64_t min_chunk = int64_t{1} << 15) {
  CompactionPlan plan;
  if (n <= 0) {
    return plan;
  }
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  plan.chunk_size = std::max<int64_t>(min_chunk, (n + threads * 4 - 1) / (threads * 4));
  const int64_t chunks = (n + plan.chunk_size - 1) / plan.chunk_size;
  plan.offsets.assign(chunks + 1, 0);
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = c * plan.chunk_size;
      plan.offsets[c + 1] = count(begin, std::min(n, begin + plan.chunk_size));
    }
  });
  for (int64_t c = 0; c < chunks; ++c) {
    plan.offsets[c + 1] += plan.offsets[c];
  }
  return plan;
}

}  // namespace cpu
}  // namespace torch_masked
