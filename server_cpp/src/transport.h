// The gRPC port's transport limits (message size, compression, HTTP/2 streams and pings, connection
// age) and the heap trimmer that hands memory freed after an attack back. What each one stops, and
// what gRPC 1.51 cannot stop, is in docs/hardening.md, "Transport attacks (C++)".
#pragma once

#include <grpcpp/server_builder.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "config.h"

namespace rmscore {

// At most this many calls open on one connection: a client cannot have more accepted than the queue
// holds (one sequence each at least), so a larger count only holds memory per open stream.
int MaxConcurrentStreams(const Config& cfg);

// Gap between two PINGs a client may send while it has calls open and gets no data; a closer one is a
// strike, and a third strike closes the connection (GOAWAY ENHANCE_YOUR_CALM "too_many_pings").
// Below rmscore_client's 30 s keepalive, so it never strikes.
inline constexpr int kMinPingIntervalMs = 10000;
inline constexpr int kMaxPingStrikes = 2;

void ConfigureTransport(const Config& cfg, grpc::ServerBuilder* builder);

// Hands the heap's free pages back to the kernel (glibc malloc_trim) every `interval` until
// destroyed. Freed memory otherwise stays resident in glibc's arenas: after a rapid reset of 10k
// streams the server held +200 MiB it no longer used, and every later attack's allocations too.
class HeapTrimmer {
 public:
  explicit HeapTrimmer(std::chrono::milliseconds interval);
  ~HeapTrimmer();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

inline constexpr std::chrono::seconds kHeapTrimInterval{5};

// A buffer this large or larger that the heap has no free room for is mmapped, and unmapped when
// freed. glibc raises its own threshold each time it frees an mmapped block, up to 32 MiB: after the
// first multi-MiB request the next ones grew the heap, where small allocations between them pinned
// its pages, and the trimmer could not give them back (+7.5% and +12.6% resident 10 s after streams
// of 1M-id items and of 32k-id sequences, +0.1% pinned: docs/bench/mmap-threshold_2026-12-07/).
// ONNX Runtime's activations live in its own arena, so the model's runs do not pay an mmap per op.
inline constexpr size_t kMmapThresholdBytes = size_t{1} << 20;

// Pins glibc's mmap threshold at `bytes` (glibc stops moving it). False, changing nothing, where the
// operator set MALLOC_MMAP_THRESHOLD_, which glibc has applied already.
bool PinMmapThreshold(size_t bytes = kMmapThresholdBytes);

}  // namespace rmscore
