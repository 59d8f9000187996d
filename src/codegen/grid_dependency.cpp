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

std::string add_grid_dependency(const std::string& ptx) {
  std::istringstream in(ptx);
  std::ostringstream out;
  std::string line;
  bool target_seen = false;
  bool in_entry_header = false;  // after ".entry", before its body's "{"
  int entries = 0, patched = 0;
  while (std::getline(in, line)) {
    const std::string t = trimmed(line);
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
      out << "\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n";
      in_entry_header = false;
      ++patched;
    }
  }
  if (!target_seen) throw CompileError("internal: PTX without a .target line");
  if (in_entry_header || patched != entries)
    throw CompileError("internal: a PTX .entry has no body to add griddepcontrol to");
  return out.str();
}

}  // namespace kiln::codegen
