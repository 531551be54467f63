// CPU kernels for masked::where.self and masked::select (csrc/element_select.h
// prepares both). The output is cut into chunks of flat indices, one task
// each; a chunk walks the merged axes run by run along the innermost one.
// Inside a run the condition either changes per element (a branch-free blend
// the compiler vectorises when strides are 1 or 0) or is fixed (a whole run
// copied from x or y: memcpy for select's rows and broadcast conditions).
#include "element_select.h"
#include "cpu/huge_pages.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace torch_masked {
namespace cpu {
namespace {

// Output elements per task: enough to amortise the start of a chunk.
constexpr int64_t kGrain = int64_t{1} << 15;

// How an operand moves along the innermost axis. Known at compile time, so
// that unit-stride and broadcast runs vectorise.
enum class Step { kUnit, kZero, kAny };

template <Step S>
using StepConstant = std::integral_constant<Step, S>;

template <typename Fn>
void dispatch_step(int64_t stride, Fn&& fn) {
  if (stride == 1) {
    return fn(StepConstant<Step::kUnit>{});
  }
  if (stride == 0) {
    return fn(StepConstant<Step::kZero>{});
  }
  fn(StepConstant<Step::kAny>{});
}

// Element i of a run that starts at `data`.
template <typename T, Step S>
struct Reader {
  const T* data;
  int64_t stride;
  T first;  // the only element of a broadcast (kZero) run, loaded once

  Reader(const T* data, int64_t stride) : data(data), stride(stride), first(data[0]) {}

  T operator()(int64_t i) const {
    if constexpr (S == Step::kUnit) {
      return data[i];
    } else if constexpr (S == Step::kZero) {
      return first;
    } else {
      return data[i * stride];
    }
  }
};

// out[0, len) = c ? x : y, both sides loaded unconditionally so that the
// compiler turns the choice into a vector blend.
template <typename T, Step SC, Step SX, Step SY>
void blend_run(T* __restrict out, Reader<uint8_t, SC> c, Reader<T, SX> x, Reader<T, SY> y, int64_t len) {
  for (int64_t i = 0; i < len; ++i) {
    const T a = x(i);
    const T b = y(i);
    out[i] = c(i) ? a : b;
  }
}

// out[0, len) = the run of `src` with element stride `stride`: a row picked
// whole by one condition element.
template <typename T>
void copy_run(T* __restrict out, const T* src, int64_t stride, int64_t len) {
  if (stride == 1) {
    std::memcpy(out, src, len * sizeof(T));
  } else if (stride == 0) {
    std::fill(out, out + len, src[0]);
  } else {
    for (int64_t i = 0; i < len; ++i) {
      out[i] = src[i * stride];
    }
  }
}

// Calls run(out_index, offsets, len) for each innermost-axis run of flat
// output indices [begin, end), carrying the coordinates across axes instead
// of dividing per element.
template <typename Run>
void walk_runs(const SelectGeometry& g, int64_t begin, int64_t end, const Run& run) {
  int64_t offsets[kNumSelectOperands];
  int64_t coords[kMaxSelectDims];
  g.offsets_at(begin, offsets, coords);
  for (int64_t i = begin; i < end;) {
    const int64_t len = std::min(end - i, g.sizes[0] - coords[0]);
    run(i, offsets, len);
    i += len;
    coords[0] += len;
    for (int op = 0; op < kNumSelectOperands; ++op) {
      offsets[op] += len * g.strides[op][0];
    }
    for (int d = 0; d + 1 < g.dims && coords[d] == g.sizes[d]; ++d) {
      coords[d] = 0;
      ++coords[d + 1];
      for (int op = 0; op < kNumSelectOperands; ++op) {
        offsets[op] += g.strides[op][d + 1] - g.sizes[d] * g.strides[op][d];
      }
    }
  }
}

template <typename T>
void run_selection(const Selection& s) {
  const SelectGeometry& g = s.geometry;
  const uint8_t* c = static_cast<const uint8_t*>(s.condition.const_data_ptr());
  const T* x = static_cast<const T*>(s.x.const_data_ptr());
  const T* y = static_cast<const T*>(s.y.const_data_ptr());
  T* out = static_cast<T*>(s.out.mutable_data_ptr());
  const auto for_each_chunk = [&](const auto& run) {
    at::parallel_for(0, s.out.numel(), kGrain, [&](int64_t begin, int64_t end) { walk_runs(g, begin, end, run); });
  };
  if (g.strides[kCondition][0] == 0) {
    for_each_chunk([&](int64_t i, const int64_t* off, int64_t len) {
      const bool pick_x = c[off[kCondition]] != 0;
      copy_run(out + i, pick_x ? x + off[kX] : y + off[kY], g.strides[pick_x ? kX : kY][0], len);
    });
    return;
  }
  dispatch_step(g.strides[kCondition][0], [&](auto sc) {
    dispatch_step(g.strides[kX][0], [&](auto sx) {
      dispatch_step(g.strides[kY][0], [&](auto sy) {
        constexpr Step SC = decltype(sc)::value, SX = decltype(sx)::value, SY = decltype(sy)::value;
        if constexpr (SC != Step::kZero) {  // handled above as a copy
          for_each_chunk([&](int64_t i, const int64_t* off, int64_t len) {
            blend_run(out + i, Reader<uint8_t, SC>(c + off[kCondition], g.strides[kCondition][0]),
                      Reader<T, SX>(x + off[kX], g.strides[kX][0]), Reader<T, SY>(y + off[kY], g.strides[kY][0]),
                      len);
          });
        }
      });
    });
  });
}

at::Tensor selected(const Selection& s) {
  if (s.out.numel() > 0) {
    advise_huge_pages(s.out);
    // Selection only moves bits: one instantiation per element size.
    dispatch_by_element_size("where", s.out.element_size(), [&](auto tag) { run_selection<decltype(tag)>(s); });
  }
  return s.out;
}

at::Tensor where_self_cpu(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
  return selected(prepare_where(condition, x, y));
}

at::Tensor where_scalar_self_cpu(const at::Tensor& condition, const at::Scalar& x, const at::Tensor& y) {
  return selected(prepare_where_number(condition, y, x, /*number_is_x=*/true));
}

at::Tensor where_scalar_other_cpu(const at::Tensor& condition, const at::Tensor& x, const at::Scalar& y) {
  return selected(prepare_where_number(condition, x, y, /*number_is_x=*/false));
}

at::Tensor select_cpu(const at::Tensor& condition, const at::Tensor& x, const at::Tensor& y) {
  return selected(prepare_select(condition, x, y));
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CPU, m) {
  m.impl("where.self", &where_self_cpu);
  m.impl("where.ScalarSelf", &where_scalar_self_cpu);
  m.impl("where.ScalarOther", &where_scalar_other_cpu);
  m.impl("select", &select_cpu);
}

}  // namespace cpu
}  // namespace torch_masked
