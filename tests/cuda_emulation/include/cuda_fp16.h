// __half as far as the kernels use it: made from its bits, added atomically.
#pragma once
#include "cuda_emulation.h"

#include <c10/util/Half.h>

struct __half_raw {
  unsigned short x;
};
struct __half {
  unsigned short x;
  explicit __half(__half_raw raw) : x(raw.x) {}
};
inline __half atomicAdd(__half* address, __half v) { return atomic_add_16_bit<c10::Half>(address, v); }
