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

std::string grid_dependency_wait() {
  return std::string("asm volatile(\"// ") + kGridDependencyWaitMarker + "\" ::: \"memory\");";
}

std::string grid_dependency_trigger() {
  return std::string("asm volatile(\"// ") + kGridDependencyTriggerMarker + "\" ::: \"memory\");";
}

std::string add_grid_dependency(const std::string& ptx) {
  std::vector<std::string> lines;
  {
    std::istringstream in(ptx);
    std::string line;
    while (std::getline(in, line)) lines.push_back(line);
  }
  auto is_entry = [](const std::string& t) {
    return t.find(".entry ") != std::string::npos &&
           (starts_with(t, ".entry") || starts_with(t, ".visible") || starts_with(t, ".weak"));
  };
  auto is_function = [](const std::string& t) { return t.find(".func ") != std::string::npos; };
  auto has = [](const std::string& line, const char* marker) { return line.find(marker) != std::string::npos; };
  auto is_marker = [&](const std::string& line) { return has(line, kGridDependencyWaitMarker); };
  auto is_trigger = [&](const std::string& line) { return has(line, kGridDependencyTriggerMarker); };
  // Whether the entry declared at line `i` has `marker` (its wait or its
  // trigger) before the next entry or function; more than one is refused.
  auto places = [&](size_t i, const char* marker, const char* what) {
    int markers = 0;
    for (size_t j = i + 1; j < lines.size(); ++j) {
      const std::string t = trimmed(lines[j]);
      if (is_entry(t) || is_function(t)) break;
      if (has(lines[j], marker)) ++markers;
    }
    if (markers > 1)
      throw CompileError(std::string("internal: a PTX .entry has more than one grid-dependency ") + what + " marker");
    return markers == 1;
  };
  std::ostringstream out;
  bool target_seen = false;
  bool in_entry_header = false;  // after ".entry", before its body's "{"
  bool in_marked_body = false;   // in the body of an entry that places its wait
  int entries = 0, patched = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
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
    if (is_marker(line)) {
      if (!in_marked_body) throw CompileError("internal: a grid-dependency wait marker outside a kernel's body");
      out << "\tgriddepcontrol.wait;\n";
      continue;
    }
    if (is_trigger(line)) {
      if (!in_marked_body) throw CompileError("internal: a grid-dependency trigger marker outside a kernel's body");
      out << "\tgriddepcontrol.launch_dependents;\n";
      continue;
    }
    out << line << "\n";
    if (is_function(t)) in_marked_body = false;
    if (is_entry(t)) {
      if (in_entry_header) throw CompileError("internal: PTX .entry without a body before the next .entry");
      in_entry_header = true;
      in_marked_body = false;
      ++entries;
    } else if (in_entry_header && t == "{") {
      in_entry_header = false;
      in_marked_body = places(i, kGridDependencyWaitMarker, "wait");
      // A kernel that places its wait triggers first, so that its successor
      // (a product whose loads run ahead too) may start streaming; any other
      // kernel waits first, which keeps the run-ahead one kernel deep.
      out << (in_marked_body ? (places(i, kGridDependencyTriggerMarker, "trigger") ? "" : "\tgriddepcontrol.launch_dependents;\n")
                             : "\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n");
      ++patched;
    }
  }
  if (!target_seen) throw CompileError("internal: PTX without a .target line");
  if (in_entry_header || patched != entries)
    throw CompileError("internal: a PTX .entry has no body to add griddepcontrol to");
  return out.str();
}

}  // namespace kiln::codegen
