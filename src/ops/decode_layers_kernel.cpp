// The persistent decode-layers kernel's source (decode_layers_kernel.h): the device code lives in
// decode_layers_device_prelude.inc and decode_layers_device_kernel.inc (raw strings), and this file
// fills in the shape's sizes and the options as constants, and checks what the kernel can take.
// First measured as benchmarks/micro/decode_layers_persistent.cu, which now compiles this source.
#include "ops/decode_layers_kernel.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace kiln::ops {
namespace {

constexpr int64_t kStageBytes = kDecodeLayersStageBytes;
constexpr int64_t kCluster = kDecodeLayersCluster;
constexpr int64_t kMaxTasks = 16;  // a block's MLP tasks a layer (its S.h staging)
// The most stages prefetched ahead: 64 x 16 KB a block is about 17 MB on 132 SMs, a third of an
// H100's or H200's L2; more would evict lines before the ring copies them.
constexpr int64_t kMaxL2Ahead = 64;

// Bytes of the block's state beside the ring: the source's struct Smem (16.5 KB with 13 stages),
// which a static_assert in the source holds to this.
constexpr int64_t kStateBytes = 17 * 1024;

std::string float_literal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s + "f";
}

// The kernel's source in two parts (the .inc files hold raw strings); @TOKENS@ are replaced by
// decode_layers_kernel_source().
constexpr const char* kPrelude =
#include "ops/decode_layers_device_prelude.inc"
    ;
constexpr const char* kKernel =
#include "ops/decode_layers_device_kernel.inc"
    ;

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

}  // namespace

std::string decode_layers_unsupported(const DecodeLayersShape& s) {
  char buf[256];
  auto why = [&](const char* fmt, long long a, long long b) {
    std::snprintf(buf, sizeof buf, fmt, a, b);
    return std::string(buf);
  };
  if (s.dtype != engine::DType::kBFloat16 && s.dtype != engine::DType::kFloat16)
    return "the persistent decode kernel takes bf16 or fp16 weights";
  if (s.hidden != 1024) return why("hidden size %lld (this version takes %lld)", s.hidden, 1024);
  if (s.head_dim != 64) return why("head_dim %lld (this version takes %lld)", s.head_dim, 64);
  if (s.kv_heads < 1 || s.heads != 2 * s.kv_heads)
    return why("%lld query heads for %lld kv heads (this version takes two a kv head)", s.heads, s.kv_heads);
  if (s.intermediate <= 0 || s.intermediate % 8 != 0)
    return why("intermediate size %lld (a multiple of %lld)", s.intermediate, 8);
  if (s.layers < 1 || s.max_len < 1) return why("%lld layers, max_len %lld", s.layers, s.max_len);
  if (s.embed_rows < 0) return why("an embedding of %lld rows (%lld: none)", s.embed_rows, 0);
  if (s.vocab < 0 || s.vocab % 8 != 0 || s.vocab > (int64_t{1} << 30))
    return why("a vocabulary of %lld (the head takes a multiple of %lld)", s.vocab, 8);
  return "";
}

std::string decode_layers_options_invalid(const DecodeLayersKernelOptions& o) {
  char buf[256];
  const int64_t most_stages = (227 * 1024 - kStateBytes) / kStageBytes;  // sm_90's shared memory a block
  if (o.stages < 4 || o.stages > most_stages) {  // q|k|v peeks four stages at once
    std::snprintf(buf, sizeof buf, "stages %d (the ring's 16 KB stages: 4 to %lld)", o.stages, static_cast<long long>(most_stages));
    return buf;
  }
  if (o.b_inflight < 0) {
    std::snprintf(buf, sizeof buf, "b_inflight %d (copies in flight of a block without attention work: 0 for "
                  "max_inflight's, or more)", o.b_inflight);
    return buf;
  }
  if (o.max_inflight < 0 || o.release_inflight < -1) {
    std::snprintf(buf, sizeof buf, "max_inflight %d, release_inflight %d (copies in flight: max_inflight 0 for the ring's "
                  "depth or more; release_inflight -1 for none, or 0 or more)", o.max_inflight, o.release_inflight);
    return buf;
  }
  if (o.kv_rows != 0 && o.kv_rows != 64 && o.kv_rows != 128) {
    std::snprintf(buf, sizeof buf, "kv_rows %d (a stage of cached rows is 64 or 128 rows; 0: by position)", o.kv_rows);
    return buf;
  }
  if (o.counted_rows < 0 || o.counted_rows > 2) {
    std::snprintf(buf, sizeof buf, "counted_rows %d (0: arrival counters; 1 or 2: counted rows)", o.counted_rows);
    return buf;
  }
  if (o.l2_prefetch < 0 || o.l2_prefetch > kMaxL2Ahead) {
    std::snprintf(buf, sizeof buf, "l2_prefetch %d (stages prefetched into L2 ahead of the ring: 0 for none, up to %lld)",
                  o.l2_prefetch, static_cast<long long>(kMaxL2Ahead));
    return buf;
  }
  if (o.warp_rotary < 0 || o.warp_rotary > 1) {
    std::snprintf(buf, sizeof buf, "warp_rotary %d (0: a block barrier before the rotary; 1: each warp rotates its own pair)",
                  o.warp_rotary);
    return buf;
  }
  if (o.warp_norm < 0 || o.warp_norm > 1) {
    std::snprintf(buf, sizeof buf, "warp_norm %d (0: the block normalizes the row; 1: each warp its own share)", o.warp_norm);
    return buf;
  }
  if (o.head_inflight < 0) {
    std::snprintf(buf, sizeof buf, "head_inflight %d (copies in flight: 0 for the ring's depth, or more)", o.head_inflight);
    return buf;
  }
  if (o.a_tasks < 2 || o.a_tasks % 2 != 0 || o.a_tasks > kMaxTasks) {
    std::snprintf(buf, sizeof buf, "a phase-A block's MLP tasks are %d (an even number, 2 to %lld)", o.a_tasks,
                  static_cast<long long>(kMaxTasks));
    return buf;
  }
  return "";
}

namespace {
struct OptionField {
  const char* name;
  int DecodeLayersKernelOptions::*field;
};
constexpr OptionField kOptionFields[] = {
    {"stages", &DecodeLayersKernelOptions::stages},
    {"a_tasks", &DecodeLayersKernelOptions::a_tasks},
    {"max_inflight", &DecodeLayersKernelOptions::max_inflight},
    {"release_inflight", &DecodeLayersKernelOptions::release_inflight},
    {"head_inflight", &DecodeLayersKernelOptions::head_inflight},
    {"kv_rows", &DecodeLayersKernelOptions::kv_rows},
    {"counted_rows", &DecodeLayersKernelOptions::counted_rows},
    {"l2_prefetch", &DecodeLayersKernelOptions::l2_prefetch},
    {"warp_rotary", &DecodeLayersKernelOptions::warp_rotary},
    {"warp_norm", &DecodeLayersKernelOptions::warp_norm},
    {"b_inflight", &DecodeLayersKernelOptions::b_inflight},
};
}  // namespace

std::vector<std::string> decode_layers_option_names() {
  std::vector<std::string> names;
  for (const OptionField& f : kOptionFields) names.emplace_back(f.name);
  return names;
}

std::string decode_layers_options_text(const DecodeLayersKernelOptions& o) {
  std::string text;
  for (const OptionField& f : kOptionFields)
    text += (text.empty() ? "" : ",") + std::string(f.name) + "=" + std::to_string(o.*f.field);
  return text;
}

std::string set_decode_layers_option(DecodeLayersKernelOptions& o, const std::string& name, int64_t value) {
  std::string known;
  for (const OptionField& f : kOptionFields) {
    if (name == f.name) {
      if (value < -(int64_t{1} << 20) || value > (int64_t{1} << 20)) return name + ": " + std::to_string(value) + " is out of range";
      o.*f.field = static_cast<int>(value);
      return "";
    }
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  }
  return "unknown persistent_decode option '" + name + "' (the options: " + known + ")";
}

std::string decode_layers_grid_unfit(const DecodeLayersShape& s, const DecodeLayersKernelOptions& o, int64_t blocks) {
  char buf[256];
  const int64_t a_blocks = s.kv_heads * kCluster, pairs = s.intermediate / 8, a_pairs = o.a_tasks / 2 * a_blocks;
  const std::string invalid = decode_layers_options_invalid(o);
  if (!invalid.empty()) return invalid;
  if (blocks % kCluster != 0 || blocks < a_blocks) {
    std::snprintf(buf, sizeof buf, "%lld blocks: the kernel needs whole clusters of 8 and at least %lld (a cluster a kv head)",
                  static_cast<long long>(blocks), static_cast<long long>(a_blocks));
    return buf;
  }
  const int64_t others = blocks - a_blocks, rest = pairs - a_pairs;
  const int64_t most = others > 0 ? 2 * ((rest + others - 1) / others) : 0;
  if (rest < 0 || (others == 0 && rest > 0) || most > kMaxTasks) {
    std::snprintf(buf, sizeof buf,
                  "%lld blocks cannot share %lld MLP tasks with %d a phase-A block (at most %lld a block)",
                  static_cast<long long>(blocks), static_cast<long long>(2 * pairs), o.a_tasks,
                  static_cast<long long>(kMaxTasks));
    return buf;
  }
  return "";
}

int64_t decode_layers_fewest_blocks(const DecodeLayersShape& s, const DecodeLayersKernelOptions& o) {
  for (int64_t blocks = s.kv_heads * kCluster; blocks <= kDecodeLayersMaxClusters * kCluster; blocks += kCluster)
    if (decode_layers_grid_unfit(s, o, blocks).empty()) return blocks;
  return 0;
}

int64_t decode_layers_stages_per_layer(const DecodeLayersShape& s) {
  const int64_t tasks = s.intermediate / 4;
  return s.kv_heads * kCluster * 6 + tasks + tasks / 2;
}
int64_t decode_layers_packed_elems(const DecodeLayersShape& s) {
  return s.layers * decode_layers_stages_per_layer(s) * (kStageBytes / 2) + s.layers * 2 * s.hidden;
}
int64_t decode_layers_sync_bytes(const DecodeLayersShape& s, const DecodeLayersKernelOptions& o) {
  // counters and epoch, 3 rows and the last (fp32), the head's key; with counted rows an overflow
  // flag (padded to 16 bytes) and two sets of 2 * layers u64 rows
  if (o.counted_rows) return 16 + 4 * 4 * s.hidden + 32 + 2 * (2 * s.layers) * s.hidden * 8;
  return 16 + 4 * 4 * s.hidden + (s.vocab > 0 ? 16 : 0);
}
int64_t decode_layers_shared_bytes(const DecodeLayersKernelOptions& o) { return o.stages * kStageBytes + kStateBytes; }

std::string decode_layers_kernel_source(const DecodeLayersShape& shape, const DecodeLayersKernelOptions& o,
                                        const std::string& name) {
  std::string src = std::string(kPrelude) + kKernel;
  const bool bf16 = shape.dtype == engine::DType::kBFloat16;
  replace_all(src, "@NAME@", name);
  replace_all(src, "@INTER@", std::to_string(shape.intermediate));
  replace_all(src, "@LAYERS@", std::to_string(shape.layers));
  replace_all(src, "@KV_HEADS@", std::to_string(shape.kv_heads));
  replace_all(src, "@MAX_LEN@", std::to_string(shape.max_len));
  replace_all(src, "@EPS@", float_literal(shape.eps));
  replace_all(src, "@A_TASKS@", std::to_string(o.a_tasks));
  replace_all(src, "@STAGES@", std::to_string(o.stages));
  replace_all(src, "@STATE_BYTES@", std::to_string(kStateBytes));
  replace_all(src, "@MAX_INFLIGHT@", std::to_string(o.max_inflight));
  replace_all(src, "@RELEASE_INFLIGHT@", std::to_string(o.release_inflight));
  replace_all(src, "@COMPUTE@", std::to_string(o.compute));
  replace_all(src, "@COUNTED@", std::to_string(o.counted_rows));
  replace_all(src, "@KV_ROWS@", std::to_string(o.kv_rows));
  replace_all(src, "@HEAD_INFLIGHT@", std::to_string(o.head_inflight));
  replace_all(src, "@L2_AHEAD@", std::to_string(o.l2_prefetch));
  replace_all(src, "@WARP_ROTARY@", std::to_string(o.warp_rotary));
  replace_all(src, "@WARP_NORM@", std::to_string(o.warp_norm));
  replace_all(src, "@B_INFLIGHT@", std::to_string(o.b_inflight));
  replace_all(src, "@VOCAB@", std::to_string(shape.vocab));
  replace_all(src, "@EMBED_ROWS@", std::to_string(shape.embed_rows));
  replace_all(src, "@HEAD_EPS@", float_literal(shape.vocab > 0 ? shape.head_eps : shape.eps));
  replace_all(src, "@OUT_T@", shape.vocab > 0 ? "long long" : "unsigned short");
  std::string locals = shape.vocab > 0 ? "" : "  unsigned short* const logits = nullptr;\n  const unsigned short* const head_w = nullptr;\n"
                                               "  const unsigned short* const head_norm = nullptr;\n";
  if (shape.embed_rows == 0) locals += "  const long long* const token_in = nullptr;\n";
  replace_all(src, "@HEAD_LOCALS@", locals);
  replace_all(src, "@DTYPE@", bf16 ? "bf16" : "fp16");
  replace_all(src, "@PAIR@",
              bf16 ? "  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));"
                   : "  float lo, hi;\n  asm(\"{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }\""
                     " : \"=f\"(lo), \"=f\"(hi) : \"r\"(w));\n  return make_float2(lo, hi);");
  replace_all(src, "@LD1@",
              bf16 ? "  return __uint_as_float(((unsigned)h) << 16);"
                   : "  float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f;");
  replace_all(src, "@ST1@",
              bf16 ? "  T h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;"
                   : "  T h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;");
  std::ostringstream params, ks, vs;
  for (int64_t l = 0; l < shape.layers; ++l) {
    params << (l ? ", " : "") << "unsigned short* k_cache_" << l;
    ks << (l ? ", " : "") << "k_cache_" << l;
    vs << (l ? ", " : "") << "v_cache_" << l;
  }
  for (int64_t l = 0; l < shape.layers; ++l) params << ", unsigned short* v_cache_" << l;
  if (shape.vocab > 0)
    params << ", unsigned short* logits, const unsigned short* __restrict__ head_w, "
              "const unsigned short* __restrict__ head_norm";
  if (shape.embed_rows > 0) params << ", const long long* token_in";
  if (o.trace) params << ", unsigned long long* trace";
  replace_all(src, "@CACHE_PARAMS@", params.str());
  replace_all(src, "@K_CACHES@", ks.str());
  replace_all(src, "@V_CACHES@", vs.str());
  replace_all(src, "@MARK@",
              o.trace ? "    if (tid == 0 && p < 2 * kLayers) trace[((size_t)b * 2 * kLayers + p) * kMarks + k] = globaltimer();"
                      : "    (void)p;\n    (void)k;");
  return src;
}

}  // namespace kiln::ops
