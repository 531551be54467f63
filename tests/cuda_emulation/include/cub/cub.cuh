// The CUB calls the kernels make, with CUB's results, computed plainly: the
// block-wide ones through __syncthreads, the device-wide ones in one go on
// the host.
#pragma once
#include "cuda_emulation.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#define CUB_VERSION 200800

namespace cub {

// What BlockReduce and BlockScan share: each thread's value in shared
// memory, for a block of kThreads threads, as CUB's assume.
template <typename T, int kThreads>
class BlockValues {
 public:
  struct TempStorage {
    T values[kThreads];
  };

 protected:
  BlockValues(TempStorage& temp, const char* call) : temp_(temp) {
    if (blockDim.x != kThreads || blockDim.y != 1 || blockDim.z != 1) {
      throw std::runtime_error(std::string("cuda emulation: ") + call + " for another block size");
    }
  }
  // Every thread's value, once all have given theirs; the caller ends with
  // __syncthreads before the storage is used again.
  const T* all_values(T value) {
    temp_.values[threadIdx.x] = value;
    __syncthreads();
    return temp_.values;
  }

 private:
  TempStorage& temp_;
};

template <typename T, int kThreads>
class BlockReduce : public BlockValues<T, kThreads> {
 public:
  explicit BlockReduce(typename BlockValues<T, kThreads>::TempStorage& temp)
      : BlockValues<T, kThreads>(temp, "cub::BlockReduce") {}

  // As CUB's, the sum is thread 0's only; the others get a value that shows
  // if they use it.
  T Sum(T value) {
    const T* values = this->all_values(value);
    const T sum = threadIdx.x == 0 ? std::accumulate(values, values + kThreads, T{}) : T(-123456789);
    __syncthreads();
    return sum;
  }
};

template <typename T, int kThreads>
class BlockScan : public BlockValues<T, kThreads> {
 public:
  explicit BlockScan(typename BlockValues<T, kThreads>::TempStorage& temp)
      : BlockValues<T, kThreads>(temp, "cub::BlockScan") {}

  void ExclusiveSum(T value, T& prefix, T& total) {
    const T* values = this->all_values(value);
    prefix = std::accumulate(values, values + threadIdx.x, T{});
    total = std::accumulate(values, values + kThreads, T{});
    __syncthreads();
  }
};

// Device-wide calls: the first (no temporary storage) asks the size to allocate.
struct DeviceScan {
  template <typename In, typename Out, typename Count>
  static cudaError_t InclusiveSum(void* temp, size_t& temp_bytes, In in, Out out, Count count, cudaStream_t) {
    if (temp == nullptr) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    std::decay_t<decltype(out[0])> sum{};
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
      sum += in[i];
      out[i] = sum;
    }
    return cudaSuccess;
  }
};

struct DeviceRadixSort {
  // Stable, by bits [begin_bit, end_bit) of the keys alone, as CUB's.
  template <typename Key, typename Value, typename Count>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const Key* keys_in, Key* keys_out,
                               const Value* values_in, Value* values_out, Count count, int begin_bit, int end_bit,
                               cudaStream_t) {
    if (temp == nullptr) {
      temp_bytes = 1;
      return cudaSuccess;
    }
    const int width = end_bit - begin_bit;
    const uint64_t bits = width >= 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1;
    const auto digits = [&](int64_t i) { return (static_cast<uint64_t>(keys_in[i]) >> begin_bit) & bits; };
    std::vector<int64_t> order(static_cast<size_t>(count));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return digits(a) < digits(b); });
    std::vector<Key> keys;
    std::vector<Value> values;
    for (const int64_t i : order) {
      keys.push_back(keys_in[i]);
      values.push_back(values_in[i]);
    }
    std::copy(keys.begin(), keys.end(), keys_out);
    std::copy(values.begin(), values.end(), values_out);
    return cudaSuccess;
  }
};

}  // namespace cub
