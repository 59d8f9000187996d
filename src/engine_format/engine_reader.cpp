// Engine parsing: bytes -> EngineDesc. The layout is documented at the top of
// engine_writer.cpp.
//
// Order of checks, so each failure gets the most useful message:
//   magic -> version -> header fits -> section table fits (else "truncated")
//   -> header checksum -> total size == buffer size -> section table entries
//   -> zero gaps -> section checksums -> section contents -> validate_engine.
// Nothing is read before its bounds are checked; counts are checked against
// the bytes left before anything is allocated.
#include <algorithm>
#include <cstring>
#include <utility>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_layout.h"
#include "engine_format/step_format.h"

namespace kiln::engine {
namespace {

using layout::SectionKind;

// Smallest encodings, for read_count's allocation guard.
constexpr size_t kMinMetadataBytes = 4 + 4;
constexpr size_t kMinTensorBytes = 4 + 1 + 1 + 1 + 4 + 8 + 8;
constexpr size_t kMinModuleBytes = 4 + 4 + 4 + 4 + 4;
constexpr size_t kMinCubinBytes = 4 + 4;
constexpr size_t kMinStepBytes = 1 + 4 + 4;  // kind, label length, payload size
constexpr size_t kMinNamedWeightBytes = 4 + 8 + 8;
constexpr size_t kMinDerivedWeightBytes = 4 + 8 + 4;  // name length, nbytes, copy count
constexpr size_t kDerivedCopyBytes = 4 + 8 + 8 + 8 + 4 + 4;

Status parse_meta(ByteReader& r, EngineDesc* desc) {
  KILN_READ_OR_RETURN(r.read_u64(&desc->arena_bytes), "arena_bytes");
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, kMinMetadataBytes), "metadata count");
  desc->metadata.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    KILN_READ_OR_RETURN(r.read_string(&desc->metadata[i].first), "metadata %u key", i);
    KILN_READ_OR_RETURN(r.read_string(&desc->metadata[i].second), "metadata %u value", i);
  }
  return Status::ok();
}

Status parse_tensors(ByteReader& r, EngineDesc* desc) {
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, kMinTensorBytes), "tensor count");
  desc->tensors.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    TensorDesc& t = desc->tensors[i];
    uint8_t dtype = 0, storage = 0, rank = 0;
    KILN_READ_OR_RETURN(r.read_string(&t.name), "tensor %u name", i);
    KILN_READ_OR_RETURN(r.read_u8(&dtype), "tensor %u dtype", i);
    KILN_READ_OR_RETURN(r.read_u8(&storage), "tensor %u storage", i);
    KILN_READ_OR_RETURN(r.read_u8(&rank), "tensor %u rank", i);
    // Enum ranges are validate_engine's job; the rank bounds an allocation.
    if (rank > kMaxRank)
      return make_status(StatusCode::kCorruptData, "tensor %u: rank %u exceeds the maximum %u", i,
                         static_cast<unsigned>(rank), kMaxRank);
    t.dtype = static_cast<DType>(dtype);
    t.storage = static_cast<StorageKind>(storage);
    KILN_READ_OR_RETURN(r.read_u32(&t.io_index), "tensor %u io_index", i);
    KILN_READ_OR_RETURN(r.read_u64(&t.offset), "tensor %u offset", i);
    KILN_READ_OR_RETURN(r.read_u64(&t.nbytes), "tensor %u nbytes", i);
    t.shape.resize(rank);
    for (uint32_t d = 0; d < rank; ++d)
      KILN_READ_OR_RETURN(r.read_i64(&t.shape[d]), "tensor %u shape dim %u", i, d);
  }
  return Status::ok();
}

Status parse_index_list(ByteReader& r, const char* what, std::vector<uint32_t>* list) {
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, 4), "%s count", what);
  list->resize(count);
  for (uint32_t i = 0; i < count; ++i)
    KILN_READ_OR_RETURN(r.read_u32(&(*list)[i]), "%s %u", what, i);
  return Status::ok();
}

Status parse_io(ByteReader& r, EngineDesc* desc) {
  KILN_RETURN_IF_ERROR(parse_index_list(r, "input", &desc->inputs));
  return parse_index_list(r, "output", &desc->outputs);
}

Status parse_modules(ByteReader& r, EngineDesc* desc) {
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, kMinModuleBytes), "module count");
  desc->modules.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    KernelModule& m = desc->modules[i];
    KILN_READ_OR_RETURN(r.read_string(&m.name), "module %u name", i);
    KILN_READ_OR_RETURN(r.read_u32(&m.ptx_sm), "module %u ptx_sm", i);
    KILN_READ_OR_RETURN(r.read_string(&m.ptx), "module %u ptx", i);
    KILN_READ_OR_RETURN(r.read_string(&m.source), "module %u source", i);
    uint32_t cubins = 0;
    KILN_READ_OR_RETURN(r.read_count(&cubins, kMinCubinBytes), "module %u cubin count", i);
    m.cubins.resize(cubins);
    for (uint32_t c = 0; c < cubins; ++c) {
      KILN_READ_OR_RETURN(r.read_u32(&m.cubins[c].sm), "module %u cubin %u sm", i, c);
      KILN_READ_OR_RETURN(r.read_bytes(&m.cubins[c].image), "module %u cubin %u image", i, c);
    }
  }
  return Status::ok();
}

// Each step's payload is read by its kind's registered codec (step_format.h)
// from a reader that covers exactly the payload.
Status parse_steps(ByteReader& r, EngineDesc* desc) {
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, kMinStepBytes), "step count");
  desc->steps.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    Step& s = desc->steps[i];
    uint8_t kind = 0;
    KILN_READ_OR_RETURN(r.read_u8(&kind), "step %u kind", i);
    KILN_READ_OR_RETURN(r.read_string(&s.label), "step %u label", i);
    const StepFormat* format = find_step_format(kind);
    if (format == nullptr)
      return make_status(StatusCode::kCorruptData, "step %u: unknown kind %u", i,
                         static_cast<unsigned>(kind));
    s.kind = format->kind;
    uint32_t size = 0;
    KILN_READ_OR_RETURN(r.read_u32(&size), "step %u payload size", i);
    const uint8_t* payload = nullptr;
    KILN_READ_OR_RETURN(r.read_span(size, &payload), "step %u (%s) payload of %u bytes", i,
                        format->name, size);
    ByteReader sub(payload, size, r.section());
    KILN_RETURN_IF_ERROR(format->read(sub, i, &s));
    if (sub.remaining() != 0)
      return make_status(StatusCode::kCorruptData,
                         "step %u (%s '%s'): %zu bytes left over after its %u-byte payload", i,
                         format->name, s.label.c_str(), sub.remaining(), size);
  }
  return Status::ok();
}

Status parse_named_weights(ByteReader& r, EngineDesc* desc) {
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, kMinNamedWeightBytes), "named weight count");
  desc->named_weights.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    NamedWeight& n = desc->named_weights[i];
    KILN_READ_OR_RETURN(r.read_string(&n.key), "named weight %u key", i);
    KILN_READ_OR_RETURN(r.read_u64(&n.nbytes), "named weight %u nbytes", i);
    KILN_READ_OR_RETURN(r.read_u64(&n.hash), "named weight %u hash", i);
  }
  return Status::ok();
}

Status parse_states(ByteReader& r, EngineDesc* desc) {
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, 4 + 8 + 4), "state count");
  desc->states.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    StateDesc& s = desc->states[i];
    KILN_READ_OR_RETURN(r.read_string(&s.key), "state %u key", i);
    KILN_READ_OR_RETURN(r.read_u64(&s.nbytes), "state %u nbytes", i);
    KILN_READ_OR_RETURN(r.read_bytes(&s.init), "state %u initial value", i);
  }
  return Status::ok();
}

Status parse_derived_weights(ByteReader& r, EngineDesc* desc) {
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, kMinDerivedWeightBytes), "derived weight count");
  desc->derived_weights.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    DerivedWeight& d = desc->derived_weights[i];
    KILN_READ_OR_RETURN(r.read_string(&d.name), "derived weight %u name", i);
    KILN_READ_OR_RETURN(r.read_u64(&d.nbytes), "derived weight %u nbytes", i);
    uint32_t copies = 0;
    KILN_READ_OR_RETURN(r.read_count(&copies, kDerivedCopyBytes), "derived weight %u copy count", i);
    d.copies.resize(copies);
    for (uint32_t c = 0; c < copies; ++c) {
      DerivedCopy& copy = d.copies[c];
      KILN_READ_OR_RETURN(r.read_u32(&copy.source), "derived weight %u copy %u source", i, c);
      KILN_READ_OR_RETURN(r.read_u64(&copy.offset), "derived weight %u copy %u offset", i, c);
      KILN_READ_OR_RETURN(r.read_u64(&copy.stride), "derived weight %u copy %u stride", i, c);
      KILN_READ_OR_RETURN(r.read_u64(&copy.dst), "derived weight %u copy %u dst", i, c);
      KILN_READ_OR_RETURN(r.read_u32(&copy.rows), "derived weight %u copy %u rows", i, c);
      KILN_READ_OR_RETURN(r.read_u32(&copy.row_bytes), "derived weight %u copy %u row_bytes", i, c);
    }
  }
  return Status::ok();
}

struct SectionRef {
  uint32_t kind = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc = 0;
};

Status corrupt_truncated(uint64_t header_total, size_t size) {
  return make_status(StatusCode::kCorruptData, "truncated: header says %llu bytes, got %zu",
                     static_cast<unsigned long long>(header_total), size);
}

// Checks magic, version, sizes, the header checksum and the section table.
// On success `sections` is indexed by kind - 1.
Status parse_container(const uint8_t* p, size_t size,
                       SectionRef (&sections)[layout::kSectionCount]) {
  constexpr size_t kMagicAndVersion = layout::kVersionOffset + 4;
  if (size >= sizeof(kEngineMagic) &&
      std::memcmp(p + layout::kMagicOffset, kEngineMagic, sizeof(kEngineMagic)) != 0)
    return make_status(StatusCode::kCorruptData, "not a Kiln engine (bad magic)");
  if (size < kMagicAndVersion)
    return make_status(StatusCode::kCorruptData,
                       "truncated: %zu bytes is smaller than the %zu-byte engine header", size,
                       layout::kHeaderSize);
  uint32_t version = load_le32(p + layout::kVersionOffset);
  if (version != kEngineFormatVersion)
    return make_status(StatusCode::kIncompatible,
                       "engine format version %u, this runtime reads version %u (%s)", version,
                       kEngineFormatVersion,
                       version < kEngineFormatVersion
                           ? "the engine is older: rebuild the .pte, re-exporting the model "
                             "with this Kiln"
                           : "the engine is newer: update the Kiln runtime");
  if (size < layout::kHeaderSize)
    return make_status(StatusCode::kCorruptData,
                       "truncated: %zu bytes is smaller than the %zu-byte engine header", size,
                       layout::kHeaderSize);

  uint32_t section_count = load_le32(p + layout::kSectionCountOffset);
  uint64_t total = load_le64(p + layout::kTotalSizeOffset);
  if (section_count != layout::kSectionCount)
    return make_status(StatusCode::kCorruptData, "header lists %u sections, expected %u",
                       section_count, layout::kSectionCount);
  size_t table_end = layout::kHeaderSize + layout::kSectionCount * layout::kEntrySize;
  if (size < table_end) return corrupt_truncated(total, size);

  uint32_t stored_crc = load_le32(p + layout::kHeaderCrcOffset);
  uint32_t crc = crc32c(p, layout::kHeaderCrcOffset);
  crc = crc32c(p + layout::kHeaderSize, table_end - layout::kHeaderSize, crc);
  if (crc != stored_crc)
    return make_status(StatusCode::kCorruptData,
                       "header checksum mismatch (stored 0x%08x, computed 0x%08x)", stored_crc,
                       crc);
  // The header is now trusted, so a size mismatch is a truncated (or padded)
  // buffer rather than a corrupt header.
  if (total > size) return corrupt_truncated(total, size);
  if (total < size)
    return make_status(StatusCode::kCorruptData,
                       "size mismatch: header says %llu bytes, got %zu (trailing bytes)",
                       static_cast<unsigned long long>(total), size);
  if (load_le32(p + layout::kFlagsOffset) != 0)
    return make_status(StatusCode::kCorruptData, "unknown header flags 0x%08x",
                       load_le32(p + layout::kFlagsOffset));

  bool seen[layout::kSectionCount] = {};
  SectionRef by_offset[layout::kSectionCount];
  for (uint32_t i = 0; i < layout::kSectionCount; ++i) {
    const uint8_t* e = p + layout::kHeaderSize + i * layout::kEntrySize;
    SectionRef s;
    s.kind = load_le32(e + layout::kEntryKindOffset);
    s.offset = load_le64(e + layout::kEntryOffsetOffset);
    s.size = load_le64(e + layout::kEntrySizeOffset);
    s.crc = load_le32(e + layout::kEntryCrcOffset);
    if (s.kind < 1 || s.kind > layout::kSectionCount)
      return make_status(StatusCode::kCorruptData, "section table entry %u: unknown kind %u", i,
                         s.kind);
    const char* name = layout::section_name(s.kind);
    if (seen[s.kind - 1])
      return make_status(StatusCode::kCorruptData, "section '%s' appears more than once", name);
    seen[s.kind - 1] = true;
    if (load_le32(e + layout::kEntryReservedOffset) != 0 ||
        load_le32(e + layout::kEntryReserved2Offset) != 0)
      return make_status(StatusCode::kCorruptData, "section '%s': reserved fields are not zero",
                         name);
    uint64_t end = 0;
    if (s.offset % layout::kSectionAlignment != 0 || s.offset < table_end ||
        !checked_add(s.offset, s.size, &end) || end > size)
      return make_status(StatusCode::kCorruptData,
                         "section '%s' (offset %llu, size %llu) is misaligned or outside the "
                         "%zu-byte engine",
                         name, static_cast<unsigned long long>(s.offset),
                         static_cast<unsigned long long>(s.size), size);
    sections[s.kind - 1] = s;
    by_offset[i] = s;
  }

  // Sections must not overlap, and every byte between them (and after the
  // table) must be zero: no byte escapes both the checksums and this check.
  std::sort(by_offset, by_offset + layout::kSectionCount,
            [](const SectionRef& a, const SectionRef& b) { return a.offset < b.offset; });
  uint64_t cursor = table_end;
  for (const SectionRef& s : by_offset) {
    if (s.offset < cursor)
      return make_status(StatusCode::kCorruptData, "section '%s' overlaps another section",
                         layout::section_name(s.kind));
    for (uint64_t b = cursor; b < s.offset; ++b)
      if (p[b] != 0)
        return make_status(StatusCode::kCorruptData,
                           "non-zero padding byte at offset %llu before section '%s'",
                           static_cast<unsigned long long>(b), layout::section_name(s.kind));
    cursor = s.offset + s.size;
  }
  for (uint64_t b = cursor; b < size; ++b)
    if (p[b] != 0)
      return make_status(StatusCode::kCorruptData,
                         "non-zero padding byte at offset %llu after the last section",
                         static_cast<unsigned long long>(b));

  for (const SectionRef& s : sections) {
    uint32_t computed = crc32c(p + s.offset, static_cast<size_t>(s.size));
    if (computed != s.crc)
      return make_status(StatusCode::kCorruptData,
                         "section '%s' checksum mismatch (stored 0x%08x, computed 0x%08x)",
                         layout::section_name(s.kind), s.crc, computed);
  }
  return Status::ok();
}

using SectionParser = Status (*)(ByteReader&, EngineDesc*);

Status parse_section(const uint8_t* p, const SectionRef& s, SectionParser parser,
                     EngineDesc* desc) {
  ByteReader r(p + s.offset, static_cast<size_t>(s.size), layout::section_name(s.kind));
  KILN_RETURN_IF_ERROR(parser(r, desc));
  return r.expect_end();
}

}  // namespace

Result<EngineDesc> parse_engine(const void* data, size_t size) {
  if (data == nullptr && size != 0)
    return make_status(StatusCode::kInvalidArgument, "parse_engine: null data with size %zu",
                       size);
  const auto* p = static_cast<const uint8_t*>(data);
  SectionRef sections[layout::kSectionCount];
  KILN_RETURN_IF_ERROR(parse_container(p, size, sections).with_context("parse_engine"));

  auto ref = [&](SectionKind kind) -> const SectionRef& {
    return sections[static_cast<uint32_t>(kind) - 1];
  };
  EngineDesc desc;
  Status status = parse_section(p, ref(SectionKind::kMeta), parse_meta, &desc);
  if (status.is_ok()) status = parse_section(p, ref(SectionKind::kTensors), parse_tensors, &desc);
  if (status.is_ok()) status = parse_section(p, ref(SectionKind::kIo), parse_io, &desc);
  if (status.is_ok()) status = parse_section(p, ref(SectionKind::kModules), parse_modules, &desc);
  if (status.is_ok()) status = parse_section(p, ref(SectionKind::kSteps), parse_steps, &desc);
  if (status.is_ok())
    status = parse_section(p, ref(SectionKind::kNamedWeights), parse_named_weights, &desc);
  if (status.is_ok()) status = parse_section(p, ref(SectionKind::kStates), parse_states, &desc);
  if (status.is_ok())
    status = parse_section(p, ref(SectionKind::kDerivedWeights), parse_derived_weights, &desc);
  KILN_RETURN_IF_ERROR(status.with_context("parse_engine"));

  const SectionRef& weights = ref(SectionKind::kWeights);
  desc.weights.assign(p + weights.offset, p + weights.offset + weights.size);

  // A file whose bytes are intact but whose contents are inconsistent is
  // still corrupt data from the caller's point of view.
  Status valid = validate_engine(desc);
  if (!valid.is_ok())
    return Status(StatusCode::kCorruptData, "parse_engine: invalid engine: " + valid.message());
  return desc;
}

}  // namespace kiln::engine
