// Large fresh CPU outputs: a hint to back them with transparent huge pages.
#pragma once

#include <ATen/core/Tensor.h>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include <cstdint>

namespace torch_masked {
namespace cpu {

// A fresh output of many megabytes costs a page fault per 4 KiB on first
// touch, which can cost more than the kernel's own work. Asking for
// transparent huge pages before the first write (as NumPy does for its large
// arrays) turns those into a few 2 MiB faults. Only a hint: the kernel may
// refuse, and nothing changes but speed.
inline void advise_huge_pages(const at::Tensor& fresh_output) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<uintptr_t>(fresh_output.data_ptr());
  const uintptr_t end = begin + fresh_output.nbytes();
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = end & ~(kHugePage - 1);
  if (last > first) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#endif
}

}  // namespace cpu
}  // namespace torch_masked
