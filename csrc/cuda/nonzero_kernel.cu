// CUDA kernels for masked::nonzero, masked::nonzero_tuple and
// masked::nonzero_static, built on CUB: a transform-reduce counts the
// non-zero elements (nonzero's one host sync, to size its output), then a
// stream compaction over the flat indices writes each selected index straight
// into its output row as coordinates. nonzero_static skips the count: its
// output size is known, so it never synchronises.
#include "common.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

namespace torch_masked {
namespace cuda {
namespace {

// As ATen's CUDA nonzero: index math keeps the sizes in a fixed-size array.
constexpr int kMaxDims = 25;

// Where row k of the result goes: coordinate j of row k is
// columns[j][k * row_stride]; rows at or past max_rows are dropped.
struct IndexColumns {
  int64_t* columns[kMaxDims];
  int64_t sizes[kMaxDims];
  int dims;
  int64_t row_stride;
  int64_t max_rows;
};

struct RowWriter {
  IndexColumns out;
  __device__ void operator()(int64_t row, int64_t flat) const {
    if (row >= out.max_rows) {
      return;
    }
    const int64_t offset = row * out.row_stride;
    for (int j = out.dims - 1; j >= 0; --j) {
      out.columns[j][offset] = flat % out.sizes[j];
      flat /= out.sizes[j];
    }
  }
};

template <typename T>
struct IsNonzeroAt {
  const T* data;
  NonzeroBits<T> nonzero;
  __device__ bool operator()(int64_t i) const { return nonzero(data[i]); }
};

template <typename T>
struct NonzeroAsCount {
  NonzeroBits<T> nonzero;
  __device__ int64_t operator()(const T& v) const { return nonzero(v) ? 1 : 0; }
};

at::Tensor scratch_bytes(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

// The number of non-zero elements, read back to the host (one sync).
template <typename T>
int64_t count_nonzero(const at::Tensor& input, NonzeroBits<T> nonzero, cudaStream_t stream) {
  const T* data = static_cast<const T*>(input.const_data_ptr());
  const at::Tensor count = at::empty({1}, input.options().dtype(at::kLong));
  const auto reduce = [&](void* temp, size_t& bytes) {
    return cub::DeviceReduce::TransformReduce(temp, bytes, data, count.data_ptr<int64_t>(), input.numel(),
                                              ::cuda::std::plus<int64_t>{}, NonzeroAsCount<T>{nonzero},
                                              int64_t{0}, stream);
  };
  size_t bytes = 0;
  C10_CUDA_CHECK(reduce(nullptr, bytes));
  const at::Tensor temp = scratch_bytes(bytes, input);
  C10_CUDA_CHECK(reduce(temp.data_ptr(), bytes));
  int64_t host_count = 0;
  c10::cuda::memcpy_and_sync(&host_count, count.data_ptr<int64_t>(), sizeof(int64_t), cudaMemcpyDeviceToHost,
                             stream);
  return host_count;
}

// Compacts the flat indices of the non-zero elements, in order, into `out`.
template <typename T>
void write_rows(const at::Tensor& input, NonzeroBits<T> nonzero, const IndexColumns& out, cudaStream_t stream) {
  const T* data = static_cast<const T*>(input.const_data_ptr());
  const at::Tensor selected = at::empty({1}, input.options().dtype(at::kLong));
  const auto rows = thrust::make_tabulate_output_iterator(RowWriter{out});
  const auto select = [&](void* temp, size_t& bytes) {
    return cub::DeviceSelect::If(temp, bytes, thrust::counting_iterator<int64_t>(0), rows,
                                 selected.data_ptr<int64_t>(), input.numel(), IsNonzeroAt<T>{data, nonzero},
                                 stream);
  };
  size_t bytes = 0;
  C10_CUDA_CHECK(select(nullptr, bytes));
  const at::Tensor temp = scratch_bytes(bytes, input);
  C10_CUDA_CHECK(select(temp.data_ptr(), bytes));
}

// Index columns over `input`'s shape (a 0-d input counts as 1-D of one element).
IndexColumns columns_for(const at::Tensor& input, int64_t row_stride, int64_t max_rows) {
  IndexColumns out{};
  out.dims = std::max<int>(1, static_cast<int>(input.dim()));
  for (int j = 0; j < input.dim(); ++j) {
    out.sizes[j] = input.size(j);
  }
  if (input.dim() == 0) {
    out.sizes[0] = 1;
  }
  out.row_stride = row_stride;
  out.max_rows = max_rows;
  return out;
}

IndexColumns row_major_columns(const at::Tensor& input, const at::Tensor& result, int64_t max_rows) {
  IndexColumns out = columns_for(input, result.size(1), max_rows);
  for (int j = 0; j < out.dims; ++j) {
    out.columns[j] = result.data_ptr<int64_t>() + j;
  }
  return out;
}

// Runs fn(input, nonzero_bits, stream) on the contiguous input, on its device.
template <typename Fn>
void with_input(const char* op, const at::Tensor& self, const Fn& fn) {
  TORCH_CHECK(self.dim() <= kMaxDims, op, ": expected a tensor of at most ", kMaxDims,
              " dimensions on CUDA, got ", self.dim());
  const c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor input = self.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_by_element_size(op, input.element_size(), [&](auto tag) {
    using T = decltype(tag);
    fn(input, nonzero_bits_for<T>(input.scalar_type()), stream);
  });
}

at::Tensor nonzero_cuda(const at::Tensor& self) {
  at::Tensor result;
  with_input("nonzero", self, [&](const at::Tensor& input, auto nonzero, cudaStream_t stream) {
    const int64_t total = input.numel() == 0 ? 0 : count_nonzero(input, nonzero, stream);
    result = at::empty({total, self.dim()}, self.options().dtype(at::kLong));
    if (total > 0 && self.dim() > 0) {
      write_rows(input, nonzero, row_major_columns(input, result, total), stream);
    }
  });
  return result;
}

std::vector<at::Tensor> nonzero_tuple_cuda(const at::Tensor& self) {
  std::vector<at::Tensor> result;
  with_input("nonzero_tuple", self, [&](const at::Tensor& input, auto nonzero, cudaStream_t stream) {
    const int64_t total = input.numel() == 0 ? 0 : count_nonzero(input, nonzero, stream);
    IndexColumns out = columns_for(input, 1, total);
    for (int j = 0; j < out.dims; ++j) {
      result.push_back(at::empty({total}, self.options().dtype(at::kLong)));
      out.columns[j] = result.back().data_ptr<int64_t>();
    }
    if (total > 0) {
      write_rows(input, nonzero, out, stream);
    }
  });
  return result;
}

at::Tensor nonzero_static_cuda(const at::Tensor& self, int64_t size, int64_t fill_value) {
  TORCH_CHECK_VALUE(size >= 0, "nonzero_static: expected size >= 0, got size=", size);
  at::Tensor result;
  with_input("nonzero_static", self, [&](const at::Tensor& input, auto nonzero, cudaStream_t stream) {
    // Rows past the last non-zero element keep fill_value.
    result = at::full({size, self.dim()}, fill_value, self.options().dtype(at::kLong));
    if (input.numel() > 0 && size > 0 && self.dim() > 0) {
      write_rows(input, nonzero, row_major_columns(input, result, size), stream);
    }
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CUDA, m) {
  m.impl("nonzero", &nonzero_cuda);
  m.impl("nonzero_tuple", &nonzero_tuple_cuda);
  m.impl("nonzero_static", &nonzero_static_cuda);
}

}  // namespace cuda
}  // namespace torch_masked
