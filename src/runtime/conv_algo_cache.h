// Process-wide cache of algorithm choices made at engine load: cuDNN
// convolution algorithms (conv keys, "conv1/...") and cuBLASLt matmul
// algorithms (GEMM keys, "gemm1/...", gemm_algo_key.h), so one layer shape is
// searched once per process (across layers, engines and loads) rather than
// once per step. Optionally persisted across processes in the one text file
// named by the environment variable KILN_ALGO_CACHE.
//
// No cuDNN/cuBLASLt types here (conv algorithms and math types are stored as
// the ints of cuDNN's enums, GEMM algorithms as cublasLtMatmulAlgo_t's opaque
// words), so the key formation and the file format are tested on machines
// without a GPU.
//
// File format: one choice per line; conv lines are
// "<key> <algo> <fused 0|1> <math> <ms>", GEMM lines are
// format_gemm_cache_line's; the key's prefix says which. Lines starting with
// '#' and lines that do not parse are ignored. Entries
// are appended as they are found; a later line for the same key wins. The key
// carries the SM and the cuDNN (cuBLASLt) version, so one file can serve
// several GPUs and a library upgrade re-searches. A choice read from the file
// is still tried once at load; if the library refuses it, the shape is
// searched again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <initializer_list>
#include <string>

#include "engine_format/engine_desc.h"
#include "runtime/gemm_algo_key.h"

namespace kiln::runtime {

// Everything that can change which algorithm is valid or fastest for a conv.
struct ConvSignature {
  engine::DType dtype = engine::DType::kFloat32;
  int64_t n = 0, h = 0, w = 0, c = 0, k = 0, r = 0, s = 0, p = 0, q = 0;
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  bool relu = false;
  bool has_bias = false;
  bool has_z = false;
  bool z_is_out = false;  // residual added in place (z is out's memory)
  // Byte alignment of each operand's address (cuDNN kernels check it).
  uint32_t align_x = 256, align_w = 256, align_bias = 256, align_z = 256, align_out = 256;
  int sm = 0;             // e.g. 90
  int cudnn_version = 0;  // cudnnGetVersion()
};

// Builds the signature of `step` (already validated) on a GPU of `sm`.
// `align_*` are the operands' address alignments (256 for absent ones).
ConvSignature make_conv_signature(const engine::ConvStep& step, engine::DType dtype,
                                  bool z_is_out, int sm, int cudnn_version, uint32_t align_x,
                                  uint32_t align_w, uint32_t align_bias, uint32_t align_z,
                                  uint32_t align_out);

// A printable key without spaces, e.g.
// "conv1/sm90/cudnn91900/float16/x8x56x56x64/k64r3s3/o56x56/pad1x1/str1x1/dil1x1/g1/
//  relu/bias/z-/al256.256.256.256.256".
std::string conv_cache_key(const ConvSignature& sig);

// Appends `tag` and the values joined by '.' ("/al16.16.4") to a cache key;
// shared by the conv and GEMM keys so both spell lists the same way.
void append_key_list(std::string* key, const char* tag, std::initializer_list<int64_t> values);

struct ConvAlgoChoice {
  int algo = 0;          // cudnnConvolutionFwdAlgo_t
  bool fused = false;    // cudnnConvolutionBiasActivationForward vs conv + add/act
  int math_type = 0;     // cudnnMathType_t
  float time_ms = 0.0f;  // as measured at the search (informational)
};

// One line of the file (no newline), and its inverse. parse returns false on
// anything malformed (never throws).
std::string format_cache_line(const std::string& key, const ConvAlgoChoice& choice);
bool parse_cache_line(const std::string& line, std::string* key, ConvAlgoChoice* choice);

class AlgoCache {
 public:
  // `path` empty: in memory only. Otherwise entries are read from it on first
  // use and appended to it (created if missing); file errors are ignored, as
  // the cache is only an optimisation.
  explicit AlgoCache(std::string path);

  // The process-wide cache, persisted to $KILN_ALGO_CACHE when it is set.
  static AlgoCache& global();

  // Conv choices (keys from conv_cache_key).
  bool lookup(const std::string& key, ConvAlgoChoice* choice);
  void insert(const std::string& key, const ConvAlgoChoice& choice);
  // GEMM choices (keys from gemm_cache_key; other keys are never found).
  bool lookup(const std::string& key, GemmAlgoChoice* choice);
  void insert(const std::string& key, const GemmAlgoChoice& choice);
  // Drops an entry (of either kind) the library refused (e.g. a file from
  // another build).
  void erase(const std::string& key);
  size_t size();  // conv and GEMM entries together
  const std::string& path() const { return path_; }

  // Held around a search so concurrent loads in this process neither search
  // the same shape twice nor disturb each other's timings.
  std::mutex& search_mutex() { return search_mutex_; }

 private:
  void load_file_locked();
  void append_line_locked(const std::string& line);

  std::string path_;
  std::mutex mutex_;  // guards entries_, gemm_entries_ and loaded_
  bool loaded_ = false;
  std::map<std::string, ConvAlgoChoice> entries_;
  std::map<std::string, GemmAlgoChoice> gemm_entries_;
  std::mutex search_mutex_;
};

// The name the conv code and its tests know the cache by.
using ConvAlgoCache = AlgoCache;

}  // namespace kiln::runtime
