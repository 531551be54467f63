// CPU kernels for masked::boolean_mask and masked::boolean_mask_backward.
// The tensor is viewed as [outer, rows, inner] (boolean_mask.h): every true
// mask position moves one contiguous slice of `inner` elements. A parallel
// count over chunks of mask positions and a prefix sum (compaction.h) tell
// each chunk where its slices go; then tasks of (chunk, run of outer blocks)
// move their slices on their own. Only bits move, so one instantiation per element
// size serves every dtype.
#include "boolean_mask.h"
#include "common.h"
#include "cpu/byte_scan.h"
#include "cpu/compaction.h"
#include "cpu/huge_pages.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

namespace torch_masked {
namespace cpu {
namespace {

// Elements moved by one task, at least, so that small inputs stay on one thread.
constexpr int64_t kMinTaskElements = int64_t{1} << 15;
// Mask bytes are looked at 8 at a time where runs are followed: an all-false
// word is skipped (or zeroed), an all-true word's 8 positions are taken
// without testing each.
constexpr int64_t kWord = 8;
constexpr uint64_t kAllTrue = 0x0101010101010101ULL;
// Slices this large are moved with memcpy/memset, a whole run of equal mask
// positions per call; smaller ones by branch-free loops, one slice per position.
constexpr int64_t kRunSliceBytes = 64;

uint64_t load_word(const uint8_t* mask) {
  uint64_t word;
  std::memcpy(&word, mask, sizeof(word));
  return word;
}

// Every loop here reads `mask[j] != 0`, so all agree whatever the bytes hold.
int64_t count_true(const uint8_t* mask, int64_t begin, int64_t end) {
  return count_nonzero_bytes(mask + begin, end - begin, 0xFF);
}

// One past the last true position of [begin, end), or begin if none is true.
int64_t end_of_last_true(const uint8_t* mask, int64_t begin, int64_t end) {
  while (end - kWord >= begin && load_word(mask + end - kWord) == 0) {
    end -= kWord;
  }
  while (end > begin && mask[end - 1] == 0) {
    --end;
  }
  return end;
}

// The end of the run of positions from j (< end) that agree with mask[j].
int64_t run_end(const uint8_t* mask, int64_t j, int64_t end) {
  const bool value = mask[j] != 0;
  const uint64_t whole_word = value ? kAllTrue : 0;
  ++j;
  while (j + kWord <= end && load_word(mask + j) == whole_word) {
    j += kWord;
  }
  while (j < end && (mask[j] != 0) == value) {
    ++j;
  }
  return j;
}

// The outer blocks that one task moves for one chunk of mask positions:
// `count` blocks, the first at src and dst, the next `*_stride` bytes on.
// The mask-position side (the input of compact, the output of expand) points
// at the block's position 0; the packed side at the chunk's first packed slice.
struct Blocks {
  int64_t count;
  const char* src;
  int64_t src_stride;
  char* dst;
  int64_t dst_stride;
};

// Large slices: one memcpy per run of true positions and block (consecutive
// selected slices are contiguous on both sides), one memset per run of false
// ones in expand.
struct RunMover {
  int64_t slice_bytes;

  // Copies the selected slices to the packed side.
  void compact(const uint8_t* mask, int64_t begin, int64_t end, const Blocks& blocks) const {
    int64_t packed = 0;
    for (int64_t j = begin; j < end;) {
      const int64_t stop = run_end(mask, j, end);
      if (mask[j] != 0) {
        for (int64_t b = 0; b < blocks.count; ++b) {
          std::memcpy(blocks.dst + b * blocks.dst_stride + packed * slice_bytes,
                      blocks.src + b * blocks.src_stride + j * slice_bytes, (stop - j) * slice_bytes);
        }
        packed += stop - j;
      }
      j = stop;
    }
  }

  // The inverse into every slice: packed slices where the mask is true,
  // zeros (all bits clear: zero in every dtype) where it is false.
  void expand(const uint8_t* mask, int64_t begin, int64_t end, const Blocks& blocks) const {
    int64_t packed = 0;
    for (int64_t j = begin; j < end;) {
      const int64_t stop = run_end(mask, j, end);
      for (int64_t b = 0; b < blocks.count; ++b) {
        char* dst = blocks.dst + b * blocks.dst_stride + j * slice_bytes;
        if (mask[j] != 0) {
          std::memcpy(dst, blocks.src + b * blocks.src_stride + packed * slice_bytes, (stop - j) * slice_bytes);
        } else {
          std::memset(dst, 0, (stop - j) * slice_bytes);
        }
      }
      packed += mask[j] != 0 ? stop - j : 0;
      j = stop;
    }
  }
};

// Mask positions looked at together by compact: a bitmap of their true ones
// is made first, then they are moved, so that the loads of a sparse
// selection do not wait on each other behind mispredicted branches.
constexpr int64_t kBatch = 1024;
constexpr int64_t kBatchWords = kBatch / 64;
// A batch with at most this share of false positions (1 / 16) is moved as
// runs of true ones, one memcpy each: runs then average 16 slices or more.
constexpr int64_t kDenseFalseShift = 4;

// Sets bit j of bits (kBatchWords words) when mask[j] is true, j < len <=
// kBatch, and clears the bits past len; returns how many are set.
int64_t true_bits(const uint8_t* mask, int64_t len, uint64_t* bits) {
  int64_t count = 0;
  for (int64_t w = 0; w < kBatchWords; ++w) {
    const int64_t base = w * 64;
    uint64_t word = 0;
    if (base + 64 <= len) {
      word = nonzero_bytes<64>(mask + base, 0xFF);
    } else {
      for (int64_t u = base; u < len; ++u) {
        word |= uint64_t{mask[u] != 0} << (u - base);
      }
    }
    bits[w] = word;
    count += popcount64(word);
  }
  return count;
}

// The first position from j on whose bit is `value`, or len if none is.
int64_t next_bit(const uint64_t* bits, int64_t j, int64_t len, bool value) {
  while (j < len) {
    const uint64_t word = (value ? bits[j / 64] : ~bits[j / 64]) & (~uint64_t{0} << (j % 64));
    if (word != 0) {
      return std::min(len, j / 64 * 64 + __builtin_ctzll(word));
    }
    j = j / 64 * 64 + 64;
  }
  return len;
}

// Lists the true positions of the bitmap, in order, into picked; returns how many.
int64_t pick_true(const uint64_t* bits, uint16_t* picked) {
  int64_t count = 0;
  for (int64_t w = 0; w < kBatchWords; ++w) {
    for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
      picked[count++] = static_cast<uint16_t>(w * 64 + __builtin_ctzll(word));
    }
  }
  return count;
}

// Small slices of `units` Units each (kOneUnit: exactly one, moved by a
// single load and store), moved with no branch per position.
template <typename Unit, bool kOneUnit>
struct BranchFreeMover {
  int64_t units;

  int64_t stride() const { return kOneUnit ? 1 : units; }

  void copy(Unit* dst, const Unit* src) const {
    if constexpr (kOneUnit) {
      *dst = *src;
    } else {
      for (int64_t t = 0; t < units; ++t) {
        dst[t] = src[t];
      }
    }
  }

  void copy_or_zero(Unit* dst, const Unit* src, bool keep) const {
    for (int64_t t = 0; t < stride(); ++t) {
      const Unit value = src[t];
      dst[t] = keep ? value : Unit{};
    }
  }

  // dst[i] = src[picked[i]] for i < count; 8 consecutive picked slices (the
  // common case of a dense mask) move as one block.
  void gather(const Unit* src, const uint16_t* picked, int64_t count, Unit* dst) const {
    int64_t i = 0;
    while (i + kWord <= count) {
      if (picked[i + kWord - 1] - picked[i] == kWord - 1) {
        std::memcpy(dst + i * stride(), src + picked[i] * stride(), kWord * stride() * sizeof(Unit));
        i += kWord;
      } else {
        copy(dst + i * stride(), src + picked[i] * stride());
        ++i;
      }
    }
    for (; i < count; ++i) {
      copy(dst + i * stride(), src + picked[i] * stride());
    }
  }

  // Lists each batch's true positions once (as runs if nearly all are
  // true), then moves them in every block.
  void compact(const uint8_t* mask, int64_t begin, int64_t end, const Blocks& blocks) const {
    uint64_t bits[kBatchWords];
    uint16_t picked[kBatch];
    int64_t packed = 0;
    for (int64_t first = begin; first < end; first += kBatch) {
      const int64_t len = std::min(end - first, kBatch);
      const int64_t count = true_bits(mask + first, len, bits);
      const auto block_src = [&](int64_t b) {
        return reinterpret_cast<const Unit*>(blocks.src + b * blocks.src_stride) + first * stride();
      };
      const auto block_dst = [&](int64_t b) {
        return reinterpret_cast<Unit*>(blocks.dst + b * blocks.dst_stride) + packed * stride();
      };
      if (len - count <= len >> kDenseFalseShift) {
        // picked holds the runs as (start, stop) pairs; there are at most
        // one more than the false positions.
        int64_t runs = 0;
        for (int64_t j = next_bit(bits, 0, len, true); j < len; j = next_bit(bits, j, len, true)) {
          const int64_t stop = next_bit(bits, j, len, false);
          picked[2 * runs] = static_cast<uint16_t>(j);
          picked[2 * runs + 1] = static_cast<uint16_t>(stop);
          ++runs;
          j = stop;
        }
        for (int64_t b = 0; b < blocks.count; ++b) {
          const Unit* src = block_src(b);
          Unit* dst = block_dst(b);
          for (int64_t r = 0; r < runs; ++r) {
            const int64_t run = picked[2 * r + 1] - picked[2 * r];
            std::memcpy(dst, src + picked[2 * r] * stride(), run * stride() * sizeof(Unit));
            dst += run * stride();
          }
        }
      } else {
        pick_true(bits, picked);
        for (int64_t b = 0; b < blocks.count; ++b) {
          gather(block_src(b), picked, count, block_dst(b));
        }
      }
      packed += count;
    }
  }

  void expand(const uint8_t* mask, int64_t begin, int64_t end, const Blocks& blocks) const {
    for (int64_t b = 0; b < blocks.count; ++b) {
      expand_block(mask, begin, end, reinterpret_cast<const Unit*>(blocks.src + b * blocks.src_stride),
                   reinterpret_cast<Unit*>(blocks.dst + b * blocks.dst_stride));
    }
  }

  // Every position writes its slice, from the packed slice k or zero, and
  // only a true one advances k. Packed slice k is read for false positions
  // too, which stays inside the chunk's part as long as a true position
  // follows, so the branch-free loop stops at the last true one. A word of
  // 8 equal positions starts a run, moved by one memset or memcpy: a sparse
  // mask then costs a few long memsets, not one short one per word.
  void expand_block(const uint8_t* mask, int64_t begin, int64_t end, const Unit* src, Unit* dst) const {
    const int64_t last = end_of_last_true(mask, begin, end);
    int64_t k = 0;
    int64_t j = begin;
    while (j + kWord <= last) {
      const uint64_t word = load_word(mask + j);
      if (word == 0 || word == kAllTrue) {
        const int64_t stop = run_end(mask, j, last);
        if (word == 0) {
          std::memset(dst + j * stride(), 0, (stop - j) * stride() * sizeof(Unit));
        } else {
          std::memcpy(dst + j * stride(), src + k * stride(), (stop - j) * stride() * sizeof(Unit));
          k += stop - j;
        }
        j = stop;
        continue;
      }
      for (const int64_t word_end = j + kWord; j < word_end; ++j) {
        copy_or_zero(dst + j * stride(), src + k * stride(), mask[j] != 0);
        k += mask[j] != 0;
      }
    }
    for (; j < last; ++j) {
      copy_or_zero(dst + j * stride(), src + k * stride(), mask[j] != 0);
      k += mask[j] != 0;
    }
    std::memset(dst + last * stride(), 0, (end - last) * stride() * sizeof(Unit));
  }
};

// Calls fn with the mover that suits slices of `slice_bytes` bytes between
// buffers a and b: memcpy runs for large slices; otherwise the branch-free
// loops over the widest units that fit, a single unit per slice if it can.
template <typename Fn>
void with_mover(const char* op, int64_t slice_bytes, const void* a, const void* b, Fn&& fn) {
  if (slice_bytes >= kRunSliceBytes) {
    return fn(RunMover{slice_bytes});
  }
  const int64_t unit_bytes = widest_unit_bytes(slice_bytes, {a, b});
  dispatch_by_element_size(op, unit_bytes, [&](auto unit) {
    using Unit = decltype(unit);
    if (unit_bytes == slice_bytes) {
      fn(BranchFreeMover<Unit, true>{1});
    } else {
      fn(BranchFreeMover<Unit, false>{slice_bytes / unit_bytes});
    }
  });
}

// Runs task(first_block, blocks, begin, end, packed_begin) over every outer
// block and every chunk of mask positions [begin, end), whose selected
// slices are the packed ones from packed_begin on. Work is split over
// (chunk, block) pairs; a task gets consecutive blocks of one chunk, so the
// chunk's mask is read once for all of them.
template <typename Task>
void for_each_task(const MaskedView& view, const CompactionPlan& plan, const Task& task) {
  const int64_t chunk_elements = std::min(plan.chunk_size, view.rows) * std::max<int64_t>(view.inner, 1);
  const int64_t grain = std::max<int64_t>(1, kMinTaskElements / std::max<int64_t>(chunk_elements, 1));
  at::parallel_for(0, plan.num_chunks() * view.outer, grain, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last;) {
      const int64_t chunk = t / view.outer;
      const int64_t block = t % view.outer;
      const int64_t blocks = std::min(last - t, view.outer - block);
      const int64_t begin = chunk * plan.chunk_size;
      task(block, blocks, begin, std::min(view.rows, begin + plan.chunk_size), plan.offsets[chunk]);
      t += blocks;
    }
  });
}

CompactionPlan plan_mask(const uint8_t* mask, const MaskedView& view) {
  // Chunks of mask positions large enough to move kMinTaskElements elements.
  const int64_t min_chunk = std::max<int64_t>(1, kMinTaskElements / std::max<int64_t>(view.inner, 1));
  return plan_compaction(
      view.rows, [&](int64_t begin, int64_t end) { return count_true(mask, begin, end); }, min_chunk);
}

at::Tensor boolean_mask_cpu(const at::Tensor& tensor, const at::Tensor& mask, int64_t axis) {
  check_same_device("boolean_mask", {{"tensor", &tensor}, {"mask", &mask}});
  const MaskedView view = masked_view("boolean_mask", "tensor.shape", tensor.sizes(), mask, axis);
  const at::Tensor flags = mask.contiguous();
  const uint8_t* mask_data = static_cast<const uint8_t*>(flags.const_data_ptr());
  const CompactionPlan plan = plan_mask(mask_data, view);
  const at::Tensor input = tensor.contiguous();
  at::Tensor result = uninitialized(view.masked_shape(tensor.sizes(), plan.total()), input.options());
  if (result.numel() == 0) {
    return result;
  }
  advise_huge_pages(result);
  const int64_t slice_bytes = view.inner * input.element_size();
  const char* src = static_cast<const char*>(input.const_data_ptr());
  char* dst = static_cast<char*>(result.data_ptr());
  with_mover("boolean_mask", slice_bytes, src, dst, [&](auto mover) {
    const int64_t rows_bytes = view.rows * slice_bytes;
    const int64_t packed_bytes = plan.total() * slice_bytes;
    for_each_task(view, plan, [&](int64_t block, int64_t blocks, int64_t begin, int64_t end, int64_t packed) {
      mover.compact(mask_data, begin, end,
                    Blocks{blocks, src + block * rows_bytes, rows_bytes,
                           dst + block * packed_bytes + packed * slice_bytes, packed_bytes});
    });
  });
  return result;
}

at::Tensor boolean_mask_backward_cpu(const at::Tensor& grad, const at::Tensor& mask, c10::SymIntArrayRef input_sizes,
                                     int64_t axis) {
  const at::IntArrayRef input_shape = C10_AS_INTARRAYREF_SLOW(input_sizes);
  check_same_device("boolean_mask_backward", {{"grad", &grad}, {"mask", &mask}});
  const MaskedView view = masked_view("boolean_mask_backward", "input_shape", input_shape, mask, axis);
  check_masked_grad(grad, input_shape, view);
  const at::Tensor flags = mask.contiguous();
  const uint8_t* mask_data = static_cast<const uint8_t*>(flags.const_data_ptr());
  const CompactionPlan plan = plan_mask(mask_data, view);
  MASKED_CHECK_VALUE(grad.size(view.axis) == plan.total(), "boolean_mask_backward: expected grad.shape[", view.axis,
                    "] to equal the number of true elements of mask, ", plan.total(), ", got ",
                    grad.size(view.axis));
  const at::Tensor packed_grad = grad.contiguous();
  at::Tensor result = uninitialized(input_shape, packed_grad.options());
  if (result.numel() == 0) {
    return result;
  }
  advise_huge_pages(result);
  const int64_t slice_bytes = view.inner * packed_grad.element_size();
  const char* src = static_cast<const char*>(packed_grad.const_data_ptr());
  char* dst = static_cast<char*>(result.data_ptr());
  with_mover("boolean_mask_backward", slice_bytes, src, dst, [&](auto mover) {
    const int64_t rows_bytes = view.rows * slice_bytes;
    const int64_t packed_bytes = plan.total() * slice_bytes;
    for_each_task(view, plan, [&](int64_t block, int64_t blocks, int64_t begin, int64_t end, int64_t packed) {
      mover.expand(mask_data, begin, end,
                   Blocks{blocks, src + block * packed_bytes + packed * slice_bytes, packed_bytes,
                          dst + block * rows_bytes, rows_bytes});
    });
  });
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(masked, CPU, m) {
  m.impl("boolean_mask", &boolean_mask_cpu);
  m.impl("boolean_mask_backward", &boolean_mask_backward_cpu);
}

}  // namespace cpu
}  // namespace torch_masked
