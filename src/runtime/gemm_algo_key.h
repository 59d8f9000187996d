// What identifies a GEMM step for cuBLASLt algorithm choice, and how a
// choice is written to / read from the algorithm cache file. The cache
// itself (process-wide, $KILN_ALGO_CACHE) is shared with convs:
// conv_algo_cache.h; GEMM keys start with "gemm1/", conv keys with "conv1/".
//
// No cuBLASLt types here (an algorithm is stored as the 8 opaque 64-bit words
// of cublasLtMatmulAlgo_t), so keys and the line format are tested on
// machines without a GPU.
//
// Line format: "<key> <workspace bytes> <ms> <w0> ... <w7>", words in hex.
// The words are only meaningful to the cuBLASLt build that made them, which
// is why the key carries cuBLASLt's version; a choice read from the file is
// still checked (cublasLtMatmulAlgoCheck) and run once at load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine_format/engine_desc.h"

namespace kiln::runtime {

// Everything that can change which cuBLASLt algorithm is valid or fastest.
struct GemmSignature {
  engine::DType dtype = engine::DType::kFloat32;
  int64_t m = 0, n = 0, k = 0;
  bool b_transposed = false;
  engine::GemmEpilogue epilogue = engine::GemmEpilogue::kNone;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_out = 0;  // 0 when batch == 1
  bool has_c = false;
  bool c_is_out = false;  // c is out's memory (accumulate in place)
  // Byte alignment of each operand's address (256 for absent ones), in the
  // GemmStep's naming: a, b, c, bias, out.
  uint32_t align_a = 256, align_b = 256, align_c = 256, align_bias = 256, align_out = 256;
  int sm = 0;                   // e.g. 90
  int sm_count = 0;             // multiprocessors (H100 PCIe vs SXM differ)
  size_t cublaslt_version = 0;  // cublasLtGetVersion()
};

// Builds the signature of validated `step`. `align_*` are the operands'
// address alignments (ignored for absent operands).
GemmSignature make_gemm_signature(const engine::GemmStep& step, engine::DType dtype,
                                  bool c_is_out, int sm, int sm_count, size_t cublaslt_version,
                                  uint32_t align_a, uint32_t align_b, uint32_t align_c,
                                  uint32_t align_bias, uint32_t align_out);

// A printable key without spaces, e.g.
// "gemm1/sm90x132/lt130100/float16/m8n1024k512/bT/bias/b1/s0.0.0.0/c-/al256.256.256.256.256".
std::string gemm_cache_key(const GemmSignature& sig);

constexpr const char* kGemmKeyPrefix = "gemm1/";
bool is_gemm_cache_key(const std::string& key);

struct GemmAlgoChoice {
  uint64_t algo[8] = {};        // cublasLtMatmulAlgo_t::data
  uint64_t workspace_bytes = 0; // what the algorithm needs
  float time_ms = 0.0f;         // as measured at the search (informational)
};

// One line of the file (no newline), and its inverse. parse returns false on
// anything malformed, including a key that is not a GEMM key (never throws).
std::string format_gemm_cache_line(const std::string& key, const GemmAlgoChoice& choice);
bool parse_gemm_cache_line(const std::string& line, std::string* key, GemmAlgoChoice* choice);

// KILN_GEMM_AUTOTUNE: unset, empty or anything but "0"/"off"/"false"/"no"
// means on. The parser is separate so it can be tested without setenv.
bool parse_gemm_autotune_env(const char* value);
bool gemm_autotune_enabled();  // reads the environment on every call

}  // namespace kiln::runtime
