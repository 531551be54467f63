// Byte masks read many bytes at a time: how many bytes are non-zero, and a
// bitmap of which. SSE2 (every x86-64) where the compiler targets it, plain
// loops elsewhere; a byte counts when `byte & bits` is non-zero, so bool
// masks (bits 0xFF) and one-byte dtypes with a signed zero (sign bit left
// out of bits) share them.
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace torch_masked {
namespace cpu {

// Bit u is set when bytes[u] & bits is non-zero, for u < kBytes (a multiple
// of 16, at most 64).
template <int kBytes>
inline uint64_t nonzero_bytes(const uint8_t* bytes, uint8_t bits) {
  static_assert(kBytes % 16 == 0 && kBytes <= 64, "whole 16-byte vectors, at most 64 bits");
#ifdef __SSE2__
  const __m128i pattern = _mm_set1_epi8(static_cast<char>(bits));
  const __m128i zero = _mm_setzero_si128();
  uint64_t zeros = 0;
  for (int v = 0; v < kBytes / 16; ++v) {
    const __m128i x = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes) + v), pattern);
    zeros |= uint64_t{static_cast<uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(x, zero)))} << (16 * v);
  }
  return kBytes == 64 ? ~zeros : ~zeros & ((uint64_t{1} << kBytes) - 1);
#else
  uint64_t set = 0;
  for (int u = 0; u < kBytes; ++u) {
    set |= uint64_t{(bytes[u] & bits) != 0} << u;
  }
  return set;
#endif
}

// The bits set in x. __builtin_popcount is a library call where the target
// has no popcnt instruction (the default x86-64 target), slower than this.
inline int popcount64(uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ULL;
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
  return static_cast<int>((x * 0x0101010101010101ULL) >> 56);
}

// How many of bytes[0, n) have `byte & bits` non-zero.
inline int64_t count_nonzero_bytes(const uint8_t* bytes, int64_t n, uint8_t bits) {
  int64_t count = 0;
  int64_t i = 0;
#ifdef __SSE2__
  const __m128i pattern = _mm_set1_epi8(static_cast<char>(bits));
  const __m128i zero = _mm_setzero_si128();
  while (i + 16 <= n) {
    // Each byte lane counts zero bytes for up to 255 steps, then the lanes
    // are summed (psadbw) before they can wrap.
    const int64_t steps = std::min<int64_t>(255, (n - i) / 16);
    __m128i zeros = zero;
    for (int64_t s = 0; s < steps; ++s, i += 16) {
      const __m128i x = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + i)), pattern);
      zeros = _mm_sub_epi8(zeros, _mm_cmpeq_epi8(x, zero));
    }
    const __m128i sums = _mm_sad_epu8(zeros, zero);
    count += 16 * steps - _mm_cvtsi128_si32(sums) - _mm_cvtsi128_si32(_mm_srli_si128(sums, 8));
  }
#endif
  for (; i < n; ++i) {
    count += (bytes[i] & bits) != 0;
  }
  return count;
}

}  // namespace cpu
}  // namespace torch_masked
