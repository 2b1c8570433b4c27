#include "transport.h"

#include <grpc/compression.h>
#include <grpc/grpc.h>
#include <malloc.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

namespace rmscore {

int MaxConcurrentStreams(const Config& cfg) { return cfg.max_concurrent_streams; }

void ConfigureTransport(const Config& cfg, grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(int(cfg.max_request_bytes));
  // gRPC 1.51 inflates a compressed message whole and only then compares it with the receive limit:
  // a 1 MiB gzip message took 1 GiB of memory before its refusal. It has no way to bound the
  // inflation, so the port accepts no compression at all: a compressed request is refused at its
  // headers, UNIMPLEMENTED "Compression algorithm 'gzip' is disabled.", before a byte is inflated.
  // Its grpc-accept-encoding answer tells clients to send identity.
  builder->AddChannelArgument(GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET, 1 << GRPC_COMPRESS_NONE);
  // Advertised in SETTINGS: gRPC clients hold the calls over it until a stream ends (3000 grpcio
  // calls at once on one channel: all OK). gRPC 1.51 also enforces it as a connection error: a client
  // that opens one stream more than it has acknowledged loses the connection (no GOAWAY; the calls it
  // had open end UNAVAILABLE "Failed parsing HTTP/2"). No 1.51 argument makes that a REFUSED_STREAM;
  // docs/contract.md, "Streams per connection", tells clients what to do.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, MaxConcurrentStreams(cfg));
  // gRPC's defaults, set here so they are stated: a PING flood on a connection gets GOAWAY after
  // kMaxPingStrikes + 1 PINGs (measured: under 100, docs/hardening.md); the interval lets clients
  // keep a connection alive, but pings without calls open stay allowed only every 2 hours.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kMinPingIntervalMs);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, kMaxPingStrikes);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // Clients balancing round_robin re-resolve only when a connection closes: the age makes them find new replicas.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, cfg.max_connection_age_ms());
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, cfg.max_connection_age_grace_ms());
}

bool PinMmapThreshold(size_t bytes) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return false;
  return mallopt(M_MMAP_THRESHOLD, int(bytes)) == 1;
}

HeapTrimmer::HeapTrimmer(std::chrono::milliseconds interval) {
  thread_ = std::thread([this, interval] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, interval, [this] { return stop_; })) {
      lk.unlock();
      malloc_trim(0);  // a few ms; an allocation meanwhile waits on its arena's lock at most that long
      lk.lock();
    }
  });
}

HeapTrimmer::~HeapTrimmer() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

}  // namespace rmscore
