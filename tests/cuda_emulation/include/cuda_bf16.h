// __nv_bfloat16 as far as the kernels use it: made from its bits, added atomically.
#pragma once
#include "cuda_emulation.h"

#include <c10/util/BFloat16.h>

struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
  explicit __nv_bfloat16(__nv_bfloat16_raw raw) : x(raw.x) {}
};
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* address, __nv_bfloat16 v) {
  return atomic_add_16_bit<c10::BFloat16>(address, v);
}
