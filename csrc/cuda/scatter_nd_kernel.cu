// CUDA kernels for masked::scatter_nd, masked::tensor_scatter_nd_add (and its
// in-place form), masked::gather_nd and the raising half of its compiled
// bounds check, masked::check_gather_nd_indices.
//
// Scatter has three paths:
// - atomic (float, double and complex outside deterministic mode; integers
//   and bool always): one thread per update element, atomically added to
//   its destination; bool ORs, integers add exactly, so both stay on this
//   path even in deterministic mode;
// - fixed point (float when torch.are_deterministic_algorithms_enabled(),
//   and half and bfloat16 always, outputs of at most
//   kFixedPointMaxElements): each destination takes a scale from the largest
//   update it receives, every update becomes an integer at that scale, and
//   integer atomic adds are exact, so the sum does not depend on their order;
// - sorted (the other floating and complex types in deterministic mode, and
//   the larger outputs of those above): the index rows (or, for slices of
//   one element, the updates themselves) are stable-sorted by destination
//   slot with CUB's radix sort, then each run of equal slots is summed in
//   index order, in the accumulation type, from the output's value; a run
//   longer than a chunk of about sqrt(rows) sorted positions chunk by chunk,
//   its chunk sums then added in order.
// Both deterministic paths give the same bits on every run, and round a
// half or bfloat16 sum once. Their atomic adds would round at every add,
// and a destination taking many updates would stop growing (a bfloat16 sum
// of ones stays at 256, where 256 + 1 rounds back to 256): so those two
// types never take the atomic path, as ATen's CUDA index_put_ sums them in
// float too.
//
// Bounds: every kernel records the first index row out of bounds with an
// atomicMin into one int64 on the device. With check_bounds the host reads
// it after the scatter (one sync) and raises IndexError; rows out of bounds
// are never written, so without check_bounds (no sync, safe in CUDA graphs)
// they are simply dropped (gather writes zeros for them).
#include "common.h"
#include "cuda/cub_call.cuh"
#include "cuda/host_read.cuh"
#include "scatter_nd_index.h"

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/accumulate.h>
#include <math_constants.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace torch_masked {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

int64_t blocks_for(int64_t total) {
  return std::min(kMaxBlocks, (total + kThreads - 1) / kThreads);
}

#define GRID_STRIDE_LOOP(t, total)                                                   \
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < (total); \
       t += static_cast<int64_t>(blockDim.x) * gridDim.x)

__device__ inline void note_bad_row(int64_t* first_bad, int64_t row) {
  if (first_bad != nullptr) {
    atomicMin(reinterpret_cast<long long*>(first_bad), static_cast<long long>(row));
  }
}

// Adds v to a 1- or 2-byte value through a compare-and-swap on the aligned
// 32-bit word that holds it. For the last elements of an output whose size
// is not a multiple of 4 bytes that word reaches past the tensor, but not
// past its allocation (scatter_output pads it to whole words), and the other
// bytes are written back as they were.
template <typename T>
__device__ void atomic_add_in_word(T* address, T v) {
  static_assert(sizeof(T) <= 2, "sub-word types only");
  const uintptr_t addr = reinterpret_cast<uintptr_t>(address);
  unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3});
  const unsigned int shift = static_cast<unsigned int>(addr & 3) * 8;
  const unsigned int mask = ((1u << (sizeof(T) * 8)) - 1) << shift;
  unsigned int old = *word;
  unsigned int assumed;
  do {
    assumed = old;
    const unsigned int bits = (assumed & mask) >> shift;
    T current;
    memcpy(&current, &bits, sizeof(T));  // little-endian: the low bytes
    const T sum = static_cast<T>(current + v);
    unsigned int sum_bits = 0;
    memcpy(&sum_bits, &sum, sizeof(T));
    old = atomicCAS(word, assumed, (assumed & ~mask) | (sum_bits << shift));
  } while (assumed != old);
}

template <typename T>
__device__ inline void atomic_accumulate(T* address, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    // OR the byte's 0/1 into its word (which may reach past the tensor into
    // its padding, as in atomic_add_in_word).
    if (v) {
      const uintptr_t addr = reinterpret_cast<uintptr_t>(address);
      atomicOr(reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3}), 1u << ((addr & 3) * 8));
    }
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t>) {
    atomicAdd(address, v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Two's complement: an unsigned add is the signed add, wrapping alike.
    atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, c10::complex<float>> || std::is_same_v<T, c10::complex<double>>) {
    using part_t = typename T::value_type;
    atomicAdd(reinterpret_cast<part_t*>(address), v.real());
    atomicAdd(reinterpret_cast<part_t*>(address) + 1, v.imag());
  } else {
    static_assert(std::is_integral_v<T>, "half and bfloat16 sums never take the atomic path");
    atomic_add_in_word(address, v);  // uint8, int8, int16
  }
}

// What check_bounds reads back, and what needs no read (host_read.cuh).
constexpr const char* kOutOfBoundsRead = "with check_bounds=True, whether an index row is out of bounds";
constexpr const char* kWithoutTheRead =
    "pass check_bounds=False inside the capture (rows out of bounds are then skipped by scatters and read as "
    "zeros by gather_nd)";

// The int64 on the device where kernels record the first index row out of
// bounds (above every row number while there is none); absent without
// check_bounds.
class FirstBadRow {
 public:
  FirstBadRow(bool check_bounds, const NdIndexGeometry& g, c10::Device device, cudaStream_t stream)
      : num_rows_(g.num_rows),
        stream_(stream),
        flag_(check_bounds ? uninitialized({1}, at::TensorOptions(at::kLong).device(device)) : at::Tensor()) {
    if (flag_.defined()) {
      // Every byte 0x7f: 0x7f7f7f7f7f7f7f7f, more rows than memory holds.
      C10_CUDA_CHECK(cudaMemsetAsync(flag_.mutable_data_ptr(), 0x7f, sizeof(int64_t), stream));
    }
  }

  int64_t* device_ptr() const { return flag_.defined() ? flag_.mutable_data_ptr<int64_t>() : nullptr; }

  // The host's one sync: raises IndexError if a kernel recorded a row.
  void raise_if_any(const char* op, const at::Tensor& indices, at::IntArrayRef shape) const {
    if (!flag_.defined()) {
      return;
    }
    const int64_t bad = read_to_host(flag_.const_data_ptr<int64_t>(), stream_, op, kOutOfBoundsRead, kWithoutTheRead);
    if (bad < num_rows_) {
      raise_out_of_bounds(op, indices, bad, shape);
    }
  }

 private:
  int64_t num_rows_;
  cudaStream_t stream_;
  at::Tensor flag_;
};

// a / b for a >= 0, b > 0: no division for b = 1 (element updates), in 32
// bits where both fit (64-bit division is many times slower on a GPU).
__device__ inline int64_t divide(int64_t a, int64_t b) {
  if (b == 1) {
    return a;
  }
  if (((a | b) >> 32) == 0) {
    return static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
  }
  return a / b;
}

// Where element t of the [rows, slice] update (or gather) space lands:
// place(slot, column), from its row's slot and its place in the slice, or -1
// when its index row is out of bounds (then noted once per row, by the row's
// first element).
template <typename index_t, typename Place>
__device__ int64_t element_offset(const NdIndexGeometry& g, const index_t* indices, int64_t t, int64_t* first_bad,
                                  const Place& place) {
  const int64_t row = divide(t, g.slice_size);
  const int64_t column = t - row * g.slice_size;
  const int64_t slot = slot_of(g, indices + row * g.depth);
  if (slot < 0) {
    if (column == 0) {
      note_bad_row(first_bad, row);
    }
    return -1;
  }
  return place(slot, column);
}

// One thread per update element: apply(offset, update) for each whose index
// row is in bounds.
template <typename scalar_t, typename index_t, typename Apply>
__global__ void for_each_update_kernel(NdIndexGeometry g, const index_t* indices, const scalar_t* updates,
                                       int64_t total, int64_t* first_bad, Apply apply) {
  GRID_STRIDE_LOOP(t, total) {
    // The flat offset in the [slots, slice] output.
    const int64_t offset = element_offset(g, indices, t, first_bad,
                                          [&](int64_t slot, int64_t column) { return slot * g.slice_size + column; });
    if (offset >= 0) {
      apply(offset, updates[t]);
    }
  }
}

template <typename scalar_t, typename index_t, typename Apply>
void for_each_update(const NdIndexGeometry& g, const index_t* indices, const scalar_t* updates, int64_t* first_bad,
                     Apply apply, cudaStream_t stream) {
  const int64_t total = g.num_rows * g.slice_size;
  for_each_update_kernel<<<blocks_for(total), kThreads, 0, stream>>>(g, indices, updates, total, first_bad, apply);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
struct AtomicAdd {
  scalar_t* out;
  __device__ void operator()(int64_t offset, scalar_t v) const { atomic_accumulate(out + offset, v); }
};

// One thread per index row: its slot as a sort key (rows out of bounds get
// num_slots, after every real slot) and, unless rows == nullptr, its row
// number as the value. With keys == nullptr it only checks the bounds
// (slices of size 0).
template <typename key_t, typename row_t, typename index_t>
__global__ void slot_keys_kernel(NdIndexGeometry g, const index_t* indices, key_t* keys, row_t* rows,
                                 int64_t* first_bad) {
  GRID_STRIDE_LOOP(row, g.num_rows) {
    int64_t slot = slot_of(g, indices + row * g.depth);
    if (slot < 0) {
      note_bad_row(first_bad, row);
      slot = g.num_slots;
    }
    if (keys != nullptr) {
      keys[row] = static_cast<key_t>(slot);
    }
    if (rows != nullptr) {
      rows[row] = static_cast<row_t>(row);
    }
  }
}

// Only the bounds check, for slices of size 0 (nothing to move).
template <typename index_t>
void check_rows_only(const NdIndexGeometry& g, const index_t* indices, int64_t* first_bad, cudaStream_t stream) {
  slot_keys_kernel<uint32_t, int32_t><<<blocks_for(g.num_rows), kThreads, 0, stream>>>(g, indices, nullptr, nullptr,
                                                                                       first_bad);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Scratch memory on the current device.
void* scratch(at::Tensor& holder, int64_t bytes) {
  holder = uninitialized({bytes}, at::TensorOptions(at::kByte).device(at::kCUDA, c10::cuda::current_device()));
  return holder.mutable_data_ptr();
}

// Stable sort of (key, value) pairs by the low bits of the key that a key up
// to max_key can use. `n` in the narrowest type that holds it: CUB sorts
// with offsets of that width.
template <typename key_t, typename value_t, typename count_t>
void sort_pairs_by_key(const key_t* keys_in, key_t* keys_out, const value_t* values_in, value_t* values_out,
                       count_t n, key_t max_key, cudaStream_t stream) {
  int end_bit = 1;
  while (end_bit < static_cast<int>(sizeof(key_t) * 8) && (uint64_t{1} << end_bit) <= max_key) {
    ++end_bit;
  }
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in, values_out, n,
                                                 0, end_bit, stream));
  at::Tensor temp;
  void* temp_data = scratch(temp, static_cast<int64_t>(temp_bytes));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp_data, temp_bytes, keys_in, keys_out, values_in, values_out, n,
                                                 0, end_bit, stream));
}

// The update at sorted position j: through its sorted row number...
template <typename scalar_t, typename row_t>
struct UpdateOfRow {
  const row_t* rows;
  const scalar_t* updates;
  int64_t slice;
  __device__ scalar_t operator()(int64_t j, int64_t column) const {
    return updates[static_cast<int64_t>(rows[j]) * slice + column];
  }
};

// ... or, for slices of one element, sorted along with the keys.
template <typename scalar_t>
struct SortedUpdate {
  const scalar_t* values;
  __device__ scalar_t operator()(int64_t j, int64_t /*column*/) const { return values[j]; }
};

// Each run of equal slots is summed in order, starting from the output's
// value (the base, or zero) as adding in index order does (a run summed
// apart could overflow to -inf and meet a base of +inf as NaN). So that no
// thread walks a long run alone (one destination taking most of the
// updates), the sorted positions are cut into chunks of about sqrt(rows): a
// run crossing chunk boundaries sums its part in each chunk apart, and those
// sums are then added in order to the first part's (which holds the base).
// Only such long runs can meet that NaN. The cuts depend on the row count
// alone: the same bits every run.
struct RunChunks {
  int64_t chunk;
  int64_t count;
  explicit RunChunks(int64_t rows) {
    constexpr int64_t kMinChunk = 64;
    int64_t length = std::max<int64_t>(kMinChunk, static_cast<int64_t>(std::sqrt(static_cast<double>(rows))));
    while (length * length < rows) {
      ++length;
    }
    chunk = length;
    count = (rows + length - 1) / length;
  }
};

// The first pass, one thread per (sorted position, column); only run starts
// and chunk starts work. Each sums its run's positions up to the chunk's end.
// A run that ends there is complete and written out; otherwise the sum is
// kept: `crossing[c]` for the run that starts in chunk c and goes past it
// (its sum from the base), `continuing[c]` for the run that entered chunk c
// from before (its positions in chunk c, from the first of them).
template <typename scalar_t, typename key_t, typename UpdateAt>
__global__ void sum_run_chunks_kernel(int64_t num_rows, int64_t slice, key_t num_slots, const key_t* keys,
                                      UpdateAt update_at, int64_t chunk, at::opmath_type<scalar_t>* crossing,
                                      at::opmath_type<scalar_t>* continuing, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  GRID_STRIDE_LOOP(t, num_rows * slice) {
    const int64_t i = divide(t, slice);
    const int64_t column = t - i * slice;
    const key_t key = keys[i];
    const bool run_start = i == 0 || keys[i - 1] != key;
    const int64_t chunk_index = divide(i, chunk);
    if (key >= num_slots || (!run_start && chunk_index * chunk != i)) {
      continue;
    }
    const int64_t chunk_end = (chunk_index + 1) * chunk < num_rows ? (chunk_index + 1) * chunk : num_rows;
    scalar_t* dst = out + static_cast<int64_t>(key) * slice + column;
    // A run's own sum starts from the base; a continuing one's from its first
    // update (so that updates of -0.0 stay -0.0).
    acc_t sum = run_start ? static_cast<acc_t>(*dst) : static_cast<acc_t>(update_at(i, column));
    int64_t j = run_start ? i : i + 1;
    for (; j < chunk_end && keys[j] == key; ++j) {
      sum += static_cast<acc_t>(update_at(j, column));
    }
    const bool goes_on = j == chunk_end && j < num_rows && keys[j] == key;
    if (run_start && !goes_on) {
      *dst = static_cast<scalar_t>(sum);
    } else {
      (run_start ? crossing : continuing)[chunk_index * slice + column] = sum;
    }
  }
}

// The second pass, one thread per (chunk, column): the run that starts in
// the chunk and goes past it, if any, adds its chunk sums in order.
template <typename scalar_t, typename key_t>
__global__ void finish_crossing_runs_kernel(int64_t num_rows, int64_t slice, key_t num_slots, const key_t* keys,
                                            int64_t chunk, int64_t chunks, const at::opmath_type<scalar_t>* crossing,
                                            const at::opmath_type<scalar_t>* continuing, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  GRID_STRIDE_LOOP(t, chunks * slice) {
    const int64_t chunk_index = divide(t, slice);
    const int64_t column = t - chunk_index * slice;
    const int64_t next_start = (chunk_index + 1) * chunk;
    if (next_start >= num_rows) {
      continue;
    }
    const key_t key = keys[next_start - 1];
    const int64_t start = chunk_index * chunk;
    // Past the chunk, and not a run that entered it from before.
    if (key >= num_slots || keys[next_start] != key || (start > 0 && keys[start - 1] == key)) {
      continue;
    }
    acc_t sum = crossing[chunk_index * slice + column];
    for (int64_t c = chunk_index + 1; c < chunks && keys[c * chunk] == key; ++c) {
      sum += continuing[c * slice + column];
    }
    out[static_cast<int64_t>(key) * slice + column] = static_cast<scalar_t>(sum);
  }
}

// Adds each run of equal sorted keys (below num_slots) into its slot of `out`.
template <typename scalar_t, typename key_t, typename UpdateAt>
void sum_runs(int64_t num_rows, int64_t slice, key_t num_slots, const key_t* keys, UpdateAt update_at, scalar_t* out,
              cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const RunChunks chunks(num_rows);
  at::Tensor holder;
  auto* crossing = static_cast<acc_t*>(
      scratch(holder, 2 * chunks.count * slice * static_cast<int64_t>(sizeof(acc_t))));
  acc_t* continuing = crossing + chunks.count * slice;
  sum_run_chunks_kernel<<<blocks_for(num_rows * slice), kThreads, 0, stream>>>(
      num_rows, slice, num_slots, keys, update_at, chunks.chunk, crossing, continuing, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (chunks.count > 1) {
    finish_crossing_runs_kernel<<<blocks_for(chunks.count * slice), kThreads, 0, stream>>>(
        num_rows, slice, num_slots, keys, chunks.chunk, chunks.count, crossing, continuing, out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// The unsigned integer as wide as an element, to move it through the sort
// as bits.
template <size_t kBytes>
struct BitsOfSize;
template <>
struct BitsOfSize<2> { using type = uint16_t; };
template <>
struct BitsOfSize<4> { using type = uint32_t; };
template <>
struct BitsOfSize<8> { using type = uint64_t; };

// Keys and row numbers as narrow as the sizes allow: the sort moves half the
// bytes with 32-bit ones. Slices of one element (up to 8 bytes) sort the
// updates themselves instead of row numbers: no row numbers to write, and
// the sums read the updates in order rather than gathering them.
template <typename key_t, typename row_t, typename scalar_t, typename index_t>
void scatter_sorted(const NdIndexGeometry& g, const index_t* indices, const scalar_t* updates, scalar_t* out,
                    int64_t* first_bad, cudaStream_t stream) {
  const int64_t n = g.num_rows;
  const key_t max_key = static_cast<key_t>(g.num_slots);
  at::Tensor keys;
  key_t* keys_in = static_cast<key_t*>(scratch(keys, 2 * n * static_cast<int64_t>(sizeof(key_t))));
  key_t* keys_out = keys_in + n;
  if constexpr (sizeof(scalar_t) <= 8) {
    if (g.slice_size == 1) {
      using bits_t = typename BitsOfSize<sizeof(scalar_t)>::type;
      at::Tensor sorted;
      scalar_t* sorted_updates = static_cast<scalar_t*>(scratch(sorted, n * static_cast<int64_t>(sizeof(scalar_t))));
      slot_keys_kernel<key_t, row_t><<<blocks_for(n), kThreads, 0, stream>>>(g, indices, keys_in, nullptr,
                                                                              first_bad);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      sort_pairs_by_key(keys_in, keys_out, reinterpret_cast<const bits_t*>(updates),
                        reinterpret_cast<bits_t*>(sorted_updates), static_cast<row_t>(n), max_key, stream);
      sum_runs(n, g.slice_size, max_key, keys_out, SortedUpdate<scalar_t>{sorted_updates}, out, stream);
      return;
    }
  }
  at::Tensor rows;
  row_t* rows_in = static_cast<row_t*>(scratch(rows, 2 * n * static_cast<int64_t>(sizeof(row_t))));
  row_t* rows_out = rows_in + n;
  slot_keys_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, indices, keys_in, rows_in, first_bad);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  sort_pairs_by_key(keys_in, keys_out, rows_in, rows_out, static_cast<row_t>(n), max_key, stream);
  sum_runs(n, g.slice_size, max_key, keys_out, UpdateOfRow<scalar_t, row_t>{rows_out, updates, g.slice_size}, out,
           stream);
}

// Fixed-point sums (float, half and bfloat16 updates).
//
// Each output element gets a code, the largest of its updates' codes (0
// while nothing lands there): 1 for -0.0, 2 for +0.0, kFirstScaledCode plus
// the float exponent field for any other finite value. Subnormals count as
// exponent field 0, that is 2^-127, above their own size, so every update of
// an element with code c is below 2^(E + 1), E = scale_exponent(c).
// Non-finite updates OR flags above every finite code instead: no later
// maximum undoes them, and their sum needs no scale.
//
// Then each update v adds round(v * 2^(F - E - 1)), at most 2^F in size, to
// the element's int64. With F = 62 - ceil(log2(rows)) the sum of one update
// per row cannot overflow, and the quantum 2^(E + 1 - F) is at most 2^-30 of
// the element's largest update (rows <= 2^31; for subnormal updates, below
// float's own spacing there): finer than the rounding of a float sum.
// Integer addition is exact, so the order the atomics land in does not
// matter.
constexpr uint32_t kMinusZero = 1;
constexpr uint32_t kPlusZero = 2;
constexpr uint32_t kFirstScaledCode = 3;
constexpr uint32_t kPlusInfinity = 1u << 10;
constexpr uint32_t kMinusInfinity = 1u << 11;
constexpr uint32_t kNotANumber = 1u << 12;
// Up to 4 Mi output elements (48 MiB of codes and sums, about the L2 cache
// of a large GPU) the three passes beat the sort, whose fixed cost of many
// launches dominates at these sizes; beyond, the sort's cost follows the
// updates alone, not the output.
constexpr int64_t kFixedPointMaxElements = int64_t{1} << 22;
constexpr int64_t kFixedPointMaxRows = int64_t{1} << 31;

__device__ inline uint32_t fixed_point_code(float v) {
  const uint32_t bits = __float_as_uint(v);
  const uint32_t exponent_field = (bits >> 23) & 0xff;
  const bool negative = (bits >> 31) != 0;
  if (exponent_field == 0xff) {
    return (bits & 0x7fffff) != 0 ? kNotANumber : negative ? kMinusInfinity : kPlusInfinity;
  }
  if ((bits & 0x7fffffff) == 0) {
    return negative ? kMinusZero : kPlusZero;
  }
  return kFirstScaledCode + exponent_field;
}

__device__ inline int scale_exponent(uint32_t code) {
  return static_cast<int>(code - kFirstScaledCode) - 127;
}

// The first pass: each element's code, the largest of its updates'.
struct NoteCode {
  uint32_t* codes;
  template <typename scalar_t>
  __device__ void operator()(int64_t offset, scalar_t v) const {
    const uint32_t code = fixed_point_code(static_cast<float>(v));
    if (code < kPlusInfinity) {
      atomicMax(codes + offset, code);
    } else {
      atomicOr(codes + offset, code);
    }
  }
};

// The second pass: each update, at its element's scale, into the element's int64.
struct AddInFixedPoint {
  const uint32_t* codes;
  unsigned long long* sums;
  int fraction_bits;
  template <typename scalar_t>
  __device__ void operator()(int64_t offset, scalar_t v) const {
    const uint32_t code = codes[offset];
    if (code < kFirstScaledCode || code >= kPlusInfinity) {
      return;  // only zeros land there, or the sum is not finite
    }
    const double scaled =
        scalbn(static_cast<double>(static_cast<float>(v)), fraction_bits - scale_exponent(code) - 1);
    const long long units = __double2ll_rn(scaled);
    if (units != 0) {
      // Two's complement: the unsigned add is the signed one.
      atomicAdd(sums + offset, static_cast<unsigned long long>(units));
    }
  }
};

// Adds each element's sum to its base in double, and only then converts to
// the output's type. In float the sum alone could overflow first: -6e38
// would become -inf, and a base of +inf would then give NaN where adding in
// index order gives +inf. The base is the output's value
// (tensor_scatter_nd_add) or, for scatter_nd, +0.0: its output is not
// zeroed beforehand, and every element is written, as into zeros.
template <typename scalar_t>
__global__ void fixed_point_finish_kernel(const uint32_t* codes, const unsigned long long* sums, int fraction_bits,
                                          bool has_base, scalar_t* out, int64_t elements) {
  GRID_STRIDE_LOOP(i, elements) {
    const uint32_t code = codes[i];
    if (code == 0) {
      if (!has_base) {
        out[i] = scalar_t(0);
      }
      continue;
    }
    double sum;
    if (code >= kPlusInfinity) {
      const bool both_infinities = (code & kPlusInfinity) != 0 && (code & kMinusInfinity) != 0;
      sum = (code & kNotANumber) != 0 || both_infinities ? CUDART_NAN
            : (code & kPlusInfinity) != 0               ? CUDART_INF
                                                        : -CUDART_INF;
    } else if (code < kFirstScaledCode) {
      sum = code == kMinusZero ? -0.0 : 0.0;
    } else {
      sum = scalbn(static_cast<double>(static_cast<long long>(sums[i])), scale_exponent(code) + 1 - fraction_bits);
    }
    const double base = has_base ? static_cast<double>(static_cast<float>(out[i])) : 0.0;
    out[i] = static_cast<scalar_t>(static_cast<float>(base + sum));
  }
}

// Whether a scatter of floating or complex updates takes a deterministic
// path: in deterministic mode, and always for half and bfloat16 (see the top
// of this file).
bool sums_deterministically(bool deterministic_mode, at::ScalarType dtype) {
  return deterministic_mode || dtype == at::kHalf || dtype == at::kBFloat16;
}

// Whether a deterministic scatter sums in fixed point: float, half or
// bfloat16 updates (at least one) into an output of at most
// kFixedPointMaxElements elements.
bool takes_fixed_point(bool deterministic, at::ScalarType dtype, const NdIndexGeometry& g) {
  const int64_t elements = g.num_slots * g.slice_size;
  return deterministic &&
         (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16) && g.num_rows > 0 && elements > 0 &&
         elements <= kFixedPointMaxElements && g.num_rows <= kFixedPointMaxRows;
}

template <typename scalar_t, typename index_t>
void scatter_fixed_point(const NdIndexGeometry& g, const index_t* indices, const scalar_t* updates, bool has_base,
                         scalar_t* out, int64_t* first_bad, cudaStream_t stream) {
  const int64_t elements = g.num_slots * g.slice_size;
  int row_bits = 0;
  while ((int64_t{1} << row_bits) < g.num_rows) {
    ++row_bits;
  }
  const int fraction_bits = 62 - row_bits;
  // One buffer, one memset: the int64 sums, then the codes.
  constexpr int64_t kBytesPerElement = sizeof(unsigned long long) + sizeof(uint32_t);
  at::Tensor holder;
  auto* sums = static_cast<unsigned long long*>(scratch(holder, elements * kBytesPerElement));
  auto* codes = reinterpret_cast<uint32_t*>(sums + elements);
  C10_CUDA_CHECK(cudaMemsetAsync(sums, 0, elements * kBytesPerElement, stream));
  for_each_update(g, indices, updates, first_bad, NoteCode{codes}, stream);
  // The rows out of bounds are noted already.
  for_each_update(g, indices, updates, nullptr, AddInFixedPoint{codes, sums, fraction_bits}, stream);
  fixed_point_finish_kernel<<<blocks_for(elements), kThreads, 0, stream>>>(codes, sums, fraction_bits, has_base,
                                                                           out, elements);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The output of a scatter, its allocation padded to whole 4-byte words for
// the word-wide atomics of 1- and 2-byte elements (atomic_add_in_word). The
// tensor takes the padded storage whole (set_, not a view of a larger
// tensor); without the padding only the caching allocator's rounding kept
// the last word inside the allocation.
at::Tensor scatter_output(at::IntArrayRef shape, const at::TensorOptions& options) {
  const int64_t element_size = static_cast<int64_t>(options.dtype().itemsize());
  if (element_size >= 4) {
    return uninitialized(shape, options);
  }
  // ATen's own count of the bytes, with its check that they fit (the error
  // an empty tensor of this shape raises), in whole 4-byte words.
  const uint64_t bytes = at::detail::computeStorageNbytesContiguous(shape, static_cast<size_t>(element_size));
  const auto words = static_cast<int64_t>(bytes / 4 + (bytes % 4 != 0));
  const at::Tensor padded = uninitialized({words}, options.dtype(at::kInt));
  at::Tensor output = uninitialized({0}, options);
  output.set_(padded.storage(), 0, shape);
  return output;
}

at::Tensor scatter_into_cuda(const char* op, const at::Tensor* tensor, at::IntArrayRef shape,
                             const at::Tensor& indices, const at::Tensor& updates, const NdIndexGeometry& g,
                             bool check_bounds, bool in_place) {
  // Atomic adds of elements narrower than 4 bytes touch the whole 32-bit
  // word around them, which may lie past the end of a tensor we did not
  // allocate: those sums go to a padded output of our own (scatter_output),
  // for the caller to copy in.
  const bool into_tensor = in_place && updates.element_size() >= 4;
  const c10::cuda::CUDAGuard guard(updates.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor output = into_tensor ? *tensor : scatter_output(shape, updates.options());
  // The mode read once: the output is left unzeroed below only for the path
  // chosen by this same reading, even if another thread changes it meanwhile.
  const bool deterministic =
      sums_deterministically(at::globalContext().deterministicAlgorithms(), updates.scalar_type());
  // The fixed-point sums write every element of an output without a base.
  const bool fixed_point = takes_fixed_point(deterministic, updates.scalar_type(), g);
  if (into_tensor) {
    // The output holds its base already.
  } else if (tensor != nullptr) {
    output.copy_(*tensor);
  } else if (output.numel() > 0 && !fixed_point) {
    C10_CUDA_CHECK(cudaMemsetAsync(output.mutable_data_ptr(), 0, output.nbytes(), stream));  // zero bits: 0, false
  }
  if (g.num_rows == 0) {
    return output;
  }
  const FirstBadRow first_bad(check_bounds, g, updates.device(), stream);
  int64_t* first_bad_ptr = first_bad.device_ptr();
  const int64_t total = g.num_rows * g.slice_size;
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "scatter_nd", [&] {
    const index_t* index_data = indices.const_data_ptr<index_t>();
    AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(at::kHalf, at::kBFloat16, at::kBool, updates.scalar_type(), "scatter_nd", [&] {
      const scalar_t* update_data = updates.const_data_ptr<scalar_t>();
      scalar_t* out_data = output.mutable_data_ptr<scalar_t>();
      if (total == 0) {
        check_rows_only(g, index_data, first_bad_ptr, stream);
        return;
      }
      // Integer and bool sums do not depend on the order.
      if constexpr (!std::is_integral_v<scalar_t>) {
        if (deterministic) {
          constexpr bool kFixedPointType = std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, at::Half> ||
                                           std::is_same_v<scalar_t, at::BFloat16>;
          if constexpr (kFixedPointType) {
            if (fixed_point) {
              scatter_fixed_point(g, index_data, update_data, tensor != nullptr, out_data, first_bad_ptr, stream);
              return;
            }
          }
          // Keys go up to num_slots (rows out of bounds).
          if (g.num_slots < std::numeric_limits<uint32_t>::max() && g.num_rows <= std::numeric_limits<int32_t>::max()) {
            scatter_sorted<uint32_t, int32_t>(g, index_data, update_data, out_data, first_bad_ptr, stream);
          } else {
            scatter_sorted<uint64_t, int64_t>(g, index_data, update_data, out_data, first_bad_ptr, stream);
          }
          return;
        }
      }
      // Half and bfloat16 sums took a deterministic path above.
      if constexpr (!std::is_same_v<scalar_t, at::Half> && !std::is_same_v<scalar_t, at::BFloat16>) {
        for_each_update(g, index_data, update_data, first_bad_ptr, AtomicAdd<scalar_t>{out_data}, stream);
      }
    });
  });
  first_bad.raise_if_any(op, indices, shape);
  return output;
}

// The offset from a gathered slice's first element of its element `column`,
// the slice not dense: its kept dimensions taken innermost first.
__device__ inline int64_t column_offset(const SliceLayout& layout, int64_t column) {
  int64_t offset = 0;
  for (int64_t d = 0; d + 1 < layout.dims; ++d) {
    const int64_t outer = divide(column, layout.sizes[d]);
    offset += (column - outer * layout.sizes[d]) * layout.strides[d];
    column = outer;
  }
  return offset + column * layout.strides[layout.dims - 1];
}

// One thread per output element; rows out of bounds read as zeros. `in_params`
// is the geometry with params' own strides as slot strides, so that a row's
// slot is the offset of its slice's first element; a slice not dense is read
// through `layout`.
template <bool kDenseSlice, typename T, typename index_t>
__global__ void gather_kernel(NdIndexGeometry in_params, SliceLayout layout, const index_t* indices, const T* params,
                              T* out, int64_t total, int64_t* first_bad) {
  GRID_STRIDE_LOOP(t, total) {
    const int64_t offset = element_offset(in_params, indices, t, first_bad, [&](int64_t first, int64_t column) {
      return first + (kDenseSlice ? column : column_offset(layout, column));
    });
    out[t] = offset >= 0 ? params[offset] : T{};
  }
}

// Reads params in its own strides, so that a view or a broadcast (stride 0)
// is not copied first. A slice that is not dense is read from a contiguous
// copy where params holds no more elements than the output (the copy then
// costs at most what the gather writes): read in place, consecutive threads
// read elements a whole row apart (a transposed [n / 64, 64] params: each
// element in a page of its own), and on an H200 such a gather of 1e7 floats
// took 0.437 ms, where the dense gather of the same rows takes 0.102; with
// the copy, 0.211 ms on an H100 against params[idx]'s 0.178. So is a slice
// with more than kMaxSliceDims dimensions that do not merge. Never where
// nothing is read: with no output, or no element of params (every row then
// out of bounds), a copy would be params itself, as contiguous as PyTorch
// calls an empty tensor.
void gather_into_cuda(at::Tensor& output, const at::Tensor& original_params, const at::Tensor& indices,
                      const NdIndexGeometry& g, bool check_bounds) {
  if (g.num_rows == 0) {
    return;
  }
  const int64_t total = g.num_rows * g.slice_size;
  SliceLayout layout = slice_layout(original_params, g.depth);
  const bool copy_first = total > 0 && original_params.numel() > 0 &&
                          (!layout.fits || (!layout.dense() && original_params.numel() <= total));
  const at::Tensor params = copy_first ? original_params.contiguous() : original_params;
  if (copy_first) {
    layout = slice_layout(params, g.depth);
  }
  const NdIndexGeometry in_params = in_params_geometry(g, params);
  const c10::cuda::CUDAGuard guard(output.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const FirstBadRow first_bad(check_bounds, g, output.device(), stream);
  int64_t* first_bad_ptr = first_bad.device_ptr();
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "gather_nd", [&] {
    const index_t* index_data = indices.const_data_ptr<index_t>();
    if (total == 0) {
      check_rows_only(g, index_data, first_bad_ptr, stream);
      return;
    }
    dispatch_by_element_size("gather_nd", params.element_size(), [&](auto tag) {
      using T = decltype(tag);
      const T* params_data = static_cast<const T*>(params.const_data_ptr());
      T* out_data = static_cast<T*>(output.mutable_data_ptr());
      if (layout.dense()) {
        gather_kernel<true><<<blocks_for(total), kThreads, 0, stream>>>(in_params, layout, index_data, params_data,
                                                                        out_data, total, first_bad_ptr);
      } else {
        gather_kernel<false><<<blocks_for(total), kThreads, 0, stream>>>(in_params, layout, index_data, params_data,
                                                                         out_data, total, first_bad_ptr);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  first_bad.raise_if_any("gather_nd", indices, params.sizes());
}

// The first index row out of bounds, found for its error by gather_nd's own
// row check: one thread per index row.
void raise_first_bad_row_cuda(const at::Tensor& indices, const NdIndexGeometry& g, at::IntArrayRef params_shape) {
  const c10::cuda::CUDAGuard guard(indices.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const FirstBadRow first_bad(true, g, indices.device(), stream);
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "gather_nd", [&] {
    check_rows_only(g, indices.const_data_ptr<index_t>(), first_bad.device_ptr(), stream);
  });
  first_bad.raise_if_any("gather_nd", indices, params_shape);
}

at::Tensor scatter_nd_cuda(const at::Tensor& indices, const at::Tensor& updates, c10::SymIntArrayRef shape,
                           bool check_bounds) {
  return scatter_add_op("scatter_nd", nullptr, indices, updates, C10_AS_INTARRAYREF_SLOW(shape), check_bounds,
                        scatter_into_cuda);
}

at::Tensor tensor_scatter_nd_add_cuda(const at::Tensor& tensor, const at::Tensor& indices,
                                      const at::Tensor& updates, bool check_bounds) {
  return scatter_add_op("tensor_scatter_nd_add", &tensor, indices, updates, tensor.sizes(), check_bounds,
                        scatter_into_cuda);
}

void tensor_scatter_nd_add_in_place_cuda(const at::Tensor& tensor, const at::Tensor& indices,
                                         const at::Tensor& updates, bool check_bounds) {
  tensor_scatter_nd_add_in_place_op(tensor, indices, updates, check_bounds, scatter_into_cuda);
}

at::Tensor gather_nd_cuda(const at::Tensor& params, const at::Tensor& indices, bool check_bounds) {
  return gather_op(params, indices, check_bounds, gather_into_cuda);
}

void check_gather_nd_indices_cuda(const at::Tensor& indices, c10::SymIntArrayRef params_shape,
                                  const at::Tensor& out_of_bounds) {
  // The shared check reads out_of_bounds with item(), not read_to_host; the
  // capture asked about is the one on the indices' device.
  const c10::cuda::CUDAGuard guard(indices.device());
  refuse_while_capturing("gather_nd", kOutOfBoundsRead, kWithoutTheRead);
  check_gather_nd_indices_op(indices, C10_AS_INTARRAYREF_SLOW(params_shape), out_of_bounds, raise_first_bad_row_cuda);
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CUDA, m) {
  m.impl("scatter_nd", &scatter_nd_cuda);
  m.impl("tensor_scatter_nd_add", &tensor_scatter_nd_add_cuda);
  m.impl("tensor_scatter_nd_add_", &tensor_scatter_nd_add_in_place_cuda);
  m.impl("gather_nd", &gather_nd_cuda);
  m.impl("check_gather_nd_indices", &check_gather_nd_indices_cuda);
}

}  // namespace cuda
}  // namespace torch_masked
