// The kernels' worker threads: parallel_for(items, threads, body) runs body(begin, end) over
// contiguous chunks of [0, items), CHUNKS_PER_THREAD per thread, taken in turn by the caller and
// threads - 1 workers.
//
// Why not OpenMP: the server runs libgomp with OMP_WAIT_POLICY=PASSIVE (a waiting thread sleeps at
// once, so that busy neighbours keep their cores; see completions_site/threads.py), and then every
// parallel region pays a futex wake-up and a reschedule of the worker, some tens of microseconds,
// about 150 times per decode step.  Here a worker that has finished spins for SPIN_MICROSECONDS
// before it sleeps: the next kernel of the same step, a few microseconds later, finds it awake, and a
// worker between steps, or one whose core a neighbour took, soon sleeps (a bounded spin, as
// GOMP_SPINCOUNT would give, but for these kernels only).  Not reentrant: one thread calls the
// kernels at a time (the engine's worker thread); a second caller waits for the first.
#pragma once

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

// The library is built with -fvisibility=hidden and exports only its C functions: two builds in one
// process (an A/B benchmark) must each keep their own pool, not share one through a merged symbol.
#define KERNEL_EXPORT __attribute__((visibility("default")))

namespace kernels {

constexpr int64_t SPIN_MICROSECONDS = 100;
constexpr int MAX_WORKERS = 63;
constexpr int64_t CHUNKS_PER_THREAD = 4;
constexpr int SOLO_CALLS = 512;

class Pool {
 public:
  void run(int64_t items, int threads, const std::function<void(int64_t, int64_t)>& body) {
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads <= 1 || items <= 1) {
      body(0, items);
      return;
    }
    std::lock_guard<std::mutex> caller(call_mutex_);
    if (solo_calls_left_ > 0) {  // contended lately: the caller alone (see below)
      --solo_calls_left_;
      body(0, items);
      return;
    }
    while (static_cast<int>(workers_.size()) < threads - 1) start_worker();
    body_ = &body;
    items_ = items;
    threads_ = threads;
    chunks_ = items < CHUNKS_PER_THREAD * threads ? items : CHUNKS_PER_THREAD * threads;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);  // idle ones report too
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    const auto began = std::chrono::steady_clock::now();
    slice();
    // The workers' chunks: spin briefly, then yield the core until they are done.
    const auto started = std::chrono::steady_clock::now();
    while (pending_.load(std::memory_order_acquire) != 0) {
      _mm_pause();
      if (std::chrono::steady_clock::now() - started > std::chrono::microseconds(SPIN_MICROSECONDS))
        std::this_thread::yield();
    }
    // A caller that waits for its workers longer than it worked itself shares the cores with busy
    // neighbours, which preempt the workers: when half of the last 16 calls did, the next SOLO_CALLS
    // (a few decode steps) run on the caller alone, and then the workers are tried again.
    const auto waited = std::chrono::steady_clock::now() - started;
    const bool slow = waited > (started - began) + std::chrono::microseconds(SPIN_MICROSECONDS);
    recent_ = ((recent_ << 1) | (slow ? 1u : 0u)) & 0xFFFFu;
    if (__builtin_popcount(recent_) >= 8) {
      recent_ = 0;
      solo_calls_left_ = SOLO_CALLS;
    }
  }

 private:
  // Takes chunks until none is left, so that a thread a neighbour preempts holds up one chunk at
  // most: the others take the rest.
  void slice() {
    const int64_t chunks = chunks_;
    const int64_t per = (items_ + chunks - 1) / chunks;
    for (int64_t chunk; (chunk = next_.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      const int64_t begin = chunk * per;
      const int64_t end = begin + per < items_ ? begin + per : items_;
      if (begin < end) (*body_)(begin, end);
    }
  }

  void start_worker() {
    const int index = static_cast<int>(workers_.size()) + 1;
    // The generation it has seen is the current one, read here: a thread that starts running only
    // after the caller moved on to the next generation must still take that one.
    const uint64_t seen = generation_.load(std::memory_order_acquire);
    workers_.emplace_back([this, index, seen] { work(index, seen); });
    workers_.back().detach();  // never joined: the pool lives as long as the process
  }

  void work(int index, uint64_t seen) {
    for (;;) {
      auto started = std::chrono::steady_clock::now();
      uint64_t now_generation;
      int spins = 0;
      while ((now_generation = generation_.load(std::memory_order_acquire)) == seen) {
        _mm_pause();
        if (++spins % 64 == 0 &&
            std::chrono::steady_clock::now() - started > std::chrono::microseconds(SPIN_MICROSECONDS)) {
          std::unique_lock<std::mutex> lock(sleep_mutex_);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
          started = std::chrono::steady_clock::now();
        }
      }
      seen = now_generation;
      if (index < threads_) slice();
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::mutex call_mutex_, sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t items_ = 0, chunks_ = 1;
  uint32_t recent_ = 0;       // one bit per recent call: did the caller wait long for its workers?
  int solo_calls_left_ = 0;
  std::atomic<int64_t> next_{0};
  int threads_ = 1;
  std::vector<std::thread> workers_;
};

// One pool per process, never destroyed (its threads are detached and may be asleep at exit).
inline Pool& pool() {
  static Pool* instance = new Pool();
  return *instance;
}

inline void parallel_for(int64_t items, int threads, const std::function<void(int64_t, int64_t)>& body) {
  pool().run(items, threads, body);
}

}  // namespace kernels
