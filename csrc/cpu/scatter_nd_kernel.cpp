// CPU kernels for masked::scatter_nd, masked::tensor_scatter_nd_add (and its
// in-place form), masked::gather_nd and the raising half of its compiled
// bounds check, masked::check_gather_nd_indices.
//
// Scatter: the output (M slots of S elements) is split into one block per
// thread, by slot ranges (and by column ranges when there are fewer slots
// than threads). Every thread reads all index rows in order and adds only the
// rows whose slot is in its block. No two threads write the same element and
// each element receives its updates in index order, so the sums are the same
// bits on every run and for every thread count, with no atomics. half and
// bfloat16 accumulate in float and round once at the end. Slices are sorted
// by slot first (see scatter_slices), so the output is written in one pass.
// Floating element updates may instead be sorted by range of slots, each
// range summed by one thread (see scatter_elements_by_range): the same
// sums, in the same order.
//
// Gather: rows are split among threads; each row is one slice copy, its
// source prefetched a few rows ahead, read from params in its own strides.
#include "common.h"
#include "cpu/huge_pages.h"
#include "scatter_nd_index.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/util/bit_cast.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

namespace torch_masked {
namespace cpu {
namespace {

// Work (index rows times slice elements) below which one thread does it all.
constexpr int64_t kSerialWork = int64_t{1} << 15;
// Columns per block when slices are split among threads.
constexpr int64_t kMinBlockColumns = 512;
// Index rows element scatter lists together (when the rows are split among
// blocks), and how far ahead it prefetches destinations.
constexpr int64_t kChunkRows = 256;
constexpr int64_t kPrefetchRows = 32;
// Columns a half/bfloat16 slice scatter sums at a time in its float buffer
// (4 KiB, well inside the nearest cache); how many sorted update rows ahead
// it prefetches, and how many bytes of each (its first cache lines).
constexpr int64_t kSumColumns = 1024;
constexpr int64_t kPrefetchSlices = 8;
constexpr int64_t kPrefetchRowBytes = 512;
// Gathers prefetch their sources from params this large on (see gather_into_cpu).
constexpr int64_t kPrefetchFromBytes = int64_t{8} << 20;
constexpr int64_t kCacheLine = 64;

// Prefetch of the cache line holding `address`, for reading (0) or writing (1).
template <int kForWrite>
inline void prefetch(const void* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address, kForWrite);
#else
  (void)address;
#endif
}

// Prefetch for reading of the first cache lines (up to kPrefetchRowBytes) of a row of `bytes`.
inline void prefetch_row(const void* row, int64_t bytes) {
  for (int64_t byte = 0; byte < std::min(bytes, kPrefetchRowBytes); byte += kCacheLine) {
    prefetch<0>(static_cast<const char*>(row) + byte);
  }
}

// A part of the output: slots [slot_begin, slot_end), columns
// [column_begin, column_end) of each of their slices.
struct Block {
  int64_t slot_begin, slot_end, column_begin, column_end;
};

// Every block reads all the index rows. For element updates that reading is
// most of the work, so only every other thread gets a block: measured on two
// cores, two blocks cost more in index traffic than they saved in additions.
std::vector<Block> split_output(const NdIndexGeometry& g) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t work = std::max(g.num_rows, g.num_slots) * g.slice_size;
  const int64_t wanted = work < kSerialWork ? 1 : g.slice_size == 1 ? std::max<int64_t>(1, threads / 2) : threads;
  const int64_t slot_parts = std::max<int64_t>(1, std::min(wanted, g.num_slots));
  const int64_t column_parts =
      std::max<int64_t>(1, std::min(wanted / slot_parts, g.slice_size / kMinBlockColumns));
  std::vector<Block> blocks;
  for (int64_t p = 0; p < slot_parts; ++p) {
    for (int64_t q = 0; q < column_parts; ++q) {
      blocks.push_back({g.num_slots * p / slot_parts, g.num_slots * (p + 1) / slot_parts,
                        g.slice_size * q / column_parts, g.slice_size * (q + 1) / column_parts});
    }
  }
  return blocks;
}

// Element updates (slices of one): adds the updates of every index row whose
// slot lies in `block` to `acc`, in index order (for bool, `+=` of 0/1 values stores true for any non-zero sum:
// an OR). Returns the first row out of bounds (and, with stop_at_bad, stops
// there), or -1.
template <bool kDepthOne, typename acc_t, typename scalar_t, typename index_t>
int64_t scatter_elements(const Block& block, const NdIndexGeometry& g, const index_t* indices,
                      const scalar_t* updates, acc_t* acc, bool stop_at_bad) {
  const int64_t depth = kDepthOne ? 1 : g.depth;
  int64_t first_bad = -1;
  if (block.slot_begin == 0 && block.slot_end == g.num_slots) {
    // Every row in range is this block's. The destinations are cache misses
    // the indices announce early: prefetch a few rows ahead.
    const int64_t last_row = g.num_rows - 1;
    for (int64_t n = 0; n < g.num_rows; ++n) {
      const int64_t ahead = slot_of<kDepthOne>(g, indices + std::min(n + kPrefetchRows, last_row) * depth);
      prefetch<1>(acc + std::max<int64_t>(ahead, 0));
      const int64_t slot = slot_of<kDepthOne>(g, indices + n * depth);
      if (C10_UNLIKELY(slot < 0)) {
        if (first_bad < 0) {
          first_bad = n;
          if (stop_at_bad) {
            break;
          }
        }
        continue;
      }
      acc[slot] += static_cast<acc_t>(updates[n]);
    }
    return first_bad;
  }
  // Rows come in chunks: first their slots and values are listed without
  // a branch (a row of this block moves the end of the list on), then the
  // listed ones are added. Random destinations make "is it mine?" a coin
  // flip, too costly to branch on, and the additions run free of it.
  int64_t slots[kChunkRows];
  acc_t values[kChunkRows];
  for (int64_t chunk = 0; chunk < g.num_rows; chunk += kChunkRows) {
    const int64_t chunk_end = std::min(g.num_rows, chunk + kChunkRows);
    int64_t listed = 0;
    for (int64_t n = chunk; n < chunk_end; ++n) {
      const int64_t slot = slot_of<kDepthOne>(g, indices + n * depth);
      if (C10_UNLIKELY(slot < 0) && first_bad < 0) {
        first_bad = n;
        if (stop_at_bad) {
          return first_bad;
        }
      }
      slots[listed] = slot;
      values[listed] = static_cast<acc_t>(updates[n]);
      listed += slot >= block.slot_begin && slot < block.slot_end;
    }
    for (int64_t k = 0; k < listed; ++k) {
      prefetch<1>(acc + slots[std::min(k + kPrefetchRows, listed - 1)]);
      acc[slots[k]] += values[k];
    }
  }
  return first_bad;
}

// Element updates into a large output, and half/bfloat16 ones few beside
// theirs, are summed range by range: random additions all over a large
// output miss every cache, and for half/bfloat16 a float copy of the whole
// output (filled, then read and rounded) would cost more than the additions
// themselves. The updates are counting-sorted (stably) by range of
// kRangeSlots destinations, each packed with its place in the range into 32
// (half/bfloat16) or 64 bits. Then each range is started from the base (or
// zeros) and takes its updates while it is in cache: float32 in place,
// half/bfloat16 in a float buffer, rounding only the destinations touched.
// The sums are the whole-output path's: each destination starts from its
// base value (or zero) and adds its updates in index order.
constexpr int64_t kRangeBits = 15;
constexpr int64_t kRangeSlots = int64_t{1} << kRangeBits;
// Ranges are chosen at more than kRangeSumMinSlots destinations, and for
// half/bfloat16 also when there are at least kRangeSumMinSlotsPerRow
// destinations per update. Measured here (two threads, against the
// whole-output path): float32 with as many updates as destinations, ranges
// lose at 1e6 (7.6 against 4.5 ms) and win at 4e6 (36 against 48 ms) and
// 1e7 (117 against 143 ms), as bfloat16 does (38 against 63 ms at 4e6); at
// 1e6 bfloat16 destinations, ranges win with 1e5 updates and lose with 2e5.
constexpr int64_t kRangeSumMinSlots = int64_t{1} << 21;
constexpr int64_t kRangeSumMinSlotsPerRow = 8;

template <typename scalar_t>
constexpr bool kRangeSummable =
    std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, at::Half> || std::is_same_v<scalar_t, at::BFloat16>;

template <typename scalar_t>
bool sum_elements_by_range(const NdIndexGeometry& g) {
  const bool rounds = !std::is_same_v<scalar_t, float>;
  return g.num_slots > kRangeSumMinSlots || (rounds && g.num_rows * kRangeSumMinSlotsPerRow <= g.num_slots);
}

// Each range of `out` starts as the base's (or zeros) just before its sums,
// so that it is still in cache for them. Returns the first row out of bounds
// (and, with stop_at_bad, writes nothing), or -1.
template <bool kDepthOne, typename acc_t, typename scalar_t, typename index_t>
int64_t scatter_elements_by_range(const NdIndexGeometry& g, const index_t* indices, const scalar_t* updates,
                                  const scalar_t* base, scalar_t* out, bool stop_at_bad) {
  constexpr bool kRounds = !std::is_same_v<acc_t, scalar_t>;
  // (place in range) above the update's bits.
  using Entry = std::conditional_t<sizeof(scalar_t) == 2, uint32_t, uint64_t>;
  using Bits = std::conditional_t<sizeof(scalar_t) == 2, uint16_t, uint32_t>;
  static_assert(sizeof(scalar_t) == sizeof(Bits));
  constexpr int kPlaceShift = 8 * sizeof(Bits);
  const int64_t depth = kDepthOne ? 1 : g.depth;
  // Rows out of bounds (slot -1, unsigned the largest) go to one more range,
  // sorted like the others but never summed.
  const uint64_t ranges = (g.num_slots + kRangeSlots - 1) / kRangeSlots;
  const auto range_of = [ranges](int64_t slot) { return std::min(static_cast<uint64_t>(slot) >> kRangeBits, ranges); };
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), g.num_rows / kSerialWork));
  const auto for_each_part = [&](auto&& body) {
    at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t part = begin; part < end; ++part) {
        body(part, g.num_rows * part / parts, g.num_rows * (part + 1) / parts);
      }
    });
  };
  // The rows of each part in each range; then where they go in the sorted updates.
  std::vector<int64_t> counts(parts * (ranges + 1), 0);
  // Each part counts and places in its own copy of its counters: in the
  // shared array, one part's last counters and the next part's first could
  // share a cache line that both cores would keep taking from each other.
  for_each_part([&](int64_t part, int64_t row_begin, int64_t row_end) {
    std::vector<int64_t> count(ranges + 1, 0);
    for (int64_t n = row_begin; n < row_end; ++n) {
      ++count[range_of(slot_of<kDepthOne>(g, indices + n * depth))];
    }
    std::copy(count.begin(), count.end(), counts.begin() + part * (ranges + 1));
  });
  int64_t first_bad = -1;
  for (int64_t part = 0; part < parts && first_bad < 0; ++part) {
    if (counts[part * (ranges + 1) + ranges] > 0) {
      first_bad = g.num_rows * part / parts;
      while (slot_of<kDepthOne>(g, indices + first_bad * depth) >= 0) {
        ++first_bad;
      }
    }
  }
  if (first_bad >= 0 && stop_at_bad) {
    return first_bad;
  }
  std::vector<int64_t> range_start(ranges + 1);
  for (uint64_t r = 0, position = 0; r <= ranges; ++r) {
    range_start[r] = position;
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t rows = counts[part * (ranges + 1) + r];
      counts[part * (ranges + 1) + r] = position;
      position += rows;
    }
  }
  const std::unique_ptr<Entry[]> sorted(new Entry[g.num_rows]);
  for_each_part([&](int64_t part, int64_t row_begin, int64_t row_end) {
    std::vector<int64_t> next(counts.begin() + part * (ranges + 1), counts.begin() + (part + 1) * (ranges + 1));
    Entry* sorted_data = sorted.get();
    for (int64_t n = row_begin; n < row_end; ++n) {
      const int64_t slot = slot_of<kDepthOne>(g, indices + n * depth);
      sorted_data[next[range_of(slot)]++] =
          static_cast<Entry>(slot & (kRangeSlots - 1)) << kPlaceShift | c10::bit_cast<Bits>(updates[n]);
    }
  });
  const auto place = [](Entry entry) { return static_cast<int64_t>(entry >> kPlaceShift); };
  const auto value = [](Entry entry) { return static_cast<acc_t>(c10::bit_cast<scalar_t>(static_cast<Bits>(entry))); };
  at::parallel_for(0, static_cast<int64_t>(ranges), 1, [&](int64_t begin, int64_t end) {
    // Half/bfloat16 sum in float. Only the entries the range's updates touch
    // are read, each set before it is added to: the buffer needs no clearing.
    const std::unique_ptr<acc_t[]> sum(kRounds ? new acc_t[kRangeSlots] : nullptr);
    for (int64_t r = begin; r < end; ++r) {
      const Entry* first = sorted.get() + range_start[r];
      const Entry* last = sorted.get() + range_start[r + 1];
      scalar_t* range_out = out + (r << kRangeBits);
      const int64_t range_slots = std::min(kRangeSlots, g.num_slots - (r << kRangeBits));
      if (base == out) {
        // In place: the range already holds its base.
      } else if (base != nullptr) {
        std::memcpy(range_out, base + (r << kRangeBits), range_slots * sizeof(scalar_t));
      } else {
        std::fill(range_out, range_out + range_slots, scalar_t{});
      }
      if constexpr (kRounds) {
        for (const Entry* u = first; u != last; ++u) {
          sum[place(*u)] = static_cast<acc_t>(range_out[place(*u)]);
        }
        for (const Entry* u = first; u != last; ++u) {
          sum[place(*u)] += value(*u);
        }
        for (const Entry* u = first; u != last; ++u) {
          range_out[place(*u)] = static_cast<scalar_t>(sum[place(*u)]);
        }
      } else {
        for (const Entry* u = first; u != last; ++u) {
          range_out[place(*u)] += value(*u);
        }
      }
    }
  });
  return first_bad;
}

// A half or bfloat16 row into zeros, summed in float and rounded back, is
// the row itself, bit for bit, unless it holds a -0.0 (0 + -0.0 is +0.0) or
// a NaN (whose bits the rounding may rewrite). Copies the row when it holds
// neither and says whether it did.
template <typename scalar_t>
bool copy_row_unchanged_by_rounding(const scalar_t* src, scalar_t* dst, int64_t columns) {
  static_assert(std::is_same_v<scalar_t, at::Half> || std::is_same_v<scalar_t, at::BFloat16>);
  constexpr uint16_t kMinusZero = 0x8000;
  constexpr uint16_t kInfinity = std::is_same_v<scalar_t, at::BFloat16> ? 0x7f80 : 0x7c00;
  // Bitwise, not short-circuit, so that the loop vectorises.
  uint16_t changed = 0;
  for (int64_t c = 0; c < columns; ++c) {
    const uint16_t bits = src[c].x;
    changed |= static_cast<uint16_t>(bits == kMinusZero) | static_cast<uint16_t>((bits & 0x7fff) > kInfinity);
  }
  if (changed == 0) {
    std::memcpy(dst, src, columns * sizeof(scalar_t));
  }
  return changed == 0;
}

// Slice updates: the block's rows are counting-sorted by slot (stably, so
// each slot keeps its rows in index order). Then the block's output is
// written once, slot after slot: a slot without rows is copied from `base`
// (or zeroed); a slot with rows starts from `base` (or zero) plus its first
// row and adds the others, in columns short enough for the sum to stay in
// the nearest cache (half/bfloat16 sum in a float buffer there and round once).
// Returns the first row out of bounds (and, with stop_at_bad, stops there),
// or -1.
template <bool kDepthOne, typename acc_t, typename scalar_t, typename index_t>
int64_t scatter_slices(const Block& block, const NdIndexGeometry& g, const index_t* indices,
                       const scalar_t* updates, const scalar_t* base, scalar_t* out, bool stop_at_bad) {
  constexpr bool kRounds = !std::is_same_v<acc_t, scalar_t>;
  const int64_t depth = kDepthOne ? 1 : g.depth;
  const int64_t slice = g.slice_size;
  const int64_t columns = block.column_end - block.column_begin;
  const int64_t slots = block.slot_end - block.slot_begin;

  // The rows whose slot lies in the block, in index order, with their slots
  // relative to the block, listed without a branch ("is it mine?" is a coin
  // flip). Then the rows of each slot, in index order. The lists are
  // written whole, so left uninitialized.
  const std::unique_ptr<int64_t[]> listed(new int64_t[2 * g.num_rows]);
  int64_t* listed_rows = listed.get();
  int64_t* listed_slots = listed_rows + g.num_rows;
  int64_t rows_in_block = 0;
  int64_t first_bad = -1;
  for (int64_t n = 0; n < g.num_rows; ++n) {
    const int64_t slot = slot_of<kDepthOne>(g, indices + n * depth);
    if (C10_UNLIKELY(slot < 0) && first_bad < 0) {
      first_bad = n;
      if (stop_at_bad) {
        return first_bad;
      }
    }
    // A row out of bounds (-1) lands below the block: outside it too.
    const int64_t relative = slot - block.slot_begin;
    listed_rows[rows_in_block] = n;
    listed_slots[rows_in_block] = relative;
    rows_in_block += static_cast<uint64_t>(relative) < static_cast<uint64_t>(slots);
  }
  std::vector<int64_t> slot_start(slots + 1, 0);
  for (int64_t i = 0; i < rows_in_block; ++i) {
    ++slot_start[listed_slots[i] + 1];
  }
  for (int64_t s = 0; s < slots; ++s) {
    slot_start[s + 1] += slot_start[s];
  }
  const std::unique_ptr<int64_t[]> sorted_rows(new int64_t[rows_in_block]);
  {
    std::vector<int64_t> next(slot_start.begin(), slot_start.end() - 1);
    for (int64_t i = 0; i < rows_in_block; ++i) {
      sorted_rows[next[listed_slots[i]]++] = listed_rows[i];
    }
  }

  const int64_t row_bytes = columns * static_cast<int64_t>(sizeof(scalar_t));
  acc_t float_sum[kRounds ? kSumColumns : 1];
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t offset = (block.slot_begin + s) * slice + block.column_begin;
    scalar_t* dst = out + offset;
    const scalar_t* from = base != nullptr ? base + offset : nullptr;
    const int64_t first = slot_start[s];
    const int64_t last = slot_start[s + 1];
    if (first == last) {
      if (from == dst) {
        continue;
      }
      if (from != nullptr) {
        // Not memcpy: for empty slices dst may be null (a view's base is not),
        // which memcpy may not be given even to copy nothing.
        std::copy_n(from, columns, dst);
      } else {
        std::fill(dst, dst + columns, scalar_t{});
      }
      continue;
    }
    // The update rows come in sorted order, at random: prefetch those of
    // later slots while this one sums.
    for (int64_t k = first; k < last && k + kPrefetchSlices < rows_in_block; ++k) {
      prefetch_row(updates + sorted_rows[k + kPrefetchSlices] * slice + block.column_begin, row_bytes);
    }
    const auto row = [&](int64_t k) { return updates + sorted_rows[k] * slice + block.column_begin; };
    if constexpr (kRounds) {
      if (from == nullptr && last - first == 1 && copy_row_unchanged_by_rounding(row(first), dst, columns)) {
        continue;
      }
    }
    for (int64_t c0 = 0; c0 < columns; c0 += kRounds ? kSumColumns : columns) {
      const int64_t width = std::min(columns - c0, kRounds ? kSumColumns : columns);
      acc_t* sum = float_sum;
      if constexpr (!kRounds) {
        sum = dst + c0;  // the output is its own accumulator
      }
      const scalar_t* src = row(first) + c0;
      // Zero plus the first row, not the row alone: a -0.0 update into zeros
      // sums to +0.0, as it does when added to a zeroed output.
      if (from != nullptr) {
        for (int64_t c = 0; c < width; ++c) {
          sum[c] = static_cast<acc_t>(from[c0 + c]) + static_cast<acc_t>(src[c]);
        }
      } else {
        for (int64_t c = 0; c < width; ++c) {
          sum[c] = acc_t{} + static_cast<acc_t>(src[c]);
        }
      }
      for (int64_t k = first + 1; k < last; ++k) {
        src = row(k) + c0;
        for (int64_t c = 0; c < width; ++c) {
          sum[c] += static_cast<acc_t>(src[c]);
        }
      }
      if constexpr (kRounds) {
        for (int64_t c = 0; c < width; ++c) {
          dst[c0 + c] = static_cast<scalar_t>(sum[c]);
        }
      }
    }
  }
  return first_bad;
}

// Raises the out-of-bounds error of the first index row outside `shape`, if
// any: the rows alone, one thread, for calls with nothing else to do.
void raise_first_bad_row(const char* op, const at::Tensor& indices, const NdIndexGeometry& g, at::IntArrayRef shape) {
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "scatter_nd", [&] {
    const index_t* index_data = indices.const_data_ptr<index_t>();
    for (int64_t n = 0; n < g.num_rows; ++n) {
      if (slot_of<false>(g, index_data + n * g.depth) < 0) {
        raise_out_of_bounds(op, indices, n, shape);
      }
    }
  });
}

// Slices: each block starts, sums and writes its own part of the output.
// Elements: float32 updates into a large output, and half/bfloat16 ones into
// a large output or few beside it, are summed by ranges
// (scatter_elements_by_range). Otherwise the blocks scatter into an
// accumulator (the output itself unless it rounds) that ATen's copies start
// (from `tensor`, or zeros) and round, vectorised and over every thread:
// there are fewer element blocks than threads (see split_output).
at::Tensor scatter_into_cpu(const char* op, const at::Tensor* tensor, at::IntArrayRef shape, const at::Tensor& indices,
                            const at::Tensor& updates, const NdIndexGeometry& g, bool check_bounds, bool in_place) {
  if (g.num_slots * g.slice_size == 0) {
    // Nothing to write (shape [10**8, 0], say), where the slices' path would
    // still list every slot.
    if (check_bounds) {
      raise_first_bad_row(op, indices, g, shape);
    }
    return in_place ? *tensor : uninitialized(shape, updates.options());
  }
  const std::vector<Block> blocks = split_output(g);
  std::vector<int64_t> first_bad(blocks.size(), -1);
  const at::Tensor output = in_place ? *tensor : uninitialized(shape, updates.options());
  if (!in_place) {
    advise_huge_pages(output);
  }
  // In place, the base is the output: the kernels leave a slot's values
  // where they are instead of copying them.
  const at::Tensor base = tensor != nullptr ? tensor->contiguous() : at::Tensor();
  const bool elements = g.slice_size == 1;
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "scatter_nd", [&] {
    AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(at::kHalf, at::kBFloat16, at::kBool, updates.scalar_type(), "scatter_nd", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      constexpr bool kRounds = !std::is_same_v<acc_t, scalar_t>;
      const index_t* index_data = indices.const_data_ptr<index_t>();
      const scalar_t* update_data = updates.const_data_ptr<scalar_t>();
      if (!elements) {
        const scalar_t* base_data = base.defined() ? base.const_data_ptr<scalar_t>() : nullptr;
        scalar_t* out_data = output.mutable_data_ptr<scalar_t>();
        at::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) {
            first_bad[b] = g.depth == 1 ? scatter_slices<true, acc_t>(blocks[b], g, index_data, update_data,
                                                                      base_data, out_data, check_bounds)
                                        : scatter_slices<false, acc_t>(blocks[b], g, index_data, update_data,
                                                                       base_data, out_data, check_bounds);
          }
        });
        return;
      }
      if constexpr (kRangeSummable<scalar_t>) {
        if (sum_elements_by_range<scalar_t>(g)) {
          const scalar_t* base_data = base.defined() ? base.const_data_ptr<scalar_t>() : nullptr;
          scalar_t* out_data = output.mutable_data_ptr<scalar_t>();
          first_bad.front() = g.depth == 1 ? scatter_elements_by_range<true, acc_t>(g, index_data, update_data,
                                                                                    base_data, out_data, check_bounds)
                                           : scatter_elements_by_range<false, acc_t>(g, index_data, update_data,
                                                                                     base_data, out_data, check_bounds);
          return;
        }
      }
      const at::Tensor acc =
          kRounds ? uninitialized(shape, updates.options().dtype(c10::CppTypeToScalarType<acc_t>::value)) : output;
      if (kRounds) {
        advise_huge_pages(acc);
      }
      if (!base.defined()) {
        acc.zero_();
      } else if (!acc.is_same(base)) {  // in place, the output holds its base already
        acc.copy_(base);
      }
      acc_t* acc_data = static_cast<acc_t*>(acc.mutable_data_ptr());
      at::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          first_bad[b] = g.depth == 1
                             ? scatter_elements<true>(blocks[b], g, index_data, update_data, acc_data, check_bounds)
                             : scatter_elements<false>(blocks[b], g, index_data, update_data, acc_data, check_bounds);
        }
      });
      if (kRounds) {
        output.copy_(acc);
      }
    });
  });
  // Every block reads all rows, so each saw the same first bad row.
  if (check_bounds && first_bad.front() >= 0) {
    raise_out_of_bounds(op, indices, first_bad.front(), shape);
  }
  return output;
}

// Lowers first_bad to `row` unless a row before it was seen already.
inline void note_bad_row(std::atomic<int64_t>& first_bad, int64_t row) {
  int64_t seen = first_bad.load();
  while (row < seen && !first_bad.compare_exchange_weak(seen, row)) {
  }
}

// The offsets from a gathered slice's first element of its elements, in
// row-major order (for a slice that is not dense: transposed or broadcast).
std::vector<int64_t> slice_offsets(const SliceLayout& layout) {
  std::vector<int64_t> offsets{0};
  for (int64_t d = layout.dims - 1; d >= 0; --d) {
    std::vector<int64_t> longer;
    longer.reserve(offsets.size() * layout.sizes[d]);
    for (const int64_t offset : offsets) {
      for (const auto i : c10::irange(layout.sizes[d])) {
        longer.push_back(offset + i * layout.strides[d]);
      }
    }
    offsets = std::move(longer);
  }
  return offsets;
}

// Slices longer than this that are not dense are gathered from a contiguous
// copy of params rather than through a table of their offsets.
constexpr int64_t kMaxSliceOffsets = int64_t{1} << 20;

// Reads params in its own layout, so that a view or a broadcast (stride 0)
// is not copied first: a row's slice starts at the dot of its index with
// params' leading strides. Params with no element is never copied (every
// row is then out of bounds, and its copy would be itself: PyTorch calls an
// empty tensor contiguous).
void gather_into_cpu(at::Tensor& output, const at::Tensor& params, const at::Tensor& indices,
                     const NdIndexGeometry& g, bool check_bounds) {
  const int64_t slice = g.slice_size;
  const SliceLayout layout = slice_layout(params, g.depth);
  const bool dense_slice = layout.dense();
  if (!dense_slice && params.numel() > 0 && (!layout.fits || slice > kMaxSliceOffsets)) {
    gather_into_cpu(output, params.contiguous(), indices, g, check_bounds);
    return;
  }
  const std::vector<int64_t> offsets = dense_slice ? std::vector<int64_t>{} : slice_offsets(layout);
  const NdIndexGeometry in_params = in_params_geometry(g, params);
  advise_huge_pages(output);
  std::atomic<int64_t> first_bad{g.num_rows};
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "gather_nd", [&] {
    dispatch_by_element_size("gather_nd", params.element_size(), [&](auto tag) {
      using T = decltype(tag);
      const index_t* index_data = indices.const_data_ptr<index_t>();
      const T* src = static_cast<const T*>(params.const_data_ptr());
      T* dst = static_cast<T*>(output.mutable_data_ptr());
      const int64_t grain = std::max<int64_t>(1, kSerialWork / std::max<int64_t>(slice, 1));
      // Columns gathered per pass over the rows: all of them, but for a
      // slice of one stride whose elements lie a cache line or more apart
      // (the rows of a transposed matrix), a cache line of output's worth.
      // A pass then reads that many columns of params, which stay in the
      // nearest caches and their pages in the TLB, where each row read from
      // all of them; as no line holds two elements of one slice, no pass
      // needs a line that another loaded (benchmarks/METHODS.md).
      const bool by_lines = layout.dims == 1 && layout.strides[0] * static_cast<int64_t>(sizeof(T)) >= kCacheLine;
      const int64_t pass_columns = by_lines ? kCacheLine / static_cast<int64_t>(sizeof(T)) : std::max<int64_t>(slice, 1);
      const auto gather_rows = [&](auto depth_one, auto prefetching, int64_t begin, int64_t end) {
        constexpr bool kDepthOne = decltype(depth_one)::value;
        constexpr bool kPrefetching = decltype(prefetching)::value;
        // Copies of the pointers the rows use: the loop calls memcpy and
        // fill, which for all the compiler knows could change the variables
        // captured by reference, so it would read those again on every row.
        const index_t* const rows = index_data;
        const T* const source = src;
        T* const out = dst;
        const int64_t depth = kDepthOne ? 1 : g.depth;
        // The offset in params of row n's first element, or -1 when the row
        // is out of bounds (slot_of at depth one gives the index itself).
        const auto first_element = [&](int64_t n) {
          const int64_t slot = slot_of<kDepthOne>(in_params, rows + n * depth);
          return kDepthOne && slot > 0 ? slot * in_params.slot_strides[0] : slot;
        };
        for (int64_t column = 0; column < std::max<int64_t>(slice, 1); column += pass_columns) {
          const int64_t column_end = std::min(column + pass_columns, slice);
          // A dense slice has no table of offsets, nor has a slice with no element.
          const int64_t column_offset = offsets.empty() ? 0 : offsets[column];
          for (int64_t n = begin; n < end; ++n) {
            // The sources are cache misses the indices announce early:
            // prefetch a few rows ahead.
            if constexpr (kPrefetching) {
              const int64_t ahead = first_element(std::min(n + kPrefetchRows, end - 1));
              prefetch_row(source + std::max<int64_t>(ahead, 0) + column_offset,
                           (dense_slice ? slice : 1) * static_cast<int64_t>(sizeof(T)));
            }
            const int64_t first = first_element(n);
            T* row = out + n * slice;
            if (first < 0) {
              note_bad_row(first_bad, n);
              std::fill(row + column, row + column_end, T{});
            } else if (slice == 1) {
              *row = source[first];
            } else if (!dense_slice) {
              for (int64_t j = column; j < column_end; ++j) {
                row[j] = source[first + offsets[j]];
              }
            } else if (slice > 0) {
              std::memcpy(row, source + first, slice * sizeof(T));
            }
          }
        }
      };
      // A params small enough to stay in the last cache is read without
      // prefetching: out-of-order execution already overlaps those misses,
      // and finding the row ahead would cost more than it saves
      // (benchmarks/METHODS.md).
      const bool prefetching = params.numel() > kPrefetchFromBytes / params.element_size();
      at::parallel_for(0, g.num_rows, grain, [&](int64_t begin, int64_t end) {
        const auto with_depth = [&](auto depth_one) {
          if (prefetching) {
            gather_rows(depth_one, std::true_type{}, begin, end);
          } else {
            gather_rows(depth_one, std::false_type{}, begin, end);
          }
        };
        if (g.depth == 1) {
          with_depth(std::true_type{});
        } else {
          with_depth(std::false_type{});
        }
      });
    });
  });
  if (check_bounds && first_bad.load() < g.num_rows) {
    raise_out_of_bounds("gather_nd", indices, first_bad.load(), params.sizes());
  }
}

// The first index row out of bounds, found for its error: one thread, as
// only a compiled gather that has already seen a bad row asks.
void raise_first_bad_row_cpu(const at::Tensor& indices, const NdIndexGeometry& g, at::IntArrayRef params_shape) {
  raise_first_bad_row("gather_nd", indices, g, params_shape);
}

at::Tensor scatter_nd_cpu(const at::Tensor& indices, const at::Tensor& updates, c10::SymIntArrayRef shape,
                          bool check_bounds) {
  return scatter_add_op("scatter_nd", nullptr, indices, updates, C10_AS_INTARRAYREF_SLOW(shape), check_bounds,
                        scatter_into_cpu);
}

at::Tensor tensor_scatter_nd_add_cpu(const at::Tensor& tensor, const at::Tensor& indices,
                                     const at::Tensor& updates, bool check_bounds) {
  return scatter_add_op("tensor_scatter_nd_add", &tensor, indices, updates, tensor.sizes(), check_bounds,
                        scatter_into_cpu);
}

void tensor_scatter_nd_add_in_place_cpu(const at::Tensor& tensor, const at::Tensor& indices,
                                        const at::Tensor& updates, bool check_bounds) {
  tensor_scatter_nd_add_in_place_op(tensor, indices, updates, check_bounds, scatter_into_cpu);
}

at::Tensor gather_nd_cpu(const at::Tensor& params, const at::Tensor& indices, bool check_bounds) {
  return gather_op(params, indices, check_bounds, gather_into_cpu);
}

void check_gather_nd_indices_cpu(const at::Tensor& indices, c10::SymIntArrayRef params_shape,
                                 const at::Tensor& out_of_bounds) {
  check_gather_nd_indices_op(indices, C10_AS_INTARRAYREF_SLOW(params_shape), out_of_bounds, raise_first_bad_row_cpu);
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CPU, m) {
  m.impl("scatter_nd", &scatter_nd_cpu);
  m.impl("tensor_scatter_nd_add", &tensor_scatter_nd_add_cpu);
  m.impl("tensor_scatter_nd_add_", &tensor_scatter_nd_add_in_place_cpu);
  m.impl("gather_nd", &gather_nd_cpu);
  m.impl("check_gather_nd_indices", &check_gather_nd_indices_cpu);
}

}  // namespace cpu
}  // namespace torch_masked
