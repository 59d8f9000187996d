// Engine serialization: EngineDesc -> bytes.
//
// On-disk layout, format version 6 (version 2 added batched GEMMs and conv
// steps; version 3 put each step's payload behind its byte size, so every
// kind's codec reads exactly its own bytes; version 4 added named weights,
// section 7 and storage kind 4; version 5 mutable state, section 8 and
// storage kind 5; version 6 derived weights, section 9 and storage kind 6,
// and the kernel step's min_blocks; other versions are refused, see
// engine_format.h). All integers little-endian; "str" is a
// u32 byte length followed by that many bytes (no terminator); "bytes" the
// same for binary data.
//
// FileHeader, 32 bytes at offset 0:
//   0  u8[8] magic "KILNENG\0"
//   8  u32   format version (6)
//   12 u32   section count (always 9)
//   16 u64   total size of the engine in bytes
//   24 u32   flags (0)
//   28 u32   header CRC-32C over bytes [0, 28) followed by the section table
//
// SectionEntry[section count], 32 bytes each, right after the header:
//   0  u32 kind     4  u32 reserved (0)
//   8  u64 offset   16 u64 size      24 u32 CRC-32C of the section bytes
//   28 u32 reserved (0)
//
// Sections follow in kind order, each starting at a 64-byte aligned offset;
// the gaps are zero bytes (the reader checks that, so every byte of the file is
// covered by a checksum or a zero check). The file ends where the last section
// ends.
//
//  kind | name    | contents
//  -----+---------+-----------------------------------------------------------
//   1   | meta    | u64 arena_bytes; u32 n; n x {str key; str value}
//   2   | tensors | u32 n; n x {str name; u8 dtype; u8 storage; u8 rank;
//       |         |   u32 io_index; u64 offset; u64 nbytes; i64 dims[rank]}
//   3   | io      | u32 n; u32 inputs[n]; u32 m; u32 outputs[m]
//   4   | modules | u32 n; n x {str name; u32 ptx_sm; str ptx; str source;
//       |         |   u32 c; c x {u32 sm; bytes image}}
//   5   | steps   | u32 n; n x {u8 kind; str label; u32 size; payload[size]}
//       |         |   the payload is the kind's own fields, written and read by
//       |         |   its registered codec (step_format.h); each layout is at
//       |         |   the top of steps/<kind>_step_format.cpp:
//       |         |   gemm (0), kernel (1), conv (2)
//   6   | weights | the raw weights blob (inline weights, storage kind 3)
//   7   | named_weights | u32 n; n x {str key; u64 nbytes; u64 hash}: weights
//       |         |   outside the engine (storage kind 4, io_index = entry),
//       |         |   fetched by key from the program's named data at load and
//       |         |   checked against nbytes and hash (hash_bytes)
//   8   | states  | u32 n; n x {str key; u64 nbytes; bytes init}: mutable
//       |         |   buffers (storage kind 5, io_index = entry) the runtime
//       |         |   keeps on the device across executions; init empty = zeros
//   9   | derived_weights | u32 n; n x {str name; u64 nbytes; u32 c;
//       |         |   c x {u32 source; u64 offset; u64 stride; u64 dst;
//       |         |   u32 rows; u32 row_bytes}}: weights the runtime makes at
//       |         |   load (storage kind 6, io_index = entry): nbytes zeroed,
//       |         |   then each copy's rows from tensor `source` (an inline or
//       |         |   named weight), see engine_desc.h DerivedWeight
//
// Fields a step or argument kind does not use are not stored (they parse back
// as their defaults). Enum values are EngineDesc's stable numbers.
#include <cstdint>
#include <cstring>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_layout.h"
#include "engine_format/step_format.h"

namespace kiln::engine {
namespace {

using layout::SectionKind;

void write_meta(const EngineDesc& desc, ByteWriter* w) {
  w->put_u64(desc.arena_bytes);
  w->put_u32(static_cast<uint32_t>(desc.metadata.size()));
  for (const auto& kv : desc.metadata) {
    w->put_string(kv.first);
    w->put_string(kv.second);
  }
}

void write_tensors(const EngineDesc& desc, ByteWriter* w) {
  w->put_u32(static_cast<uint32_t>(desc.tensors.size()));
  for (const TensorDesc& t : desc.tensors) {
    w->put_string(t.name);
    w->put_u8(static_cast<uint8_t>(t.dtype));
    w->put_u8(static_cast<uint8_t>(t.storage));
    w->put_u8(static_cast<uint8_t>(t.shape.size()));  // validated <= kMaxRank
    w->put_u32(t.io_index);
    w->put_u64(t.offset);
    w->put_u64(t.nbytes);
    for (int64_t d : t.shape) w->put_i64(d);
  }
}

void write_named_weights(const EngineDesc& desc, ByteWriter* w) {
  w->put_u32(static_cast<uint32_t>(desc.named_weights.size()));
  for (const NamedWeight& n : desc.named_weights) {
    w->put_string(n.key);
    w->put_u64(n.nbytes);
    w->put_u64(n.hash);
  }
}

void write_states(const EngineDesc& desc, ByteWriter* w) {
  w->put_u32(static_cast<uint32_t>(desc.states.size()));
  for (const StateDesc& s : desc.states) {
    w->put_string(s.key);
    w->put_u64(s.nbytes);
    w->put_bytes(s.init);
  }
}

void write_derived_weights(const EngineDesc& desc, ByteWriter* w) {
  w->put_u32(static_cast<uint32_t>(desc.derived_weights.size()));
  for (const DerivedWeight& d : desc.derived_weights) {
    w->put_string(d.name);
    w->put_u64(d.nbytes);
    w->put_u32(static_cast<uint32_t>(d.copies.size()));  // validated: at most 16 M
    for (const DerivedCopy& c : d.copies) {
      w->put_u32(c.source);
      w->put_u64(c.offset);
      w->put_u64(c.stride);
      w->put_u64(c.dst);
      w->put_u32(c.rows);
      w->put_u32(c.row_bytes);
    }
  }
}

void write_index_list(const std::vector<uint32_t>& list, ByteWriter* w) {
  w->put_u32(static_cast<uint32_t>(list.size()));
  for (uint32_t v : list) w->put_u32(v);
}

void write_io(const EngineDesc& desc, ByteWriter* w) {
  write_index_list(desc.inputs, w);
  write_index_list(desc.outputs, w);
}

void write_modules(const EngineDesc& desc, ByteWriter* w) {
  w->put_u32(static_cast<uint32_t>(desc.modules.size()));
  for (const KernelModule& m : desc.modules) {
    w->put_string(m.name);
    w->put_u32(m.ptx_sm);
    w->put_string(m.ptx);
    w->put_string(m.source);
    w->put_u32(static_cast<uint32_t>(m.cubins.size()));
    for (const CubinImage& c : m.cubins) {
      w->put_u32(c.sm);
      w->put_bytes(c.image);
    }
  }
}

// Each step: the common header, then its kind's payload (written by the kind's
// registered codec, step_format.h), whose size is patched in afterwards.
Status write_steps(const EngineDesc& desc, ByteWriter* w) {
  w->put_u32(static_cast<uint32_t>(desc.steps.size()));
  for (const Step& s : desc.steps) {
    w->put_u8(static_cast<uint8_t>(s.kind));
    w->put_string(s.label);
    const size_t size_at = w->size();
    w->put_u32(0);
    find_step_format(s.kind)->write(s, w);  // validated: a registered kind
    const size_t payload = w->size() - size_at - 4;
    if (payload > UINT32_MAX)
      return make_status(StatusCode::kInvalidArgument, "step '%s': %zu-byte payload exceeds 4 GiB",
                         s.label.c_str(), payload);
    w->patch_u32(size_at, static_cast<uint32_t>(payload));
  }
  return Status::ok();
}

void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

void put_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

size_t align_up(size_t v, size_t alignment) {
  return (v + alignment - 1) / alignment * alignment;
}

}  // namespace

Result<std::vector<uint8_t>> serialize_engine(const EngineDesc& desc) {
  KILN_RETURN_IF_ERROR(validate_engine(desc).with_context("serialize_engine"));

  // Every section but weights is encoded into its own buffer first; weights
  // are copied once, straight into the output.
  ByteWriter meta, tensors, io, modules, steps, named, states, derived;
  write_meta(desc, &meta);
  write_tensors(desc, &tensors);
  write_io(desc, &io);
  write_modules(desc, &modules);
  write_named_weights(desc, &named);
  write_states(desc, &states);
  write_derived_weights(desc, &derived);
  KILN_RETURN_IF_ERROR(write_steps(desc, &steps).with_context("serialize_engine"));

  struct Section {
    SectionKind kind;
    const uint8_t* data;
    size_t size;
  };
  const ByteWriter* writers[] = {&meta, &tensors, &io, &modules, &steps, &named, &states, &derived};
  Section sections[layout::kSectionCount] = {
      {SectionKind::kMeta, meta.buffer().data(), meta.size()},
      {SectionKind::kTensors, tensors.buffer().data(), tensors.size()},
      {SectionKind::kIo, io.buffer().data(), io.size()},
      {SectionKind::kModules, modules.buffer().data(), modules.size()},
      {SectionKind::kSteps, steps.buffer().data(), steps.size()},
      {SectionKind::kWeights, desc.weights.data(), desc.weights.size()},
      {SectionKind::kNamedWeights, named.buffer().data(), named.size()},
      {SectionKind::kStates, states.buffer().data(), states.size()},
      {SectionKind::kDerivedWeights, derived.buffer().data(), derived.size()},
  };
  for (const ByteWriter* w : writers)
    KILN_RETURN_IF_ERROR(w->status().with_context("serialize_engine"));

  // Place the sections.
  size_t table_end = layout::kHeaderSize + layout::kSectionCount * layout::kEntrySize;
  size_t offsets[layout::kSectionCount];
  size_t cursor = table_end;
  for (uint32_t i = 0; i < layout::kSectionCount; ++i) {
    cursor = align_up(cursor, layout::kSectionAlignment);
    offsets[i] = cursor;
    cursor += sections[i].size;
  }
  size_t total = cursor;

  // Value-initialized, so the alignment gaps are already zero.
  std::vector<uint8_t> out(total);
  uint8_t* base = out.data();
  std::memcpy(base + layout::kMagicOffset, kEngineMagic, sizeof(kEngineMagic));
  put_le32(base + layout::kVersionOffset, kEngineFormatVersion);
  put_le32(base + layout::kSectionCountOffset, layout::kSectionCount);
  put_le64(base + layout::kTotalSizeOffset, total);
  put_le32(base + layout::kFlagsOffset, 0);

  for (uint32_t i = 0; i < layout::kSectionCount; ++i) {
    const Section& s = sections[i];
    if (s.size > 0) std::memcpy(base + offsets[i], s.data, s.size);
    uint8_t* entry = base + layout::kHeaderSize + i * layout::kEntrySize;
    put_le32(entry + layout::kEntryKindOffset, static_cast<uint32_t>(s.kind));
    put_le64(entry + layout::kEntryOffsetOffset, offsets[i]);
    put_le64(entry + layout::kEntrySizeOffset, s.size);
    put_le32(entry + layout::kEntryCrcOffset, crc32c(s.data, s.size));
  }

  uint32_t header_crc = crc32c(base, layout::kHeaderCrcOffset);
  header_crc = crc32c(base + layout::kHeaderSize, table_end - layout::kHeaderSize, header_crc);
  put_le32(base + layout::kHeaderCrcOffset, header_crc);
  return out;
}

}  // namespace kiln::engine
