// Helpers shared by every op's CPU and CUDA kernels.
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

// CUDA builds: WITH_CUDA in the C++ sources, __CUDACC__ in the .cu ones.
#if defined(WITH_CUDA) || defined(__CUDACC__)
#include <ATen/cuda/EmptyTensor.h>
#endif

namespace torch_masked {

// The messages of our checks are assembled as plain strings, numbers through
// std::to_string, never through a std::ostream: with torch 2.11 built by
// GCC 13, an integer written to a stream from inside the extension crashed
// the process while it raised the error (text alone did not).
inline std::string message_piece(const char* text) { return text; }
inline std::string message_piece(const std::string& text) { return text; }
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
std::string message_piece(Int value) {
  return std::to_string(value);
}
inline std::string message_piece(at::IntArrayRef shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    text += (d ? ", " : "") + std::to_string(shape[d]);
  }
  return text + "]";
}
inline std::string message_piece(const c10::Device& device) { return device.str(); }
// A float in the fewest significant digits that read back as it (1e+40, 0.1).
inline std::string message_piece(double value) {
  char text[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) {
      break;
    }
  }
  return text;
}
// A number as Python reads it: True, 300, 1e+40, (1+2j).
inline std::string message_piece(const c10::Scalar& number) {
  if (number.isBoolean()) {
    return number.toBool() ? "True" : "False";
  }
  if (number.isComplex()) {
    const c10::complex<double> value = number.toComplexDouble();
    return "(" + message_piece(value.real()) + (value.imag() < 0 ? "" : "+") + message_piece(value.imag()) + "j)";
  }
  if (number.isFloatingPoint()) {
    return message_piece(number.toDouble());
  }
  return number.isUnsigned() ? std::to_string(number.toUInt64()) : std::to_string(number.toLong());
}

template <typename... Pieces>
std::string message(const Pieces&... pieces) {
  std::string text;
  ((text += message_piece(pieces)), ...);
  return text;
}

}  // namespace torch_masked

// TORCH_CHECK and friends with a message made by torch_masked::message.
#define MASKED_CHECK(cond, ...) TORCH_CHECK(cond, ::torch_masked::message(__VA_ARGS__))
#define MASKED_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, ::torch_masked::message(__VA_ARGS__))
#define MASKED_CHECK_INDEX(cond, ...) TORCH_CHECK_INDEX(cond, ::torch_masked::message(__VA_ARGS__))
#define MASKED_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, ::torch_masked::message(__VA_ARGS__))

namespace torch_masked {

// "torch.float32", as Python prints the dtype.
inline std::string dtype_name(at::ScalarType dtype) {
  return "torch." + std::string(c10::getDtypeNames(dtype).first);
}

// Every tensor argument of an op on one device; the message lists them all.
// torch_masked/ops/_checks.py:check_same_device prints the same words.
inline void check_same_device(
    const char* op,
    std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  const auto device = tensors.begin()->second->device();
  bool same = true;
  for (const auto& named : tensors) {
    same = same && named.second->device() == device;
  }
  if (same) {
    return;
  }
  std::string listed;
  for (const auto& named : tensors) {
    listed += message(listed.empty() ? "" : ", ", named.first, " on ", named.second->device());
  }
  MASKED_CHECK(false, op, ": expected all tensors on one device, got ", listed);
}

// A new contiguous tensor for memory our kernels write before anything reads
// it (outputs, scratch). Under torch.use_deterministic_algorithms(True),
// at::empty first fills new memory with NaN or the largest integer
// (torch.utils.deterministic.fill_uninitialized_memory), which ATen's own
// kernels skip for their outputs: a wasted pass, and on the CPU page faults
// on small pages before huge pages are advised (where of 1e7 float32 took
// 32 ms there instead of 11).
inline at::Tensor uninitialized(at::IntArrayRef shape, const at::TensorOptions& options) {
#if defined(WITH_CUDA) || defined(__CUDACC__)
  if (options.device().is_cuda()) {
    return at::detail::empty_cuda(shape, options);
  }
#endif
  return at::detail::empty_cpu(shape, options);
}

// Kernels load whole elements: a GPU faults on a load not aligned to its
// size, and the CPU's loads of 16-byte elements (complex128) are aligned
// vector moves. A tensor made from a raw buffer at an odd offset
// (torch.frombuffer) can break that; torch's own kernels fault on such a
// tensor too (clone() included), so it is refused here with a clear error.
inline void check_element_aligned(const char* op, const char* name, const at::Tensor& t) {
  const int64_t element_size = static_cast<int64_t>(t.element_size());
  const int64_t needed = t.is_cuda() || element_size == 16 ? element_size : 1;
  const int64_t past = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.const_data_ptr()) % needed);
  MASKED_CHECK(t.numel() == 0 || past == 0, op, ": expected ", name, " with data aligned to its element size, ",
               needed, " bytes, got an address ", past, " bytes past a multiple of ", needed);
}

// A 16-byte element (complex128) moved as raw bits.
struct alignas(16) Bytes16 {
  uint64_t lo;
  uint64_t hi;
};

// Calls fn(uint32_t{}) when every index below `count` fits in 32 bits, else
// fn(uint64_t{}): the index type kernels divide in, 64-bit division being
// many times slower on a GPU.
template <typename Fn>
void with_index_type(int64_t count, const Fn& fn) {
  if (count <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) {
    fn(uint32_t{});
  } else {
    fn(uint64_t{});
  }
}

// Ops that only move elements (select, compact, scatter a copy) do not care
// about the dtype, only its size: one instantiation per size serves all dtypes.
template <typename Fn>
void dispatch_by_element_size(const char* op, int64_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    case 16: return fn(Bytes16{});
    default: MASKED_CHECK(false, op, ": unsupported element size ", element_size, " bytes");
  }
}

// Non-zero by the bits, for any dtype: an element is non-zero unless all its
// bits are zero, ignoring sign bits of floating-point parts so that -0.0 is
// zero. NaN and subnormals are non-zero whatever the FPU's denormal mode.
// `mask` clears the sign bits of the element's floating-point parts.
template <typename Bits>
struct NonzeroBits {
  Bits mask;
  C10_HOST_DEVICE bool operator()(Bits v) const { return (v & mask) != 0; }
};

template <>
struct NonzeroBits<Bytes16> {
  Bytes16 mask;
  C10_HOST_DEVICE bool operator()(Bytes16 v) const {
    return ((v.lo & mask.lo) | (v.hi & mask.hi)) != 0;
  }
};

// "Non-zero" means nothing for a dtype without a zero (float8_e8m0fnu) or
// with two values to an element (float4_e2m1fn_x2).
// torch_masked/ops/nonzero.py:_check_input prints the same words.
inline void check_nonzero_dtype(const char* op, at::ScalarType dtype) {
  MASKED_CHECK_TYPE(dtype != at::kFloat8_e8m0fnu && dtype != at::kFloat4_e2m1fn_x2, op,
                    ": expected a dtype with a zero value and one value per element, got ", dtype_name(dtype));
}

// The NonzeroBits mask, from the dtype, as a pattern for up to 8 bytes: all
// ones for bool, integers and the float8 types without a negative zero (in
// the "fnuz" ones the sign bit alone is NaN); each other floating-point (or
// complex) part's sign bit cleared.
inline uint64_t nonzero_mask_pattern(at::ScalarType dtype) {
  const bool signed_zero = (at::isFloatingType(dtype) || at::isComplexType(dtype)) &&
                           dtype != at::kFloat8_e4m3fnuz && dtype != at::kFloat8_e5m2fnuz;
  if (!signed_zero) {
    return ~uint64_t{0};
  }
  const int64_t part_bytes = at::isComplexType(dtype) ? c10::elementSize(dtype) / 2 : c10::elementSize(dtype);
  const int part_bits = static_cast<int>(std::min<int64_t>(part_bytes, 8) * 8);
  uint64_t pattern = 0;
  for (int shift = 0; shift < 64; shift += part_bits) {
    const uint64_t sign = uint64_t{1} << (shift + part_bits - 1);
    const uint64_t part = (part_bits == 64 ? ~uint64_t{0} : ((uint64_t{1} << part_bits) - 1)) << shift;
    pattern |= part & ~sign;
  }
  return pattern;
}

template <typename Bits>
NonzeroBits<Bits> nonzero_bits_for(at::ScalarType dtype) {
  return NonzeroBits<Bits>{static_cast<Bits>(nonzero_mask_pattern(dtype))};
}

template <>
inline NonzeroBits<Bytes16> nonzero_bits_for<Bytes16>(at::ScalarType dtype) {
  const uint64_t pattern = nonzero_mask_pattern(dtype);
  return NonzeroBits<Bytes16>{Bytes16{pattern, pattern}};
}

}  // namespace torch_masked
