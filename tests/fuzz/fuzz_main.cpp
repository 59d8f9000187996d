// kiln_fuzz: damages .pte files and the Kiln engines inside them, case by
// case, and pushes each through the load path (targets.h). Built with ASan +
// UBSan by scripts/fuzz.sh; any crash, sanitizer report or hang ends the run
// with a non-zero status, the case that caused it, and the damaged bytes saved.
//
//   kiln_fuzz [--cases=N] [--seed=S] [--out=DIR] [--verbose] a.pte b.pte ...
//   kiln_fuzz --replay=FILE [--engine]        run one saved input
//
// Half the cases damage a whole .pte, half an engine blob taken from the
// pristine .pte files (raw, or with checksums re-computed). Each case is
// reproducible from (seed, case number). Last line: "fuzz: N passed, N failed".
#include <sanitizer/common_interface_defs.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mutate.h"
#include "targets.h"

namespace {

using kiln::fuzz::Focus;
using kiln::fuzz::Outcome;
using kiln::fuzz::Rng;

constexpr unsigned kCaseTimeoutSeconds = 20;

// The case in flight, for the crash and hang reports (fixed buffers: the
// death callback must not depend on the heap being sane).
char g_case[512] = "(before the first case)";
const std::vector<uint8_t>* g_input = nullptr;
char g_out_dir[1024] = ".";
uint64_t g_passed = 0;

void save_input(const char* kind) {
  if (g_input == nullptr) return;
  char path[1200];
  std::snprintf(path, sizeof(path), "%s/fuzz-%s.bin", g_out_dir, kind);
  if (std::FILE* f = std::fopen(path, "wb")) {
    if (!g_input->empty()) std::fwrite(g_input->data(), 1, g_input->size(), f);
    std::fclose(f);
    std::fprintf(stderr, "fuzz: the damaged input is saved as %s (replay: kiln_fuzz --replay=%s%s)\n",
                 path, path, std::strstr(g_case, ", engine ") != nullptr ? " --engine" : "");
  }
}

void report_failure(const char* what) {
  std::fprintf(stderr, "\nfuzz: %s in case %s\n", what, g_case);
  save_input(what);
  std::printf("fuzz: %" PRIu64 " passed, 1 failed\n", g_passed);
  std::fflush(stdout);
  std::fflush(stderr);
}

void on_sanitizer_death() { report_failure("CRASH"); }

void on_alarm(int) {
  report_failure("HANG");
  _exit(3);
}

bool read_file(const char* path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

struct Sample {
  std::string name;
  std::vector<uint8_t> bytes;
  std::vector<Focus> focus;  // ranges mutations prefer; empty: anywhere
};

int usage(const char* problem) {
  std::fprintf(stderr, "kiln_fuzz: %s\nusage: kiln_fuzz [--cases=N] [--seed=S] [--out=DIR] "
               "[--verbose] a.pte ... | kiln_fuzz --replay=FILE [--engine]\n", problem);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t cases = 10000, seed = 13;
  bool verbose = false, engine_replay = false;
  std::string replay;
  std::vector<const char*> paths;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--cases=", 8) == 0) cases = std::strtoull(a + 8, nullptr, 10);
    else if (std::strncmp(a, "--seed=", 7) == 0) seed = std::strtoull(a + 7, nullptr, 10);
    else if (std::strncmp(a, "--out=", 6) == 0) std::snprintf(g_out_dir, sizeof(g_out_dir), "%s", a + 6);
    else if (std::strncmp(a, "--replay=", 9) == 0) replay = a + 9;
    else if (std::strcmp(a, "--engine") == 0) engine_replay = true;
    else if (std::strcmp(a, "--verbose") == 0) verbose = true;
    else if (a[0] == '-') return usage((std::string("unknown flag ") + a).c_str());
    else paths.push_back(a);
  }
  __sanitizer_set_death_callback(on_sanitizer_death);
  signal(SIGALRM, on_alarm);
  kiln::fuzz::init_targets(verbose);

  if (!replay.empty()) {
    std::vector<uint8_t> bytes;
    if (!read_file(replay.c_str(), &bytes)) return usage("cannot read the --replay file");
    std::snprintf(g_case, sizeof(g_case), "replay of %s", replay.c_str());
    g_input = &bytes;
    const Outcome outcome = engine_replay ? kiln::fuzz::run_engine(bytes.data(), bytes.size())
                                          : kiln::fuzz::run_pte(bytes.data(), bytes.size(), nullptr);
    std::printf("%s: %s\nfuzz: 1 passed, 0 failed\n", replay.c_str(),
                outcome == Outcome::kAccepted ? "accepted" : "refused");
    return 0;
  }
  if (paths.empty()) return usage("no .pte files given");

  // The pristine inputs must load, and their engines must parse: otherwise
  // the harness would be measuring refusals of its own making.
  std::vector<Sample> ptes, engines;
  for (const char* path : paths) {
    Sample s;
    s.name = path;
    if (!read_file(path, &s.bytes) || s.bytes.empty()) return usage((std::string("cannot read ") + path).c_str());
    std::vector<std::vector<uint8_t>> blobs;
    if (kiln::fuzz::run_pte(s.bytes.data(), s.bytes.size(), &blobs) != Outcome::kAccepted) {
      std::fprintf(stderr, "kiln_fuzz: the intact %s does not load (harness or export broken)\n", path);
      return 2;
    }
    if (const size_t program = kiln::fuzz::pte_program_size(s.bytes.data(), s.bytes.size()); program > 0)
      s.focus.push_back({0, program});
    for (size_t b = 0; b < blobs.size(); ++b) {
      Sample e;
      e.name = s.name + " engine " + std::to_string(b);
      e.bytes = std::move(blobs[b]);
      if (kiln::fuzz::run_engine(e.bytes.data(), e.bytes.size()) != Outcome::kAccepted) {
        std::fprintf(stderr, "kiln_fuzz: %s does not parse intact\n", e.name.c_str());
        return 2;
      }
      e.focus = kiln::fuzz::engine_sections(e.bytes);
      engines.push_back(std::move(e));
    }
    std::printf("%s: %zu bytes, %zu engine(s)\n", path, s.bytes.size(), blobs.size());
    ptes.push_back(std::move(s));
  }
  if (engines.empty()) {
    std::fprintf(stderr, "kiln_fuzz: no Kiln engine in the given files\n");
    return 2;
  }

  uint64_t refused[3] = {}, accepted[3] = {}, count[3] = {};  // pte, engine raw, engine re-sealed
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint8_t> bytes;
  for (uint64_t c = 0; c < cases; ++c) {
    Rng rng(kiln::fuzz::case_seed(seed, c));
    const bool on_engine = c % 2 == 1;
    const std::vector<Sample>& pool = on_engine ? engines : ptes;
    const Sample& sample = pool[rng.below(pool.size())];
    Focus focus;
    if (!sample.focus.empty()) focus = sample.focus[rng.below(sample.focus.size())];
    const bool reseal = on_engine && rng.below(2) == 0;
    bytes = sample.bytes;
    const std::string how = kiln::fuzz::mutate(&bytes, &rng, focus, /*allow_truncate=*/!reseal);
    if (reseal) kiln::fuzz::reseal_engine(&bytes);
    const int kind = on_engine ? (reseal ? 2 : 1) : 0;
    std::snprintf(g_case, sizeof(g_case), "%" PRIu64 " (seed %" PRIu64 "): %s, %s, %s%s", c,
                  seed, on_engine ? "engine" : "pte", sample.name.c_str(), how.c_str(),
                  reseal ? ", re-sealed" : "");
    g_input = &bytes;
    if (verbose) std::printf("case %s\n", g_case);
    alarm(kCaseTimeoutSeconds);
    const Outcome outcome = on_engine ? kiln::fuzz::run_engine(bytes.data(), bytes.size())
                                      : kiln::fuzz::run_pte(bytes.data(), bytes.size(), nullptr);
    alarm(0);
    ++count[kind];
    ++(outcome == Outcome::kAccepted ? accepted : refused)[kind];
    ++g_passed;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const char* names[3] = {".pte files", "engines, raw", "engines, re-sealed"};
  for (int k = 0; k < 3; ++k)
    std::printf("  %-19s %7" PRIu64 " cases: %7" PRIu64 " refused, %6" PRIu64
                " still accepted (damage in bytes nothing reads, or a value still valid)\n",
                names[k], count[k], refused[k], accepted[k]);
  std::printf("%" PRIu64 " cases in %.1f s, seed %" PRIu64 ", 0 crashes, 0 hangs\n", cases,
              seconds, seed);
  std::printf("fuzz: %" PRIu64 " passed, 0 failed\n", g_passed);
  return 0;
}
