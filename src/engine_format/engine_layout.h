// Constants of the on-disk layout shared by engine_writer.cpp and
// engine_reader.cpp (private to src/engine_format and its tests). The layout
// itself is documented at the top of engine_writer.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::engine::layout {

// FileHeader field offsets.
constexpr size_t kMagicOffset = 0;          // 8 bytes "KILNENG\0"
constexpr size_t kVersionOffset = 8;        // u32
constexpr size_t kSectionCountOffset = 12;  // u32
constexpr size_t kTotalSizeOffset = 16;     // u64
constexpr size_t kFlagsOffset = 24;         // u32, must be 0
constexpr size_t kHeaderCrcOffset = 28;     // u32
constexpr size_t kHeaderSize = 32;

// SectionEntry field offsets (relative to the entry).
constexpr size_t kEntryKindOffset = 0;       // u32
constexpr size_t kEntryReservedOffset = 4;   // u32, must be 0
constexpr size_t kEntryOffsetOffset = 8;     // u64
constexpr size_t kEntrySizeOffset = 16;      // u64
constexpr size_t kEntryCrcOffset = 24;       // u32
constexpr size_t kEntryReserved2Offset = 28; // u32, must be 0
constexpr size_t kEntrySize = 32;

constexpr size_t kSectionAlignment = 64;

// Stable on-disk values: never renumber.
enum class SectionKind : uint32_t {
  kMeta = 1,
  kTensors = 2,
  kIo = 3,
  kModules = 4,
  kSteps = 5,
  kWeights = 6,
  kNamedWeights = 7,  // format version 4
  kStates = 8,        // format version 5
  kDerivedWeights = 9,  // format version 6
};
constexpr uint32_t kSectionCount = 9;  // every kind exactly once

inline const char* section_name(uint32_t kind) {
  switch (kind) {
    case 1: return "meta";
    case 2: return "tensors";
    case 3: return "io";
    case 4: return "modules";
    case 5: return "steps";
    case 6: return "weights";
    case 7: return "named_weights";
    case 8: return "states";
    case 9: return "derived_weights";
  }
  return "unknown";
}

}  // namespace kiln::engine::layout
