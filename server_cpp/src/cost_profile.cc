#include "cost_profile.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace rmscore::cost_profile {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// A JSON value as Python's repr writes the value json.loads makes of it, so the messages read as
// cost_profile.py's: 'text', None, True, 2.
std::string Repr(const json& v) {
  if (v.is_string()) return "'" + v.get<std::string>() + "'";
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  return v.dump();
}

// The Python type json.loads makes of `v`, for "not a cost profile (format 'list', ...)".
std::string PyTypeName(const json& v) {
  if (v.is_array()) return "list";
  if (v.is_string()) return "str";
  if (v.is_boolean()) return "bool";
  if (v.is_null()) return "NoneType";
  if (v.is_number_float()) return "float";
  return v.is_number() ? "int" : "dict";
}

std::string Fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

const std::vector<std::string>& IdentityKeys() {
  static const std::vector<std::string> keys = {"model", "model_version", "backend", "device", "precision",
                                                "intra_op_threads", "model_workers", "cpu"};
  return keys;
}

std::string CpuModel(const std::string& cpuinfo) {
  std::ifstream in(cpuinfo);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto trim = [](std::string v) {
      const char* space = " \t\r\n\f\v";
      v.erase(0, v.find_first_not_of(space));
      v.erase(v.find_last_not_of(space) + 1);
      return v;
    };
    if (trim(line.substr(0, colon)) == "model name") return trim(line.substr(colon + 1));
  }
  return "unknown";
}

std::string CachePath(const std::string& dir, const ordered_json& identity, int64_t max_batch_size) {
  auto str = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  std::string name = str(identity.at("model")) + "-" + str(identity.at("backend")) + "-" + str(identity.at("device")) +
                     "-" + str(identity.at("precision")) + "-" + str(identity.at("intra_op_threads")) + "t-b" +
                     std::to_string(max_batch_size);
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.' && ch != '-') ch = '_';
  }
  return dir + "/" + name + ".json";
}

std::optional<Profile> LoadCached(const std::string& path, const ordered_json& identity,
                                  const std::function<void(const std::string&)>& progress) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    progress("cost profile: none cached at " + path + ": measuring");
    return std::nullopt;
  }
  try {
    return Load(path, identity, "cached cost profile " + path);
  } catch (const ProfileError& e) {
    progress(std::string("cost profile: not used: ") + e.what() + "; measuring again (the file will be replaced)");
    return std::nullopt;
  }
}

ordered_json Identity(const Config& cfg, const Manifest& m) {
  return {{"model", m.name},
          {"model_version", m.version},
          {"backend", "onnxruntime"},
          {"device", ToString(cfg.device)},
          {"precision", ToString(cfg.precision)},
          {"intra_op_threads", cfg.intra_op_threads},
          {"model_workers", cfg.model_workers},
          {"cpu", CpuModel()}};
}

Profile Load(const std::string& path, const ordered_json& identity, const std::string& where_given) {
  const bool strict = where_given.empty();  // --cost-profile: the operator's file, refused with what to do
  const std::string where = strict ? "--cost-profile " + path : where_given;
  json doc;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ProfileError(where + ": cannot read a cost profile: " + std::strerror(errno));
    try {
      doc = json::parse(in);
    } catch (const std::exception& e) {  // not JSON, or a directory (libstdc++ throws on its first read)
      throw ProfileError(where + ": cannot read a cost profile: " + e.what());
    }
  }
  if (!doc.is_object() || doc.value("format", json()) != kFormat) {
    const std::string got = doc.is_object() ? Repr(doc.value("format", json())) : "'" + PyTypeName(doc) + "'";
    throw ProfileError(where + ": not a cost profile (format " + got + ", expected '" + kFormat + "')");
  }
  const json theirs = doc.contains("identity") && doc["identity"].is_object() ? doc["identity"] : json::object();
  for (const std::string& key : IdentityKeys()) {
    const json got = theirs.value(key, json()), ours(identity.at(key));
    if (key == "model_workers" && ours == 0 && got.is_number_integer() && got >= 1) continue;
    if (got != ours) {
      throw ProfileError(where + ": measured for " + key + "=" + Repr(got) + ", but this server runs " + key + "=" +
                         Repr(ours) + (strict ? "; remove the file (or name another) to measure again" : ""));
    }
  }
  // A cached file refined before profiles said their timing: by the wall clock (kThreadCpu's comment).
  // The operator's file is loaded as written.
  const json refined = doc.value("refined_batches", json()), timing = doc.value("timing", json());
  if (!strict && refined.is_number() && refined != 0 && timing != kThreadCpu && timing != kWall) {
    throw ProfileError(where + ": refined by the wall clock before profiles said how they were timed, so other " +
                       "processes' load is in its cells");
  }
  try {
    return Profile{CostTable::FromJson(doc.value("table", json())), theirs.at("model_workers").get<int64_t>()};
  } catch (const CostError& e) {
    throw ProfileError(where + ": corrupt table: " + e.what());
  }
}

namespace {

std::string NowUtc() {
  char at[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return at;
}

void Write(const std::string& path, const ordered_json& doc) {
  // Same directory, so the rename is atomic; the pid keeps two servers' writes apart.
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump(1) << "\n";
    out.flush();
    if (!out) throw std::runtime_error("--cost-profile " + path + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("--cost-profile " + path + ": cannot rename " + tmp + ": " + std::strerror(errno));
  }
}

}  // namespace

void Save(const std::string& path, const CostTable& table, const ordered_json& identity, double seconds,
          const std::string& timing) {
  ordered_json doc;
  doc["format"] = kFormat;
  doc["identity"] = identity;
  doc["timing"] = timing;
  doc["measured_seconds"] = std::round(seconds * 1000) / 1000;
  doc["measured_at"] = NowUtc();
  doc["table"] = ordered_json(table.ToJson());
  Write(path, doc);
}

void SaveRefined(const std::string& path, const CostTable& table, const ordered_json& identity, int64_t batches,
                 const std::string& timing) {
  // One save at a time in this process, as in Python (core/cost_profile.py): two model workers' idle
  // spells may save at once, and each read-modify-write would drop the other's batches.
  static std::mutex saving;
  std::lock_guard<std::mutex> one_at_a_time(saving);
  ordered_json old;
  {
    std::ifstream in(path);
    if (in) old = ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  ordered_json doc;
  doc["format"] = kFormat;
  doc["identity"] = identity;
  doc["timing"] = timing;
  if (old.is_object() && old.value("format", ordered_json()) == kFormat && old.value("identity", ordered_json()) == identity) {
    for (const char* key : {"measured_seconds", "measured_at"}) {
      if (old.contains(key)) doc[key] = old[key];
    }
    const ordered_json prior = old.value("refined_batches", ordered_json());
    if (prior.is_number_integer() && prior.get<int64_t>() >= 0) batches += prior.get<int64_t>();
  }
  doc["refined_batches"] = batches;
  doc["refined_at"] = NowUtc();
  doc["table"] = ordered_json(table.ToJson());
  Write(path, doc);
}

namespace {

using Shape = std::pair<int64_t, int64_t>;  // (B, L)

// The seconds of shape (b, n): measured, or extrapolated in proportion to tokens from the largest
// measured shape of its length (or of any length; the first of equals in measuring order).
double At(const std::vector<std::pair<Shape, double>>& measured, int64_t b, int64_t n) {
  const std::pair<Shape, double>* base = nullptr;
  bool same_len = false;
  for (const auto& m : measured) {
    if (m.first == Shape{b, n}) return m.second;
    same_len = same_len || m.first.second == n;
  }
  for (const auto& m : measured) {
    if (same_len && m.first.second != n) continue;
    if (!base || m.first.first * m.first.second > base->first.first * base->first.second) base = &m;
  }
  return base->second * double(b * n) / double(base->first.first * base->first.second);
}

}  // namespace

Measured Measure(const TimeBatch& run, int64_t max_batch_size, int64_t max_length, double budget_s,
                 const std::function<void(const std::string&)>& progress) {
  const auto [sizes, lengths] = Grid(max_batch_size, max_length);
  std::vector<Shape> cells;
  for (int64_t b : sizes) {
    for (int64_t n : lengths) cells.push_back({b, n});
  }
  std::stable_sort(cells.begin(), cells.end(), [](const Shape& x, const Shape& y) {
    return Shape{x.first * x.second, x.first} < Shape{y.first * y.second, y.first};
  });
  std::vector<std::pair<Shape, double>> measured;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const size_t total = cells.size();
  for (size_t k = 0; k < total; ++k) {
    if (elapsed() > budget_s && !measured.empty()) break;
    const auto [b, n] = cells[k];
    const double first = run(b, n);
    measured.push_back({cells[k], std::min(first, run(b, n))});
    if (k % 8 == 7 || k == total - 1) {
      progress("cost profile: " + std::to_string(k + 1) + "/" + std::to_string(total) + " shapes in " +
               Fixed(elapsed(), 1) + " s");
    }
  }
  const double spent = elapsed();
  if (measured.size() < total) {
    char budget[32];
    std::snprintf(budget, sizeof budget, "%g", budget_s);
    progress(std::string("cost profile: budget ") + budget + " s spent after " + std::to_string(measured.size()) +
             "/" + std::to_string(total) + " shapes; the rest extrapolated");
  }
  std::vector<std::vector<int64_t>> rows;
  for (int64_t b : sizes) {
    rows.emplace_back();
    for (int64_t n : lengths) {
      rows.back().push_back(std::max<int64_t>(1, int64_t(std::nearbyint(1e6 * At(measured, b, n)))));
    }
  }
  return Measured{CostTable::Make(sizes, lengths, std::move(rows)), spent};
}

std::string Describe(const CostTable& table) {
  std::ostringstream head;
  head << "B \\ L  ";
  for (int64_t n : table.lengths) {
    char cell[32];
    std::snprintf(cell, sizeof cell, "%9lld", static_cast<long long>(n));
    head << cell;
  }
  std::ostringstream out;
  out << "model ms per sequence (a batch's time / B)\n" << head.str() << "\n" << std::string(head.str().size(), '-');
  for (size_t i = 0; i < table.batch_sizes.size(); ++i) {
    char cell[32];
    std::snprintf(cell, sizeof cell, "%6lld  ", static_cast<long long>(table.batch_sizes[i]));
    out << "\n" << cell;
    for (size_t j = 0; j < table.lengths.size(); ++j) {
      std::snprintf(cell, sizeof cell, "%9.2f", double(table.cost_us[i][j]) / double(table.batch_sizes[i]) / 1e3);
      out << cell;
    }
  }
  return out.str();
}

}  // namespace rmscore::cost_profile
