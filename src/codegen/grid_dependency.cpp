#include "codegen/grid_dependency.h"

#include <sstream>
#include <vector>

#include "ir/graph.h"

namespace kiln::codegen {
namespace {

std::string trimmed(const std::string& line) {
  const size_t b = line.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  const size_t e = line.find_last_not_of(" \t\r");
  return line.substr(b, e - b + 1);
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// ".target sm_80" or ".target sm_80, debug": the SM number, 0 when absent.
uint32_t target_sm(const std::string& line) {
  const size_t p = line.find("sm_");
  if (p == std::string::npos) return 0;
  uint32_t sm = 0;
  for (size_t i = p + 3; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) sm = sm * 10 + (line[i] - '0');
  return sm;
}

}  // namespace

std::string grid_dependency_prelude() {
  // The marker is an inline-asm comment: NVRTC copies it into the PTX where
  // the call stands, and the "memory" clobber keeps loads and stores on
  // their side of it. Prefetches only warm L2 and may come before it.
  return std::string(R"(__device__ __forceinline__ void kiln_grid_wait() { asm volatile(")") + kGridWaitMarker +
         R"(" ::: "memory"); }
__device__ __forceinline__ void kiln_prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
)";
}

std::string add_grid_dependency(const std::string& ptx) {
  static const char* kInstructions = "\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n";
  std::istringstream in(ptx);
  std::ostringstream out;
  std::string line;
  bool target_seen = false;
  bool in_entry_header = false;  // after ".entry", before its body's "{"
  int depth = 0;                 // brace depth inside an entry's body
  std::vector<std::string> body;  // the body being read, after its "{"
  bool marked = false;           // the body has a marker
  int entries = 0, patched = 0;
  while (std::getline(in, line)) {
    const std::string t = trimmed(line);
    if (depth > 0) {  // inside an entry's body: held until its closing brace
      const std::string code = t.substr(0, t.find("//"));
      for (char c : code) depth += c == '{' ? 1 : c == '}' ? -1 : 0;
      if (t == kGridWaitMarker) {
        marked = true;
        body.push_back(kInstructions);
      } else {
        body.push_back(line + "\n");
      }
      if (depth == 0) {
        if (!marked) out << kInstructions;
        for (const std::string& l : body) out << l;
        body.clear();
        ++patched;
      }
      continue;
    }
    if (t == kGridWaitMarker) throw CompileError("internal: a grid-wait marker outside a PTX .entry body");
    if (!target_seen && starts_with(t, ".target ")) {
      target_seen = true;
      const uint32_t sm = target_sm(t);
      if (sm == 0) throw CompileError("internal: PTX .target line without an sm: '" + t + "'");
      if (sm < kGridDependencyMinSm) {
        out << ".target sm_" << kGridDependencyMinSm << t.substr(t.find("sm_") + 3 + std::to_string(sm).size())
            << "\n";
        continue;
      }
    }
    out << line << "\n";
    if (t.find(".entry ") != std::string::npos && (starts_with(t, ".entry") || starts_with(t, ".visible") ||
                                                   starts_with(t, ".weak"))) {
      if (in_entry_header) throw CompileError("internal: PTX .entry without a body before the next .entry");
      in_entry_header = true;
      ++entries;
    } else if (in_entry_header && t == "{") {
      in_entry_header = false;
      depth = 1;
      marked = false;
    }
  }
  if (!target_seen) throw CompileError("internal: PTX without a .target line");
  if (in_entry_header || depth != 0 || patched != entries)
    throw CompileError("internal: a PTX .entry has no body to add griddepcontrol to");
  return out.str();
}

}  // namespace kiln::codegen
