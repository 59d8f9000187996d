#include "runtime/conv_algo_cache.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln::runtime {
namespace {

constexpr const char* kFileHeader =
    "# kiln algorithm cache v1: conv1/ lines: key algo fused math ms; "
    "gemm1/ lines: key workspace ms algo-words(8, hex)";

void append_int(std::string* out, int64_t v) { *out += std::to_string(v); }

}  // namespace

ConvSignature make_conv_signature(const engine::ConvStep& step, engine::DType dtype,
                                  bool z_is_out, int sm, int cudnn_version, uint32_t align_x,
                                  uint32_t align_w, uint32_t align_bias, uint32_t align_z,
                                  uint32_t align_out) {
  ConvSignature sig;
  sig.dtype = dtype;
  sig.n = step.n;
  sig.h = step.h;
  sig.w = step.w_in;
  sig.c = step.c;
  sig.k = step.k;
  sig.r = step.r;
  sig.s = step.s;
  sig.p = step.p;
  sig.q = step.q;
  sig.pad_h = step.pad_h;
  sig.pad_w = step.pad_w;
  sig.stride_h = step.stride_h;
  sig.stride_w = step.stride_w;
  sig.dilation_h = step.dilation_h;
  sig.dilation_w = step.dilation_w;
  sig.groups = step.groups;
  sig.relu = step.activation == engine::ConvActivation::kRelu;
  sig.has_bias = step.bias != engine::kNoTensor;
  sig.has_z = step.z != engine::kNoTensor;
  sig.z_is_out = sig.has_z && z_is_out;
  sig.align_x = align_x;
  sig.align_w = align_w;
  sig.align_bias = sig.has_bias ? align_bias : 256;
  sig.align_z = sig.has_z && !sig.z_is_out ? align_z : 256;
  sig.align_out = align_out;
  sig.sm = sm;
  sig.cudnn_version = cudnn_version;
  return sig;
}

std::string conv_cache_key(const ConvSignature& s) {
  std::string k = "conv1/sm";
  append_int(&k, s.sm);
  k += "/cudnn";
  append_int(&k, s.cudnn_version);
  k += "/";
  k += engine::dtype_name(s.dtype);
  k += "/x";
  for (int64_t v : {s.n, s.h, s.w, s.c}) {
    append_int(&k, v);
    k += "x";
  }
  k.pop_back();
  k += "/k";
  append_int(&k, s.k);
  k += "r";
  append_int(&k, s.r);
  k += "s";
  append_int(&k, s.s);
  k += "/o";
  append_int(&k, s.p);
  k += "x";
  append_int(&k, s.q);
  const std::pair<const char*, std::pair<int64_t, int64_t>> pairs[] = {
      {"/pad", {s.pad_h, s.pad_w}},
      {"/str", {s.stride_h, s.stride_w}},
      {"/dil", {s.dilation_h, s.dilation_w}}};
  for (const auto& p : pairs) {
    k += p.first;
    append_int(&k, p.second.first);
    k += "x";
    append_int(&k, p.second.second);
  }
  k += "/g";
  append_int(&k, s.groups);
  k += s.relu ? "/relu" : "/id";
  k += s.has_bias ? "/bias" : "/nobias";
  k += !s.has_z ? "/z-" : (s.z_is_out ? "/z=out" : "/z+");
  append_key_list(&k, "/al", {s.align_x, s.align_w, s.align_bias, s.align_z, s.align_out});
  return k;
}

void append_key_list(std::string* key, const char* tag, std::initializer_list<int64_t> values) {
  *key += tag;
  for (int64_t v : values) {
    append_int(key, v);
    *key += ".";
  }
  if (values.size() > 0) key->pop_back();
}

std::string format_cache_line(const std::string& key, const ConvAlgoChoice& c) {
  char tail[96];
  std::snprintf(tail, sizeof(tail), " %d %d %d %.4f", c.algo, c.fused ? 1 : 0, c.math_type,
                static_cast<double>(c.time_ms));
  return key + tail;
}

bool parse_cache_line(const std::string& line, std::string* key, ConvAlgoChoice* choice) {
  if (line.empty() || line[0] == '#') return false;
  const size_t space = line.find(' ');
  if (space == 0 || space == std::string::npos) return false;
  const char* p = line.c_str() + space;
  char* end = nullptr;
  long values[3];
  for (long& v : values) {
    errno = 0;
    v = std::strtol(p, &end, 10);
    if (end == p || errno != 0) return false;
    p = end;
  }
  errno = 0;
  const float ms = std::strtof(p, &end);
  if (end == p || errno != 0) return false;
  for (p = end; *p != '\0'; ++p)
    if (*p != ' ' && *p != '\r' && *p != '\t') return false;
  // Plausible ranges only; whether cuDNN accepts the algorithm is tried at load.
  if (values[0] < 0 || values[0] > 64 || (values[1] != 0 && values[1] != 1) || values[2] < 0 ||
      values[2] > 16)
    return false;
  *key = line.substr(0, space);
  choice->algo = static_cast<int>(values[0]);
  choice->fused = values[1] == 1;
  choice->math_type = static_cast<int>(values[2]);
  choice->time_ms = ms;
  return true;
}

AlgoCache::AlgoCache(std::string path) : path_(std::move(path)) {}

AlgoCache& AlgoCache::global() {
  // Leaked on purpose: engines may be destroyed during static destruction.
  static AlgoCache* cache = [] {
    const char* env = std::getenv("KILN_ALGO_CACHE");
    return new AlgoCache(env != nullptr ? env : "");
  }();
  return *cache;
}

void AlgoCache::load_file_locked() {
  if (loaded_) return;
  loaded_ = true;
  if (path_.empty()) return;
  std::FILE* f = std::fopen(path_.c_str(), "r");
  if (f == nullptr) return;
  std::string line;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), f) != nullptr) {
    line += buffer;
    if (line.empty() || line.back() != '\n') {
      if (!std::feof(f)) continue;  // a line longer than the buffer
    } else {
      line.pop_back();
    }
    std::string key;
    if (is_gemm_cache_key(line)) {
      GemmAlgoChoice choice;
      if (parse_gemm_cache_line(line, &key, &choice)) gemm_entries_[key] = choice;
    } else {
      ConvAlgoChoice choice;
      if (parse_cache_line(line, &key, &choice)) entries_[key] = choice;
    }
    line.clear();
  }
  std::fclose(f);
}

bool AlgoCache::lookup(const std::string& key, ConvAlgoChoice* choice) {
  std::lock_guard<std::mutex> lock(mutex_);
  load_file_locked();
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  *choice = it->second;
  return true;
}

bool AlgoCache::lookup(const std::string& key, GemmAlgoChoice* choice) {
  std::lock_guard<std::mutex> lock(mutex_);
  load_file_locked();
  auto it = gemm_entries_.find(key);
  if (it == gemm_entries_.end()) return false;
  *choice = it->second;
  return true;
}

void AlgoCache::insert(const std::string& key, const ConvAlgoChoice& choice) {
  std::lock_guard<std::mutex> lock(mutex_);
  load_file_locked();
  entries_[key] = choice;
  append_line_locked(format_cache_line(key, choice));
}

void AlgoCache::insert(const std::string& key, const GemmAlgoChoice& choice) {
  std::lock_guard<std::mutex> lock(mutex_);
  load_file_locked();
  gemm_entries_[key] = choice;
  append_line_locked(format_gemm_cache_line(key, choice));
}

void AlgoCache::append_line_locked(const std::string& line) {
  if (path_.empty()) return;
  std::FILE* f = std::fopen(path_.c_str(), "a");
  if (f == nullptr) return;
  // A new file gets a header saying what it is.
  std::fseek(f, 0, SEEK_END);
  if (std::ftell(f) == 0) std::fprintf(f, "%s\n", kFileHeader);
  std::fprintf(f, "%s\n", line.c_str());
  std::fclose(f);
}

void AlgoCache::erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.erase(key);
  gemm_entries_.erase(key);
}

size_t AlgoCache::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  load_file_locked();
  return entries_.size() + gemm_entries_.size();
}

}  // namespace kiln::runtime
