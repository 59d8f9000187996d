#include "runtime/gemm_algo_key.h"

#include "runtime/conv_algo_cache.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::runtime {
namespace {

void append_int(std::string* out, int64_t v) { *out += std::to_string(v); }

const char* epilogue_name(engine::GemmEpilogue e) {
  switch (e) {
    case engine::GemmEpilogue::kNone: return "id";
    case engine::GemmEpilogue::kBias: return "bias";
    case engine::GemmEpilogue::kReluBias: return "relubias";
    case engine::GemmEpilogue::kRelu: return "relu";
  }
  return "ep?";
}

bool uses_bias(engine::GemmEpilogue e) {
  return e == engine::GemmEpilogue::kBias || e == engine::GemmEpilogue::kReluBias;
}

bool only_blanks(const char* p) {
  for (; *p != '\0'; ++p)
    if (*p != ' ' && *p != '\r' && *p != '\t') return false;
  return true;
}

}  // namespace

GemmSignature make_gemm_signature(const engine::GemmStep& step, engine::DType dtype,
                                  bool c_is_out, int sm, int sm_count, size_t cublaslt_version,
                                  uint32_t align_a, uint32_t align_b, uint32_t align_c,
                                  uint32_t align_bias, uint32_t align_out) {
  GemmSignature sig;
  sig.dtype = dtype;
  sig.m = step.m;
  sig.n = step.n;
  sig.k = step.k;
  sig.b_transposed = step.b_transposed;
  sig.epilogue = step.epilogue;
  sig.batch = step.batch;
  if (step.batch > 1) {  // strides mean nothing for a single matrix
    sig.stride_a = step.stride_a;
    sig.stride_b = step.stride_b;
    sig.stride_c = step.stride_c;
    sig.stride_out = step.stride_out;
  }
  sig.has_c = step.c != engine::kNoTensor;
  sig.c_is_out = sig.has_c && c_is_out;
  if (!sig.has_c) sig.stride_c = 0;
  sig.align_a = align_a;
  sig.align_b = align_b;
  sig.align_c = sig.has_c && !sig.c_is_out ? align_c : 256;
  sig.align_bias = uses_bias(step.epilogue) ? align_bias : 256;
  sig.align_out = align_out;
  sig.sm = sm;
  sig.sm_count = sm_count;
  sig.cublaslt_version = cublaslt_version;
  return sig;
}

std::string gemm_cache_key(const GemmSignature& s) {
  std::string k = kGemmKeyPrefix;
  k += "sm";
  append_int(&k, s.sm);
  k += "x";
  append_int(&k, s.sm_count);
  k += "/lt";
  append_int(&k, static_cast<int64_t>(s.cublaslt_version));
  k += "/";
  k += engine::dtype_name(s.dtype);
  k += "/m";
  append_int(&k, s.m);
  k += "n";
  append_int(&k, s.n);
  k += "k";
  append_int(&k, s.k);
  k += s.b_transposed ? "/bT" : "/bN";
  k += "/";
  k += epilogue_name(s.epilogue);
  k += "/b";
  append_int(&k, s.batch);
  append_key_list(&k, "/s", {s.stride_a, s.stride_b, s.stride_c, s.stride_out});
  k += !s.has_c ? "/c-" : (s.c_is_out ? "/c=out" : "/c+");
  append_key_list(&k, "/al", {s.align_a, s.align_b, s.align_c, s.align_bias, s.align_out});
  return k;
}

bool is_gemm_cache_key(const std::string& key) {
  return key.compare(0, std::strlen(kGemmKeyPrefix), kGemmKeyPrefix) == 0;
}

std::string format_gemm_cache_line(const std::string& key, const GemmAlgoChoice& c) {
  char tail[256];
  int used = std::snprintf(tail, sizeof(tail), " %" PRIu64 " %.4f", c.workspace_bytes,
                           static_cast<double>(c.time_ms));
  for (uint64_t w : c.algo)
    used += std::snprintf(tail + used, sizeof(tail) - static_cast<size_t>(used), " %" PRIx64, w);
  return key + tail;
}

bool parse_gemm_cache_line(const std::string& line, std::string* key, GemmAlgoChoice* choice) {
  const size_t space = line.find(' ');
  if (space == 0 || space == std::string::npos) return false;
  const std::string k = line.substr(0, space);
  if (!is_gemm_cache_key(k)) return false;
  const char* p = line.c_str() + space;
  char* end = nullptr;
  GemmAlgoChoice c;
  // strtoull accepts a sign; a workspace or word must not have one.
  const auto next_unsigned = [&](int base, uint64_t* out) {
    while (*p == ' ' || *p == '\t') ++p;
    if (*p == '-' || *p == '+') return false;
    errno = 0;
    const unsigned long long v = std::strtoull(p, &end, base);
    if (end == p || errno != 0) return false;
    p = end;
    *out = v;
    return true;
  };
  if (!next_unsigned(10, &c.workspace_bytes)) return false;
  errno = 0;
  c.time_ms = std::strtof(p, &end);
  if (end == p || errno != 0 || !(c.time_ms >= 0.0f)) return false;
  p = end;
  for (uint64_t& w : c.algo)
    if (!next_unsigned(16, &w)) return false;
  if (!only_blanks(p)) return false;
  *key = k;
  *choice = c;
  return true;
}

bool parse_gemm_autotune_env(const char* value) {
  if (value == nullptr) return true;
  for (const char* off : {"0", "off", "OFF", "false", "FALSE", "no", "NO"})
    if (std::strcmp(value, off) == 0) return false;
  return true;
}

bool gemm_autotune_enabled() { return parse_gemm_autotune_env(std::getenv("KILN_GEMM_AUTOTUNE")); }

}  // namespace kiln::runtime
