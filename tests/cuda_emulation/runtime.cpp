// The fibers, barriers and launches of cuda_emulation.h, and the switch of
// its emulated CUDA graph capture.
#include "cuda_emulation.h"

#include <torch/library.h>

#include <ucontext.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace cuda_emulation {

bool capturing = false;
uint3 block_index{0, 0, 0};
dim3 grid_size;
dim3 block_size;

namespace {

// Kernels keep a few arrays of up to a few hundred bytes in registers; the
// C++ frames around them need far less than this.
constexpr size_t kStackBytes = 128 * 1024;

struct Fiber {
  ucontext_t context;
  bool finished;
  uint3 index;
};

// A warp's exchange: lanes write their slots; the last of the mask to
// arrive copies them for all to read and opens the next generation.
struct Warp {
  int arrived = 0;
  unsigned generation = 0;
  unsigned mask = 0;
  uint64_t slots[32];
  uint64_t published[32];
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<char> stacks;
  std::vector<Warp> warps;
  std::vector<int> order;
  ucontext_t scheduler;
  int running = -1;
  int unfinished = 0;
  int barrier_arrived = 0;
  unsigned barrier_generation = 0;
  // Counts arrivals and finishes: a round of the scheduler without any is a deadlock.
  uint64_t progress = 0;
  const std::function<void()>* body = nullptr;
  std::exception_ptr failure;
};

Block block;

// Threads and blocks run in a shuffled order (the same on every run), so
// that a kernel that depends on the order, missing a barrier, is likelier to
// show it.
std::mt19937& order_generator() {
  static std::mt19937 generator(20261201);
  return generator;
}

void wait_for_others() { swapcontext(&block.fibers[block.running].context, &block.scheduler); }

// Threads that finished no longer hold __syncthreads up, as on the GPU.
void open_barrier_if_complete() {
  if (block.barrier_arrived > 0 && block.barrier_arrived == block.unfinished) {
    block.barrier_arrived = 0;
    ++block.barrier_generation;
  }
}

void run_thread() {
  try {
    (*block.body)();
  } catch (...) {
    if (!block.failure) {
      block.failure = std::current_exception();
    }
  }
  block.fibers[block.running].finished = true;
  --block.unfinished;
  ++block.progress;
  open_barrier_if_complete();
}  // returns to the scheduler (uc_link)

std::string text(const dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

void run_block(int threads) {
  static ucontext_t blank;
  static const bool have_blank = getcontext(&blank) == 0;
  if (!have_blank) {
    throw std::runtime_error("cuda emulation: getcontext failed");
  }
  block.unfinished = threads;
  block.barrier_arrived = 0;
  for (Warp& warp : block.warps) {
    warp.arrived = 0;
  }
  for (int i = 0; i < threads; ++i) {
    Fiber& fiber = block.fibers[i];
    fiber.finished = false;
    fiber.index = uint3{i % block_size.x, i / block_size.x % block_size.y, i / (block_size.x * block_size.y)};
    fiber.context = blank;
    fiber.context.uc_stack.ss_sp = block.stacks.data() + static_cast<size_t>(i) * kStackBytes;
    fiber.context.uc_stack.ss_size = kStackBytes;
    fiber.context.uc_link = &block.scheduler;
    makecontext(&fiber.context, run_thread, 0);
  }
  while (block.unfinished > 0 && !block.failure) {
    const uint64_t progress_before = block.progress;
    std::shuffle(block.order.begin(), block.order.end(), order_generator());
    for (const int i : block.order) {
      if (!block.fibers[i].finished && !block.failure) {
        block.running = i;
        swapcontext(&block.scheduler, &block.fibers[i].context);
      }
    }
    block.running = -1;
    if (block.progress == progress_before && !block.failure) {
      throw std::runtime_error("cuda emulation: deadlock in block " +
                               text(dim3(block_index.x, block_index.y, block_index.z)) + ": " +
                               std::to_string(block.unfinished) +
                               " threads wait at a barrier or warp intrinsic that the others never reach");
    }
  }
}

}  // namespace

uint3 thread_index() {
  if (block.running < 0) {
    throw std::runtime_error("cuda emulation: threadIdx read outside a kernel");
  }
  return block.fibers[block.running].index;
}

void launch(const LaunchConfig& config, const std::function<void()>& thread_body) {
  const dim3& g = config.grid;
  const dim3& b = config.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  const bool grid_ok = g.x >= 1 && g.x <= 2147483647u && g.y >= 1 && g.y <= 65535 && g.z >= 1 && g.z <= 65535;
  const bool block_ok = threads >= 1 && threads <= 1024 && b.z <= 64;
  if (!grid_ok || !block_ok || config.shared_bytes > 48 * 1024) {
    throw std::runtime_error("cuda emulation: invalid launch configuration: grid " + text(g) + ", block " + text(b) +
                             ", " + std::to_string(config.shared_bytes) + " bytes of dynamic shared memory");
  }
  const int n = static_cast<int>(threads);
  if (block.fibers.size() < threads) {
    block.fibers.resize(n);
    block.stacks.resize(threads * kStackBytes);
  }
  block.warps.assign((n + 31) / 32, Warp{});
  block.order.resize(n);
  for (int i = 0; i < n; ++i) {
    block.order[i] = i;
  }
  grid_size = g;
  block_size = b;
  block.body = &thread_body;
  block.failure = nullptr;
  const uint64_t blocks = uint64_t{g.x} * g.y * g.z;
  std::vector<uint64_t> block_order(blocks);
  for (uint64_t i = 0; i < blocks; ++i) {
    block_order[i] = i;
  }
  std::shuffle(block_order.begin(), block_order.end(), order_generator());
  for (const uint64_t i : block_order) {
    block_index = uint3{static_cast<unsigned>(i % g.x), static_cast<unsigned>(i / g.x % g.y),
                        static_cast<unsigned>(i / (uint64_t{g.x} * g.y))};
    run_block(n);
    if (block.failure) {
      std::rethrow_exception(block.failure);  // the other threads' stacks are simply abandoned
    }
  }
  block.body = nullptr;
}

void sync_threads() {
  const unsigned generation = block.barrier_generation;
  ++block.barrier_arrived;
  ++block.progress;
  open_barrier_if_complete();
  while (block.barrier_generation == generation) {
    wait_for_others();
  }
}

void warp_exchange(unsigned mask, uint64_t value, uint64_t (&lanes)[32]) {
  const uint3 t = thread_index();
  const unsigned linear = t.x + t.y * block_size.x + t.z * block_size.x * block_size.y;
  const unsigned lane = linear % 32;
  Warp& warp = block.warps[linear / 32];
  if (((mask >> lane) & 1u) == 0) {
    throw std::runtime_error("cuda emulation: a warp intrinsic called by a lane outside its mask");
  }
  if (warp.arrived == 0) {
    warp.mask = mask;
  } else if (warp.mask != mask) {
    throw std::runtime_error("cuda emulation: lanes of one warp met in a warp intrinsic with different masks");
  }
  warp.slots[lane] = value;
  const unsigned generation = warp.generation;
  ++warp.arrived;
  ++block.progress;
  // A lane reads `published` before it can arrive at the next exchange, and
  // that one completes only when every lane has arrived: one copy suffices.
  if (warp.arrived == __builtin_popcount(mask)) {
    std::memcpy(warp.published, warp.slots, sizeof(warp.slots));
    warp.arrived = 0;
    ++warp.generation;
  }
  while (warp.generation == generation) {
    wait_for_others();
  }
  std::memcpy(lanes, warp.published, sizeof(lanes));
}

at::Tensor filled_with_garbage(at::Tensor t) {
  static const unsigned char patterns[] = {0xff, 0xa5, 0x7f, 0x01, 0x80};
  static size_t next = 0;
  if (t.numel() > 0) {
    std::memset(t.data_ptr(), patterns[next], t.nbytes());
    next = (next + 1) % sizeof(patterns);
  }
  return t;
}

}  // namespace cuda_emulation

TORCH_LIBRARY(cuda_emulation, m) {
  m.def("set_capturing(bool capturing) -> ()", [](bool capturing) { cuda_emulation::capturing = capturing; });
}
