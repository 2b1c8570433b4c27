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

}  // namespace rmscore
