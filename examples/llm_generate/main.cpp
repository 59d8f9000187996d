// llm_generate: generation from a Kiln .pte holding `prefill` and
// `decode` methods that share weights and a KV cache kept on the GPU
// (examples/llm_generate/export_llama.py). ExecuTorch's Module and the Kiln
// delegate only: no libtorch, no Python.
//
//   llm_generate --model M.pte [--data_path M.ptd] [--prompt 1,2,3 | --prompt_file F]
//                [--new_tokens N] [--expect F] [--logits_out F] [--no_cuda_graphs]
//                [--warmup W] [--runs R] [--force F] [--device_io]
//                [--temperature T [--top_k K] [--top_p P] [--seed S]] [--stop 2,3]
//
// Greedy by default: each method's own argmax (on the GPU). --temperature T > 0 samples on the
// host from softmax(logits / T) instead (sampler.h; the program must return its logits: export
// with --logits), restricted to the top_k largest logits and then to the smallest set reaching
// probability top_p, as Hugging Face's generate does; --seed makes it repeat (default 0).
// --stop ids: the generation ends at the first of them it emits (that token included).
//
// --device_io: the program was saved with device-resident I/O (export_llama.py --device-io); the
// tokens stay on the GPU between steps and the host waits once a generation (device_loop.h).
//
// --force F (teacher forcing): decode step i is fed token i of F (ids, as --prompt) instead of the
// token the program chose, so two programs (or a program and PyTorch) can be compared logit by
// logit along the same history; the tokens printed are still each step's own choice.
//
// Each method takes (tokens int64 [1, T], positions int64 [T]) and returns
// the next token (int64 [1], argmax on the GPU) and, when exported with
// --logits, the logits [1, vocab]. `prefill` runs the prompt (its length is
// fixed at export: the constant method get_prompt_len; or, exported with
// --prefill-max, any length, in chunks of the sizes get_prefill_sizes lists,
// one engine each), then `decode` runs
// once per new token at the next position, up to get_max_seq_len.
//
// Prints the time to first token (the prefill call, host to host), decode
// tokens/s, and what KilnBackend moved between host and GPU during decode:
// a token and a position in, a token out, never the cache.
//
// exit codes: 0 done (and --expect matched), 1 load/run error, 2 usage,
//             3 no usable CUDA GPU, 5 tokens differ from --expect
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>

#include "device_loop.h"
#include "sampler.h"

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;

namespace {

constexpr const char* kKiln = "KilnBackend";

struct Flags {
  std::string model, data_path, prompt, prompt_file, expect, logits_out, force, stop;
  llm::SamplerOptions sampling;
  int new_tokens = 64;
  int warmup = 0, runs = 1;  // whole generations; timings are medians over `runs`
  bool cuda_graphs = true;
  bool device_io = false;
};

void usage() {
  std::fprintf(stderr,
               "usage: llm_generate --model M.pte [--data_path M.ptd] [--prompt 1,2,3 | --prompt_file F]\n"
               "                    [--new_tokens N] [--expect F] [--logits_out F] [--no_cuda_graphs]\n"
               "                    [--warmup W] [--runs R] [--force F] [--device_io]\n"
               "                    [--temperature T [--top_k K] [--top_p P] [--seed S]] [--stop 2,3]\n");
}

bool parse_flags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "llm_generate: %s needs a value\n", a.c_str());
        return false;
      }
      *out = argv[++i];
      return true;
    };
    std::string n;
    if (a == "--model" && value(&f->model)) continue;
    if (a == "--data_path" && value(&f->data_path)) continue;
    if (a == "--prompt" && value(&f->prompt)) continue;
    if (a == "--prompt_file" && value(&f->prompt_file)) continue;
    if (a == "--expect" && value(&f->expect)) continue;
    if (a == "--logits_out" && value(&f->logits_out)) continue;
    if (a == "--force" && value(&f->force)) continue;
    if (a == "--stop" && value(&f->stop)) continue;
    double* real = a == "--temperature" ? &f->sampling.temperature : a == "--top_p" ? &f->sampling.top_p : nullptr;
    if (real != nullptr && value(&n)) {
      char* end = nullptr;
      *real = std::strtod(n.c_str(), &end);
      if (n.empty() || *end != '\0') {
        std::fprintf(stderr, "llm_generate: %s '%s' is not a number\n", a.c_str(), n.c_str());
        return false;
      }
      continue;
    }
    if ((a == "--top_k" || a == "--seed") && value(&n)) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(n.c_str(), &end, 10);
      if (n.empty() || n[0] == '-' || *end != '\0' || (a == "--top_k" && v > (1ull << 31))) {
        std::fprintf(stderr, "llm_generate: %s '%s' is not a count >= 0\n", a.c_str(), n.c_str());
        return false;
      }
      if (a == "--top_k") f->sampling.top_k = static_cast<int64_t>(v);
      else f->sampling.seed = v;
      continue;
    }
    if (a == "--no_cuda_graphs") {
      f->cuda_graphs = false;
      continue;
    }
    if (a == "--device_io") {
      f->device_io = true;
      continue;
    }
    int* count = a == "--new_tokens" ? &f->new_tokens : a == "--warmup" ? &f->warmup : a == "--runs" ? &f->runs
                                                                                                  : nullptr;
    if (count != nullptr && value(&n)) {
      char* end = nullptr;
      long v = std::strtol(n.c_str(), &end, 10);
      const long least = a == "--warmup" ? 0 : 1;
      if (*end != '\0' || v < least || v > 1000000) {
        std::fprintf(stderr, "llm_generate: %s '%s' is not a count >= %ld\n", a.c_str(), n.c_str(), least);
        return false;
      }
      *count = static_cast<int>(v);
      continue;
    }
    std::fprintf(stderr, "llm_generate: unknown or incomplete flag '%s'\n", a.c_str());
    return false;
  }
  if (f->model.empty()) std::fprintf(stderr, "llm_generate: --model is required\n");
  if (!f->prompt.empty() && !f->prompt_file.empty())
    std::fprintf(stderr, "llm_generate: give --prompt or --prompt_file, not both\n");
  const std::string bad_sampling = llm::sampler_options_invalid(f->sampling);
  if (!bad_sampling.empty()) std::fprintf(stderr, "llm_generate: %s\n", bad_sampling.c_str());
  const bool sampling = f->sampling.temperature > 0.0;
  if (sampling && f->device_io)
    std::fprintf(stderr, "llm_generate: --device_io keeps the tokens on the GPU, where the program picks them "
                         "greedily; --temperature samples each step's logits on the host: drop one of them\n");
  return !f->model.empty() && (f->prompt.empty() || f->prompt_file.empty()) && bad_sampling.empty() &&
         !(sampling && f->device_io);
}

// Comma- or whitespace-separated token ids.
bool parse_ids(const std::string& text, const std::string& what, std::vector<int64_t>* ids) {
  std::string t = text;
  for (char& c : t)
    if (c == ',') c = ' ';
  std::istringstream in(t);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    long long v = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || v < 0) {
      std::fprintf(stderr, "llm_generate: %s: '%s' is not a token id\n", what.c_str(), word.c_str());
      return false;
    }
    ids->push_back(v);
  }
  return true;
}

bool read_file(const std::string& path, std::string* text) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "llm_generate: cannot read %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  std::stringstream s;
  s << f.rdbuf();
  *text = s.str();
  return true;
}

// The sizes `prefill` was compiled for (get_prefill_sizes, a program exported
// with a dynamic prompt length); empty when the method is absent (a fixed
// prompt length, get_prompt_len).
std::vector<int64_t> prefill_sizes(Module& m) {
  std::vector<int64_t> sizes;
  auto names = m.method_names();
  if (!names.ok() || names->count("get_prefill_sizes") == 0) return sizes;
  auto out = m.execute("get_prefill_sizes");
  if (!out.ok()) return sizes;
  for (const et::EValue& v : *out)
    if (v.isInt()) sizes.push_back(v.toInt());
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

// An int constant method (get_max_seq_len, ...) of the program.
bool constant(Module& m, const char* name, int64_t* value) {
  auto out = m.execute(name);
  if (!out.ok() || out->empty() || !(*out)[0].isInt()) {
    std::fprintf(stderr, "llm_generate: the program has no int constant method '%s' (export it with "
                         "examples/llm_generate/export_llama.py)\n", name);
    return false;
  }
  *value = (*out)[0].toInt();
  return true;
}

float to_float(const executorch::aten::Tensor& t, size_t i) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return t.const_data_ptr<float>()[i];
    case ScalarType::Half: return static_cast<float>(t.const_data_ptr<executorch::aten::Half>()[i]);
    case ScalarType::BFloat16: return static_cast<float>(t.const_data_ptr<executorch::aten::BFloat16>()[i]);
    default: return 0.0f;
  }
}

struct Counters {
  int h2d = 0, d2h = 0, h2d_bytes = 0, d2h_bytes = 0, launches = 0, records = 0;
};

Counters read_counters() {
  Counters c;
  et::BackendOptions<6> q;
  (void)q.set_option("h2d_copies", 0);
  (void)q.set_option("d2h_copies", 0);
  (void)q.set_option("h2d_bytes", 0);
  (void)q.set_option("d2h_bytes", 0);
  (void)q.set_option("graph_launches", 0);
  (void)q.set_option("graph_records", 0);
  if (et::get_option(kKiln, q.view()) != et::Error::Ok) return c;
  (void)q.get_option("h2d_copies", c.h2d);
  (void)q.get_option("d2h_copies", c.d2h);
  (void)q.get_option("h2d_bytes", c.h2d_bytes);
  (void)q.get_option("d2h_bytes", c.d2h_bytes);
  (void)q.get_option("graph_launches", c.launches);
  (void)q.get_option("graph_records", c.records);
  return c;
}

class Generator {
 public:
  // sampler: null for the program's own greedy choice.
  Generator(Module& m, FILE* logits_out, llm::Sampler* sampler)
      : module_(m), logits_out_(logits_out), sampler_(sampler) {}

  // Runs `method` on tokens at positions; the next token in *next (the
  // program's argmax, or the sampler's pick from the logits). Logits are
  // written, and sampled, when `record` (a prompt's last chunk, every decode step).
  bool step(const char* method, std::vector<int64_t> tokens, std::vector<int64_t> positions, int64_t* next,
            bool record = true) {
    const auto t = static_cast<executorch::aten::SizesType>(tokens.size());
    TensorPtr tok = executorch::extension::make_tensor_ptr({1, t}, std::move(tokens));
    TensorPtr pos = executorch::extension::make_tensor_ptr({t}, std::move(positions));
    auto out = module_.execute(method, {et::EValue(tok), et::EValue(pos)});
    if (!out.ok()) {
      std::fprintf(stderr, "llm_generate: %s failed (error 0x%x)\n", method, static_cast<unsigned>(out.error()));
      return false;
    }
    if (out->empty() || !(*out)[0].isTensor() || (*out)[0].toTensor().scalar_type() != ScalarType::Long ||
        (*out)[0].toTensor().numel() != 1) {
      std::fprintf(stderr, "llm_generate: %s must return the next token as int64 [1] first\n", method);
      return false;
    }
    *next = (*out)[0].toTensor().const_data_ptr<int64_t>()[0];
    const bool want_row = record && (logits_out_ != nullptr || sampler_ != nullptr);
    if (want_row && out->size() > 1 && (*out)[1].isTensor()) {
      const auto& lg = (*out)[1].toTensor();
      row_.resize(static_cast<size_t>(lg.numel()));
      for (size_t i = 0; i < row_.size(); ++i) row_[i] = to_float(lg, i);
      if (logits_out_ != nullptr) std::fwrite(row_.data(), sizeof(float), row_.size(), logits_out_);
      if (sampler_ != nullptr) {
        std::string why;
        if ((*next = sampler_->pick(row_.data(), row_.size(), &why)) < 0) {
          std::fprintf(stderr, "llm_generate: %s: cannot sample: %s\n", method, why.c_str());
          return false;
        }
      }
    } else if (record && sampler_ != nullptr) {
      std::fprintf(stderr, "llm_generate: %s returned no logits to sample\n", method);
      return false;
    }
    return true;
  }

 private:
  Module& module_;
  FILE* logits_out_;
  llm::Sampler* sampler_;
  std::vector<float> row_;
};

bool is_stop(const std::vector<int64_t>& stop, int64_t token) {
  return std::find(stop.begin(), stop.end(), token) != stop.end();
}

// Where the generation ends: the index just past the first stop token in `tokens`, or its size.
size_t stop_at(const std::vector<int64_t>& tokens, const std::vector<int64_t>& stop) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (is_stop(stop, tokens[i])) return i + 1;
  return tokens.size();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!parse_flags(argc, argv, &flags)) {
    usage();
    return 2;
  }
  if (!flags.cuda_graphs) {
    et::BackendOptions<1> off;
    (void)off.set_option("use_cuda_graphs", false);
    (void)et::set_option(kKiln, off.view());
  }
  Module module = flags.data_path.empty() ? Module(flags.model, Module::LoadMode::Mmap)
                                          : Module(flags.model, flags.data_path, Module::LoadMode::Mmap);
  if (et::Error e = module.load(et::Program::Verification::InternalConsistency); e != et::Error::Ok) {
    std::fprintf(stderr, "llm_generate: cannot load %s: %s\n", flags.model.c_str(), et::to_string(e));
    return 1;
  }
  int64_t max_len = 0, prompt_len = 0;
  if (!constant(module, "get_max_seq_len", &max_len) || !constant(module, "get_prompt_len", &prompt_len)) return 1;

  std::vector<int64_t> prompt;
  std::string text = flags.prompt;
  if (!flags.prompt_file.empty() && !read_file(flags.prompt_file, &text)) return 1;
  if (text.empty()) {  // a fixed default prompt
    for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(1 + (i * 37) % 97);
  } else if (!parse_ids(text, "prompt", &prompt)) {
    return 2;
  }
  std::vector<int64_t> forced;  // --force: the tokens fed to the decode steps
  if (!flags.force.empty()) {
    std::string force_text;
    if (!read_file(flags.force, &force_text) || !parse_ids(force_text, flags.force, &forced)) return 2;
    if (static_cast<int64_t>(forced.size()) < flags.new_tokens - 1) {
      std::fprintf(stderr, "llm_generate: --force %s has %zu tokens; %d new tokens feed %d\n", flags.force.c_str(),
                   forced.size(), flags.new_tokens, flags.new_tokens - 1);
      return 2;
    }
  }
  std::vector<int64_t> stop;  // --stop: the ids that end a generation
  if (!flags.stop.empty() && !parse_ids(flags.stop, "--stop", &stop)) return 2;
  const std::vector<int64_t> chunk_sizes = prefill_sizes(module);
  if (flags.device_io && !chunk_sizes.empty()) {
    std::fprintf(stderr, "llm_generate: --device_io takes a program with a fixed prompt length (this one's "
                         "prefill runs in chunks of get_prefill_sizes)\n");
    return 2;
  }
  if (chunk_sizes.empty() && static_cast<int64_t>(prompt.size()) != prompt_len) {
    std::fprintf(stderr, "llm_generate: the prompt has %zu tokens; this program's prefill takes exactly %lld "
                         "(get_prompt_len; export with --prefill-max for any length)\n", prompt.size(),
                 static_cast<long long>(prompt_len));
    return 2;
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "llm_generate: the prompt is empty\n");
    return 2;
  }
  // Token ids past the vocabulary: the engines would refuse them too (their index bounds), but
  // this names the flag.
  int64_t vocab = 0;
  if (auto names = module.method_names(); names.ok() && names->count("get_vocab_size") && constant(module, "get_vocab_size", &vocab))
    for (const std::vector<int64_t>* ids : {&prompt, &forced, &stop})
      for (size_t i = 0; i < ids->size(); ++i)
        if ((*ids)[i] >= vocab) {
          std::fprintf(stderr, "llm_generate: %s token %zu is %lld; this model's vocabulary is %lld ids (0 to %lld)\n",
                       ids == &prompt ? "prompt" : ids == &stop ? "--stop" : "--force", i, static_cast<long long>((*ids)[i]),
                       static_cast<long long>(vocab), static_cast<long long>(vocab - 1));
          return 2;
        }
  prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len + flags.new_tokens > max_len) {
    std::fprintf(stderr, "llm_generate: %lld prompt + %d new tokens exceed the KV cache of %lld positions "
                         "(get_max_seq_len)\n", static_cast<long long>(prompt_len), flags.new_tokens,
                 static_cast<long long>(max_len));
    return 2;
  }
  const bool sampling = flags.sampling.temperature > 0.0;
  if (sampling) {  // the tokens come from the logits: both methods must return them
    for (const char* m : {"prefill", "decode"}) {
      auto meta = module.method_meta(m);
      if (meta.ok() && meta->num_outputs() < 2) {
        std::fprintf(stderr, "llm_generate: --temperature samples the logits, and this program's '%s' returns "
                             "only its argmax token (export it with export_llama.py --logits)\n", m);
        return 2;
      }
    }
  }
  std::printf("%s: prompt %lld tokens, KV cache %lld positions, %d new tokens", flags.model.c_str(),
              static_cast<long long>(prompt_len), static_cast<long long>(max_len), flags.new_tokens);
  if (sampling)
    std::printf(", sampled (temperature %g, top_k %lld, top_p %g, seed %llu)", flags.sampling.temperature,
                static_cast<long long>(flags.sampling.top_k), flags.sampling.top_p,
                static_cast<unsigned long long>(flags.sampling.seed));
  std::printf("\n");
  // The program checks out; running it needs the GPU.
  et::BackendInterface* kiln = et::get_backend_class(kKiln);
  if (kiln == nullptr || !kiln->is_available()) {
    std::fprintf(stderr, "llm_generate: %s; the program's methods run on KilnBackend, which needs an NVIDIA GPU\n",
                 kiln == nullptr ? "KilnBackend is not linked in" : "no usable CUDA GPU here");
    return 3;
  }
  // Load both methods (engines, weights, cache) before timing anything.
  for (const char* m : {"prefill", "decode"})
    if (et::Error e = module.load_method(m); e != et::Error::Ok) {
      std::fprintf(stderr, "llm_generate: cannot load method '%s': %s\n", m, et::to_string(e));
      return 1;
    }
  FILE* logits = nullptr;
  if (!flags.logits_out.empty() && (logits = std::fopen(flags.logits_out.c_str(), "wb")) == nullptr) {
    std::fprintf(stderr, "llm_generate: cannot write %s: %s\n", flags.logits_out.c_str(), std::strerror(errno));
    return 1;
  }
  using clock = std::chrono::steady_clock;
  std::vector<int64_t> positions(prompt.size());
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int64_t>(i);
  std::vector<int64_t> tokens, first_tokens;
  std::vector<double> ttfts, decodes;
  Counters before, after;
  // Each generation starts over at position 0: prefill rewrites the cache's
  // first positions and the mask hides everything past the current one.
  llm::DeviceLoop device_loop;
  if (flags.device_io) {
    if (std::string why = device_loop.prepare(module, prompt, flags.new_tokens, forced, logits != nullptr);
        !why.empty()) {
      std::fprintf(stderr, "llm_generate: --device_io: %s\n", why.c_str());
      return 1;
    }
  }
  std::vector<float> logit_rows;
  // A generation's times (prefill t0..t1, decode t1..t2) once past the warmup; false (with the
  // reason printed) when its tokens differ from the first generation's.
  auto record = [&](int run, clock::time_point t0, clock::time_point t1, clock::time_point t2) {
    if (run >= flags.warmup) {
      ttfts.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      decodes.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    if (run == 0) first_tokens = tokens;
    if (tokens == first_tokens) return true;
    std::fprintf(stderr, "llm_generate: generation %d gave other tokens than the first one: the cache or "
                         "the engines are not deterministic\n", run + 1);
    return false;
  };
  for (int run = 0; run < flags.warmup + flags.runs; ++run) {
    const bool last = run + 1 == flags.warmup + flags.runs;
    if (flags.device_io) {  // the tokens stay on the GPU; the host waits after prefill and at the end
      const auto t0 = clock::now();
      std::string why = device_loop.prefill();
      const auto t1 = clock::now();
      if (last) before = read_counters();
      for (int i = 1; i < flags.new_tokens && why.empty(); ++i) why = device_loop.decode(i);
      if (why.empty()) why = device_loop.finish(&tokens, last && logits != nullptr ? &logit_rows : nullptr);
      const auto t2 = clock::now();
      if (!why.empty()) {
        std::fprintf(stderr, "llm_generate: --device_io: %s\n", why.c_str());
        return 1;
      }
      if (last) after = read_counters();
      // The steps were enqueued ahead, so all of them ran; the tokens past a stop token are dropped.
      tokens.resize(stop_at(tokens, stop));
      if (last && logits != nullptr) std::fwrite(logit_rows.data(), sizeof(float), logit_rows.size(), logits);
      if (!record(run, t0, t1, t2)) return 1;
      continue;
    }
    llm::Sampler sampler(flags.sampling);  // each generation draws the same numbers: it repeats
    Generator gen(module, last ? logits : nullptr, sampling ? &sampler : nullptr);
    tokens.clear();
    int64_t next = 0;
    const auto t0 = clock::now();
    // A dynamic prefill runs the prompt in chunks of its compiled sizes,
    // largest first (each chunk's cache writes are the next chunk's keys);
    // a last single token goes through `decode`, which takes one.
    for (size_t at = 0; at < prompt.size();) {
      const size_t left = prompt.size() - at;
      size_t chunk = chunk_sizes.empty() ? left : 1;
      for (int64_t s : chunk_sizes)
        if (static_cast<size_t>(s) <= left) chunk = static_cast<size_t>(s);
      const char* method = chunk == 1 && !chunk_sizes.empty() && chunk_sizes.front() > 1 ? "decode" : "prefill";
      std::vector<int64_t> part(prompt.begin() + at, prompt.begin() + at + chunk);
      std::vector<int64_t> where(positions.begin() + at, positions.begin() + at + chunk);
      if (!gen.step(method, std::move(part), std::move(where), &next, at + chunk == prompt.size())) return 1;
      at += chunk;
    }
    const auto t1 = clock::now();
    tokens.push_back(next);
    if (last) before = read_counters();
    // Up to new_tokens, or past the first stop token emitted.
    for (int i = 1; i < flags.new_tokens && !is_stop(stop, next); ++i) {
      const int64_t fed = forced.empty() ? next : forced[static_cast<size_t>(i - 1)];
      if (!gen.step("decode", {fed}, {prompt_len + i - 1}, &next)) return 1;
      tokens.push_back(next);
    }
    const auto t2 = clock::now();
    if (last) after = read_counters();
    if (!record(run, t0, t1, t2)) return 1;
  }
  if (logits != nullptr) std::fclose(logits);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const double ttft_ms = median(ttfts);
  const double decode_s = median(decodes);
  // Decode steps run: every one with --device_io (enqueued ahead), else up to the stop token.
  const int steps = flags.device_io ? flags.new_tokens - 1 : static_cast<int>(tokens.size()) - 1;
  if (tokens.size() < static_cast<size_t>(flags.new_tokens))
    std::printf("stopped at token %zu (%lld, a --stop id)\n", tokens.size() - 1, static_cast<long long>(tokens.back()));
  std::printf("tokens:");
  for (int64_t t : tokens) std::printf(" %lld", static_cast<long long>(t));
  std::string chunks;
  if (!chunk_sizes.empty()) {
    for (size_t left = prompt.size(); left > 0;) {
      size_t chunk = 1;
      for (int64_t s : chunk_sizes)
        if (static_cast<size_t>(s) <= left) chunk = static_cast<size_t>(s);
      chunks += (chunks.empty() ? "" : " + ") + std::to_string(chunk);
      left -= chunk;
    }
    chunks = " in chunks " + chunks;
  }
  std::printf("\ntime to first token: %.3f ms (prefill of %lld tokens%s; median of %d)\n", ttft_ms,
              static_cast<long long>(prompt_len), chunks.c_str(), flags.runs);
  if (steps > 0) {
    std::printf("decode: %d tokens in %.3f ms: %.1f tokens/s (%.3f ms/token; median of %d)\n", steps,
                decode_s * 1e3, steps / decode_s, decode_s * 1e3 / steps, flags.runs);
    std::printf("decode host<->GPU traffic: %d copies in (%d bytes), %d copies out (%d bytes), "
                "%d CUDA graph launches, %d graph recordings: %.1f bytes in and %.1f out per token\n",
                after.h2d - before.h2d, after.h2d_bytes - before.h2d_bytes, after.d2h - before.d2h,
                after.d2h_bytes - before.d2h_bytes, after.launches - before.launches,
                after.records - before.records, double(after.h2d_bytes - before.h2d_bytes) / steps,
                double(after.d2h_bytes - before.d2h_bytes) / steps);
  }
  if (!flags.expect.empty()) {
    std::string expect_text;
    std::vector<int64_t> expected;
    if (!read_file(flags.expect, &expect_text) || !parse_ids(expect_text, flags.expect, &expected)) return 1;
    size_t n = std::min(expected.size(), tokens.size()), first_diff = n;
    for (size_t i = 0; i < n && first_diff == n; ++i)
      if (expected[i] != tokens[i]) first_diff = i;
    if (first_diff == n && expected.size() == tokens.size()) {
      std::printf("PASS  %zu tokens equal %s\n", tokens.size(), flags.expect.c_str());
    } else {
      std::printf("FAIL  tokens differ from %s at %zu of %zu (got %lld, expected %lld)\n", flags.expect.c_str(),
                  first_diff, expected.size(),
                  first_diff < tokens.size() ? static_cast<long long>(tokens[first_diff]) : -1LL,
                  first_diff < expected.size() ? static_cast<long long>(expected[first_diff]) : -1LL);
      return 5;
    }
  }
  return 0;
}
