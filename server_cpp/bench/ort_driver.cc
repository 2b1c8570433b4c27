// rmscore-ort-driver: ONNX Runtime in-process, through the server's own code.
//
// The baseline for the serving overhead (`rmscore bench --overhead`, docs/cpp_bench.md):
// the same graph, the same session options and the same tensor packing as
// rmscore-server-cpp, because it IS that code (rmscore_core's ParseConfig,
// LoadManifest, Pack and ModelRunner), minus gRPC, the queue and the batcher.
//
//   rmscore-ort-driver --batches in.json [--repetitions R] [--warmup W] [--out out.json] [server flags]
//   rmscore-ort-driver --batches in.json --interactive [--warmup W] [server flags]
//   rmscore-ort-driver --parity [server flags]
//
// Server flags (--model, --intra-op-threads, --inter-op-threads,
// --graph-optimization-level, --precision, --device, ...) are parsed by the
// server's parser, so a value means exactly what it means to the server.
//
// in.json: a list of batches, each a list of token-id lists, or
// {"batches": [...]}. First W untimed warm-up batches (the file's batches in
// order, cycling; default 2), then each repetition scores every batch once, in
// order; a batch's time is Pack + Run (what the server's batcher and worker do
// per batch). Output (stdout, or --out):
// per-batch wall times, per-repetition sequences/s, and the pooled figure.
//
// --interactive keeps the session and takes commands on stdin, one JSON line
// out per command, so a benchmark can alternate in-process passes with server
// passes (`rmscore bench --overhead`): `pass` (one timed pass over every batch),
// `probe R` (the file's "probe" batch R times), `quit` or end of input.
//
// --parity scores the manifest's golden inputs alone and as one padded
// batch (ModelRunner::SelfCheck, the server's start-up check) and prints the
// largest |score - eager fp32 golden score| as JSON.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "config.h"
#include "manifest.h"
#include "model_runner.h"
#include "validation.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct DriverArgs {
  std::string batches_path;
  std::string out_path;
  int repetitions = 3;
  int warmup = 2;  // untimed batches
  bool parity = false;
  bool interactive = false;
  std::vector<std::string> server_args;  // handed to rmscore::ParseConfig
};

const char* kUsage =
    "usage: rmscore-ort-driver --batches IN.json [--repetitions R] [--warmup W] [--out OUT.json] [server flags]\n"
    "       rmscore-ort-driver --batches IN.json --interactive [--warmup W] [server flags]   (stdin: pass | probe R | quit)\n"
    "       rmscore-ort-driver --parity [server flags]\n"
    "server flags: those of rmscore-server-cpp that shape the session (--model, --intra-op-threads,\n"
    "--inter-op-threads, --graph-optimization-level, --precision, --device); others are accepted and unused.\n";

int PositiveInt(const std::string& flag, const std::string& v, int min) {
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || n < min) {
    throw std::invalid_argument(flag + ": must be an integer >= " + std::to_string(min) + ", got '" + v + "'");
  }
  return n;
}

DriverArgs ParseArgs(int argc, char** argv) {
  DriverArgs a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool inline_value = false;
    const auto eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    auto take = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= argc) throw std::invalid_argument(arg + ": needs a value");
      return argv[++i];
    };
    if (arg == "--batches") {
      a.batches_path = take();
    } else if (arg == "--out") {
      a.out_path = take();
    } else if (arg == "--repetitions") {
      a.repetitions = PositiveInt(arg, take(), 1);
    } else if (arg == "--warmup") {
      a.warmup = PositiveInt(arg, take(), 0);
    } else if (arg == "--parity") {
      a.parity = true;
    } else if (arg == "--interactive") {
      a.interactive = true;
    } else {
      a.server_args.push_back(argv[i]);
    }
  }
  if (!a.parity && a.batches_path.empty()) throw std::invalid_argument("give --batches IN.json or --parity");
  return a;
}

// Batches of token ids, checked against the model's limits (the server would
// refuse the request, so the driver refuses the file).
using Batches = std::vector<std::vector<std::vector<int64_t>>>;

Batches LoadBatches(const std::string& path, const rmscore::Manifest& m, const char* key = "batches") {
  json doc = json::parse(rmscore::ReadFile(path));
  if (doc.is_object()) {
    if (std::string(key) == "probe") {
      if (!doc.contains("probe")) return {};
      doc = json::array({doc["probe"]});
    } else {
      doc = doc.at(key);
    }
  } else if (std::string(key) == "probe") {
    return {};
  }
  if (!doc.is_array() || doc.empty()) throw std::runtime_error(path + ": expected a non-empty list of batches");
  std::vector<std::vector<std::vector<int64_t>>> batches;
  for (size_t b = 0; b < doc.size(); ++b) {
    auto seqs = doc[b].get<std::vector<std::vector<int64_t>>>();
    if (seqs.empty()) throw std::runtime_error(path + ": batch " + std::to_string(b) + " is empty");
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto& ids = seqs[s];
      const std::string where = path + ": batch " + std::to_string(b) + " sequence " + std::to_string(s);
      if (ids.empty() || int64_t(ids.size()) > m.max_sequence_length) {
        throw std::runtime_error(where + ": length " + std::to_string(ids.size()) + " not in 1.." +
                                 std::to_string(m.max_sequence_length));
      }
      for (int64_t id : ids) {
        if (id < 0 || id >= m.vocab_size) throw std::runtime_error(where + ": token id " + std::to_string(id) + " out of range");
      }
    }
    batches.push_back(std::move(seqs));
  }
  return batches;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? NAN : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

json SessionJson(const rmscore::Config& cfg, const rmscore::ModelRunner& runner) {
  return {{"graph", runner.graph_path()},
          {"intra_op_threads", cfg.intra_op_threads},
          {"inter_op_threads", cfg.inter_op_threads},
          {"precision", rmscore::ToString(cfg.precision)},
          {"device", rmscore::ToString(cfg.device)}};
}

int Parity(const rmscore::Config& cfg, const rmscore::Manifest& m, rmscore::ModelRunner& runner) {
  const rmscore::SelfCheckReference ref = rmscore::SelfCheckReferenceFor(m, cfg.precision);
  const double diff = runner.SelfCheck(m, cfg.precision);
  json out = {{"mode", "parity"},
              {"reference", ref.what},
              {"golden_sequences", m.golden_inputs.size()},
              {"checked", "each golden input alone and all as one padded batch"},
              {"max_abs_diff", diff},
              {"session", SessionJson(cfg, runner)}};
  std::cout << out.dump() << std::endl;
  return std::isfinite(diff) ? 0 : 1;
}

std::vector<std::vector<rmscore::SeqView>> Views(const Batches& batches) {
  std::vector<std::vector<rmscore::SeqView>> views(batches.size());
  for (size_t b = 0; b < batches.size(); ++b) {
    for (const auto& ids : batches[b]) views[b].push_back(rmscore::SeqView{ids.data(), int64_t(ids.size())});
  }
  return views;
}

double TimedRun(rmscore::ModelRunner& runner, const std::vector<rmscore::SeqView>& v, int64_t pad,
                std::vector<float>* scores) {
  const auto t0 = Clock::now();
  std::vector<float> s = runner.Run(rmscore::Pack(v, pad));
  const double w = std::chrono::duration<double>(Clock::now() - t0).count();
  if (scores) scores->insert(scores->end(), s.begin(), s.end());
  return w;
}

int Interactive(const DriverArgs& a, const rmscore::Manifest& m, rmscore::ModelRunner& runner) {
  const Batches batches = LoadBatches(a.batches_path, m);
  const Batches probe = LoadBatches(a.batches_path, m, "probe");
  const auto views = Views(batches), probe_views = Views(probe);
  int64_t sequences = 0;
  for (const auto& b : batches) sequences += int64_t(b.size());
  for (int w = 0; w < a.warmup; ++w) TimedRun(runner, views[size_t(w) % views.size()], m.pad_token_id, nullptr);
  if (!probe_views.empty()) TimedRun(runner, probe_views[0], m.pad_token_id, nullptr);
  std::cout << json{{"ready", true}, {"batches", batches.size()}, {"sequences", sequences}}.dump() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    json out;
    if (cmd == "pass") {
      std::vector<double> walls;
      std::vector<float> scores;
      double total = 0;
      for (const auto& v : views) {
        walls.push_back(TimedRun(runner, v, m.pad_token_id, &scores));
        total += walls.back();
      }
      out = {{"pass_wall_s", total}, {"batch_wall_s", walls}, {"sequences", sequences},
             {"sequences_per_s", double(sequences) / total}, {"scores", scores}};
    } else if (cmd == "probe") {
      int reps = 1;
      in >> reps;
      if (probe_views.empty()) {
        out = {{"error", "no \"probe\" batch in " + a.batches_path}};
      } else {
        std::vector<double> walls;
        for (int r = 0; r < std::max(1, reps); ++r) walls.push_back(TimedRun(runner, probe_views[0], m.pad_token_id, nullptr));
        out = {{"probe_wall_s", walls}, {"median_wall_s", Median(walls)}};
      }
    } else if (cmd == "quit") {
      break;
    } else if (cmd.empty()) {
      continue;
    } else {
      out = {{"error", "unknown command '" + cmd + "' (pass | probe R | quit)"}};
    }
    std::cout << out.dump() << std::endl;
  }
  return 0;
}

int Bench(const DriverArgs& a, const rmscore::Config& cfg, const rmscore::Manifest& m, rmscore::ModelRunner& runner) {
  const auto batches = LoadBatches(a.batches_path, m);
  // Views into the loaded ids, as the server's views point into its requests.
  std::vector<std::vector<rmscore::SeqView>> views(batches.size());
  int64_t sequences = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    for (const auto& ids : batches[b]) views[b].push_back(rmscore::SeqView{ids.data(), int64_t(ids.size())});
    sequences += int64_t(batches[b].size());
  }
  std::vector<std::vector<double>> wall(batches.size()), run(batches.size());
  std::vector<double> pass_s;
  std::vector<float> last_scores;
  for (int w = 0; w < a.warmup; ++w) {
    const auto& v = views[size_t(w) % views.size()];
    runner.Run(rmscore::Pack(v, m.pad_token_id));
  }
  for (int rep = 0; rep < a.repetitions; ++rep) {
    double pass = 0;
    for (size_t b = 0; b < batches.size(); ++b) {
      const auto t0 = Clock::now();
      const rmscore::PackedBatch packed = rmscore::Pack(views[b], m.pad_token_id);
      const auto t1 = Clock::now();
      std::vector<float> scores = runner.Run(packed);
      const auto t2 = Clock::now();
      const double w = std::chrono::duration<double>(t2 - t0).count();
      pass += w;
      wall[b].push_back(w);
      run[b].push_back(std::chrono::duration<double>(t2 - t1).count());
      if (rep == a.repetitions - 1) last_scores.insert(last_scores.end(), scores.begin(), scores.end());
    }
    pass_s.push_back(pass);
    std::cerr << "rmscore-ort-driver repetition " << rep + 1 << "/" << a.repetitions << ": " << sequences
              << " sequences in " << pass << " s" << std::endl;
  }
  json per_batch = json::array();
  for (size_t b = 0; b < batches.size(); ++b) {
    int64_t longest = 0, real = 0;
    for (const auto& ids : batches[b]) {
      longest = std::max<int64_t>(longest, int64_t(ids.size()));
      real += int64_t(ids.size());
    }
    per_batch.push_back({{"sequences", batches[b].size()},
                         {"longest", longest},
                         {"real_tokens", real},
                         {"wall_s", wall[b]},
                         {"run_s", run[b]},
                         {"median_wall_s", Median(wall[b])}});
  }
  json per_rep = json::array();
  double total = 0;
  for (double p : pass_s) {
    per_rep.push_back(double(sequences) / p);
    total += p;
  }
  json out = {{"mode", "bench"},
              {"batches_file", a.batches_path},
              {"batches", per_batch},
              {"repetitions", a.repetitions},
              {"warmup_batches", a.warmup},
              {"sequences_per_pass", sequences},
              {"pass_wall_s", pass_s},
              {"sequences_per_s_per_repetition", per_rep},
              {"sequences_per_s", double(sequences) * a.repetitions / total},
              {"scores_last_pass", last_scores},
              {"timed", "per batch: rmscore::Pack + ModelRunner::Run, steady_clock"},
              {"session", SessionJson(cfg, runner)}};
  if (a.out_path.empty()) {
    std::cout << out.dump() << std::endl;
  } else {
    std::ofstream f(a.out_path, std::ios::trunc);
    f << out.dump(1) << "\n";
    if (!f) throw std::runtime_error("cannot write --out " + a.out_path);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  DriverArgs args;
  rmscore::Config cfg;
  try {
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
        std::cout << kUsage;
        return 0;
      }
    }
    args = ParseArgs(argc, argv);
    bool help = false;
    cfg = rmscore::ParseConfig(args.server_args, &help);
  } catch (const std::exception& e) {
    std::cerr << "rmscore-ort-driver: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    const rmscore::Manifest manifest = rmscore::LoadManifest(cfg.model_dir);
    rmscore::ModelRunner runner(cfg, manifest);
    if (args.parity) return Parity(cfg, manifest, runner);
    return args.interactive ? Interactive(args, manifest, runner) : Bench(args, cfg, manifest, runner);
  } catch (const std::exception& e) {
    std::cerr << "rmscore-ort-driver: " << e.what() << std::endl;
    return 1;
  }
}
