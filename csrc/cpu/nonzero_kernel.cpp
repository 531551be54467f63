// CPU kernels for masked::nonzero, masked::nonzero_tuple and
// masked::nonzero_static: a parallel count per chunk, a prefix sum over the
// chunks, then each chunk writes its own rows.
#include "common.h"
#include "cpu/byte_scan.h"
#include "cpu/compaction.h"
#include "cpu/huge_pages.h"

#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace torch_masked {
namespace cpu {
namespace {

// Elements tested together: a block's non-zero pattern is one 32-bit mask,
// so sparse inputs skip zeros a block at a time and write only set bits.
constexpr int kBlock = 32;

// Where row k of the result goes: column j of row k is columns[j][k * row_stride].
// The 2-D result is one row-major buffer; the tuple form is dim() buffers.
struct IndexOutput {
  c10::SmallVector<int64_t*, 8> columns;
  int64_t row_stride;
};

template <typename T>
int64_t count_nonzero(const T* data, int64_t begin, int64_t end, NonzeroBits<T> nonzero) {
  int64_t count = 0;
  for (int64_t i = begin; i < end; ++i) {
    count += nonzero(data[i]);
  }
  return count;
}

// Bytes (bool, the commonest input) are counted 16 at a time.
template <>
int64_t count_nonzero<uint8_t>(const uint8_t* data, int64_t begin, int64_t end, NonzeroBits<uint8_t> nonzero) {
  return count_nonzero_bytes(data + begin, end - begin, nonzero.mask);
}

// Bit u is set when data[u] is non-zero, for u < kBlock.
template <typename T>
uint32_t block_mask(const T* data, NonzeroBits<T> nonzero) {
  uint32_t mask = 0;
  for (int u = 0; u < kBlock; ++u) {
    mask |= static_cast<uint32_t>(nonzero(data[u])) << u;
  }
  return mask;
}

#ifdef __SSE2__
// bool, int8, uint8 (the commonest masks) and 4-byte types (float32, int32):
// compare whole vectors against zero and gather the results with movemask.
template <>
inline uint32_t block_mask<uint8_t>(const uint8_t* data, NonzeroBits<uint8_t> nonzero) {
  return static_cast<uint32_t>(nonzero_bytes<kBlock>(data, nonzero.mask));
}

template <>
inline uint32_t block_mask<uint32_t>(const uint32_t* data, NonzeroBits<uint32_t> nonzero) {
  const __m128i bits = _mm_set1_epi32(static_cast<int>(nonzero.mask));
  const __m128i zero = _mm_setzero_si128();
  uint32_t zeros = 0;
  for (int v = 0; v < kBlock / 4; ++v) {
    const __m128i x = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data) + v), bits);
    zeros |= static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(x, zero)))) << (4 * v);
  }
  return ~zeros;
}
#endif

// Writes the rows of the non-zero elements of one run along the last
// dimension, data[0, len), whose coordinates are `outer` (the dim - 1 leading
// ones) and last0 + t, to rows k, k + 1, ... up to kend (exclusive). Returns
// the next row. Dense blocks are written branch-free (every element writes
// row k, and only a non-zero one moves k on); sparse ones visit set bits.
template <typename T, bool kOneDim>
int64_t write_run(const T* data, int64_t len, const int64_t* outer, int64_t last0,
                  NonzeroBits<T> nonzero, const IndexOutput& out, int64_t k, int64_t kend) {
  const int64_t dims = static_cast<int64_t>(out.columns.size());
  int64_t* const first_column = out.columns[0];
  const int64_t row_stride = out.row_stride;
  const auto write_row = [&](int64_t t) {
    const int64_t row = k * row_stride;
    if constexpr (kOneDim) {
      first_column[row] = last0 + t;
    } else {
      for (int64_t j = 0; j + 1 < dims; ++j) {
        out.columns[j][row] = outer[j];
      }
      out.columns[dims - 1][row] = last0 + t;
    }
  };
  // A dense block, branch-free; `bounded` (std::true_type) where rows up to
  // kend may not hold the whole block, else no bound is tested per element.
  const auto write_dense = [&](int64_t t, uint32_t mask, auto bounded) {
    for (int u = 0; u < kBlock && (!decltype(bounded)::value || k < kend); ++u) {
      write_row(t + u);
      k += (mask >> u) & 1;
    }
  };
  int64_t t = 0;
  for (; t + kBlock <= len && k < kend; t += kBlock) {
    uint32_t mask = block_mask(data + t, nonzero);
    if (popcount64(mask) > kBlock / 4) {
      if (kend - k >= kBlock) {
        write_dense(t, mask, std::false_type{});
      } else {
        write_dense(t, mask, std::true_type{});
      }
    } else {
      for (; mask != 0 && k < kend; mask &= mask - 1, ++k) {
        write_row(t + __builtin_ctz(mask));
      }
    }
  }
  for (; t < len && k < kend; ++t) {
    write_row(t);
    k += nonzero(data[t]);
  }
  return k;
}

// Writes the rows of the non-zero elements in flat range [begin, end) of a
// contiguous tensor of shape `sizes` (dim >= 1) to rows [k, kend).
template <typename T>
void write_chunk(const T* data, at::IntArrayRef sizes, int64_t begin, int64_t end,
                 NonzeroBits<T> nonzero, const IndexOutput& out, int64_t k, int64_t kend) {
  const int64_t dims = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> coord(dims);
  for (int64_t j = dims - 1, rest = begin; j >= 0; --j) {
    coord[j] = rest % sizes[j];
    rest /= sizes[j];
  }
  const int64_t last_size = sizes[dims - 1];
  for (int64_t i = begin; i < end && k < kend;) {
    const int64_t len = std::min(end - i, last_size - coord[dims - 1]);
    k = dims == 1 ? write_run<T, true>(data + i, len, coord.data(), coord[0], nonzero, out, k, kend)
                  : write_run<T, false>(data + i, len, coord.data(), coord[dims - 1], nonzero, out, k, kend);
    i += len;
    coord[dims - 1] += len;
    for (int64_t j = dims - 1; j > 0 && coord[j] == sizes[j]; --j) {
      coord[j] = 0;
      ++coord[j - 1];
    }
  }
}

// Counts the non-zero elements of `self`, then lets `allocate(total)` make
// the output and writes at most `max_rows` rows into it. A 0-d input is
// treated as 1-D with one element (the tuple form's rule; the 2-D form has no
// columns to write).
template <typename Allocate>
void nonzero_into(const char* op, const at::Tensor& self, const Allocate& allocate, int64_t max_rows) {
  check_nonzero_dtype(op, self.scalar_type());
  check_element_aligned(op, "input", self);
  const at::Tensor input = self.contiguous();
  const int64_t n = input.numel();
  const std::vector<int64_t> sizes = input.dim() == 0 ? std::vector<int64_t>{1} : input.sizes().vec();
  dispatch_by_element_size("nonzero", input.element_size(), [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(input.const_data_ptr());
    const auto nonzero = nonzero_bits_for<T>(input.scalar_type());
    const CompactionPlan plan = plan_compaction(
        n, [&](int64_t begin, int64_t end) { return count_nonzero(data, begin, end, nonzero); });
    const IndexOutput out = allocate(plan.total());
    if (out.columns.empty()) {
      return;
    }
    plan.for_each_chunk(n, [&](int64_t begin, int64_t end, int64_t k, int64_t kend) {
      kend = std::min(kend, max_rows);
      if (k < kend) {
        write_chunk(data, sizes, begin, end, nonzero, out, k, kend);
      }
    });
  });
}

IndexOutput row_major_output(const at::Tensor& result) {
  IndexOutput out{{}, result.size(1)};
  for (int64_t j = 0; j < result.size(1); ++j) {
    out.columns.push_back(result.data_ptr<int64_t>() + j);
  }
  return out;
}

at::Tensor nonzero_cpu(const at::Tensor& self) {
  at::Tensor result;
  nonzero_into(
      "nonzero", self,
      [&](int64_t total) {
        result = uninitialized({total, self.dim()}, self.options().dtype(at::kLong));
        advise_huge_pages(result);
        return row_major_output(result);
      },
      std::numeric_limits<int64_t>::max());
  return result;
}

std::vector<at::Tensor> nonzero_tuple_cpu(const at::Tensor& self) {
  std::vector<at::Tensor> result;
  nonzero_into(
      "nonzero_tuple", self,
      [&](int64_t total) {
        IndexOutput out{{}, 1};
        for (int64_t j = 0; j < std::max<int64_t>(self.dim(), 1); ++j) {
          result.push_back(uninitialized({total}, self.options().dtype(at::kLong)));
          advise_huge_pages(result.back());
          out.columns.push_back(result.back().data_ptr<int64_t>());
        }
        return out;
      },
      std::numeric_limits<int64_t>::max());
  return result;
}

at::Tensor nonzero_static_cpu(const at::Tensor& self, int64_t size, int64_t fill_value) {
  MASKED_CHECK_VALUE(size >= 0, "nonzero_static: expected size >= 0, got size=", size);
  const at::Tensor result = uninitialized({size, self.dim()}, self.options().dtype(at::kLong));
  advise_huge_pages(result);
  nonzero_into(
      "nonzero_static", self,
      [&](int64_t total) {
        // Rows past the last non-zero element keep fill_value.
        const int64_t filled = std::min(total, size) * self.dim();
        std::fill(result.data_ptr<int64_t>() + filled, result.data_ptr<int64_t>() + result.numel(), fill_value);
        return row_major_output(result);
      },
      size);
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CPU, m) {
  m.impl("nonzero", &nonzero_cpu);
  m.impl("nonzero_tuple", &nonzero_tuple_cpu);
  m.impl("nonzero_static", &nonzero_static_cpu);
}

}  // namespace cpu
}  // namespace torch_masked
