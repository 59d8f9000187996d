#include "targets.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/module/module.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include "engine_format/engine_format.h"
#include "engine_format/engine_layout.h"
#include "program_check.h"  // tools/kiln_runner

namespace kiln::fuzz {
namespace et = executorch::runtime;
using executorch::extension::BufferDataLoader;
using executorch::extension::Module;

namespace {

// The fuzz inputs are a few KiB; a damaged size past this is refused the way
// kiln_runner refuses one past the machine's memory (same check).
constexpr uint64_t kPlannedMemoryLimit = 64ull << 20;

std::vector<std::vector<uint8_t>>* g_capture = nullptr;
volatile uint64_t g_sink = 0;  // keeps reads of metadata from being optimized out

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

void quiet_log(et_timestamp_t, et_pal_log_level_t, const char*, const char*, size_t, const char*,
               size_t) {}

// Stand-in for the real KilnBackend (which needs a GPU to get past its
// availability check): the delegate's first steps on the blob, no CUDA.
class StandInKilnBackend final : public et::BackendInterface {
 public:
  bool is_available() const override { return true; }

  et::Result<et::DelegateHandle*> init(et::BackendInitContext& context,
                                       et::FreeableBuffer* processed,
                                       et::ArrayRef<et::CompileSpec> specs) const override {
    if (processed == nullptr) return et::Error::InvalidProgram;
    et::Result<const void*> data = processed->data_safe();
    if (!data.ok() || *data == nullptr) return et::Error::InvalidProgram;
    const auto* bytes = static_cast<const uint8_t*>(*data);
    uint64_t sum = 0;
    for (const et::CompileSpec& spec : specs) {  // read every byte ExecuTorch hands over
      sum += std::strlen(spec.key);
      const auto* value = static_cast<const uint8_t*>(spec.value.buffer);
      for (size_t i = 0; i < spec.value.nbytes; ++i) sum += value[i];
    }
    g_sink = g_sink + sum;
    if (g_capture != nullptr) g_capture->emplace_back(bytes, bytes + processed->size());
    if (run_engine(bytes, processed->size()) != Outcome::kAccepted)
      return et::Error::InvalidProgram;
    et::MemoryAllocator* allocator = context.get_runtime_allocator();
    void* handle = allocator != nullptr ? allocator->allocate(8, 8) : nullptr;
    if (handle == nullptr) return et::Error::MemoryAllocationFailed;
    processed->Free();
    return static_cast<et::DelegateHandle*>(handle);
  }

  et::Error execute(et::BackendExecutionContext&, et::DelegateHandle*,
                    et::Span<et::EValue*>) const override {
    return et::Error::NotSupported;
  }
};

void touch_tensor_meta(const et::TensorInfo& info) {
  uint64_t sum = static_cast<uint64_t>(info.scalar_type()) + info.nbytes();
  for (int32_t d : info.sizes()) sum += static_cast<uint32_t>(d);
  for (uint8_t d : info.dim_order()) sum += d;
  g_sink = g_sink + sum;
}

// Reads everything kiln_runner (and a Module user) reads from method meta.
void touch_meta(const et::MethodMeta& meta) {
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    et::Result<et::Tag> tag = meta.input_tag(i);
    if (tag.ok() && *tag == et::Tag::Tensor) {
      et::Result<et::TensorInfo> info = meta.input_tensor_meta(i);
      if (info.ok()) touch_tensor_meta(*info);
    }
  }
  for (size_t i = 0; i < meta.num_outputs(); ++i) {
    et::Result<et::Tag> tag = meta.output_tag(i);
    if (tag.ok() && *tag == et::Tag::Tensor) {
      et::Result<et::TensorInfo> info = meta.output_tensor_meta(i);
      if (info.ok()) touch_tensor_meta(*info);
    }
  }
  for (size_t i = 0; i < meta.num_backends(); ++i) {
    et::Result<const char*> name = meta.get_backend_name(i);
    if (name.ok() && *name != nullptr) g_sink = g_sink + std::strlen(*name);
  }
  g_sink = g_sink + meta.uses_backend("KilnBackend");
  for (size_t i = 0; i < meta.num_memory_planned_buffers(); ++i) {
    et::Result<int64_t> size = meta.memory_planned_buffer_size(i);
    if (size.ok()) g_sink = g_sink + static_cast<uint64_t>(*size);
  }
}

}  // namespace

void init_targets(bool verbose) {
  static bool done = false;
  if (done) return;
  done = true;
  et::runtime_init();
  if (!verbose) et::register_pal(et::PalImpl::create(quiet_log, __FILE__));
  static StandInKilnBackend backend;
  (void)et::register_backend(et::Backend{"KilnBackend", &backend});
}

Outcome run_pte(const uint8_t* data, size_t size,
                std::vector<std::vector<uint8_t>>* captured_blobs) {
  g_capture = captured_blobs;
  Outcome outcome = Outcome::kRefused;
  // kiln_runner reads the same bytes from the file (check_delegate_tables_in_file).
  const size_t program = pte_program_size(data, size);
  if (!kiln::tools::check_delegate_tables(data, program > 0 ? program : size).empty()) {
    g_capture = nullptr;
    return outcome;
  }
  {
    Module module(std::make_unique<BufferDataLoader>(data, size));
    if (module.load(kiln::tools::kProgramVerification) == et::Error::Ok) {
      et::Result<std::unordered_set<std::string>> names = module.method_names();
      bool all_loaded = names.ok() && !names->empty();
      if (names.ok()) {
        for (const std::string& name : *names) {
          et::Result<et::MethodMeta> meta = module.method_meta(name);
          if (!meta.ok()) {
            all_loaded = false;
            continue;
          }
          touch_meta(*meta);
          if (!kiln::tools::check_planned_memory(*meta, kPlannedMemoryLimit).empty() ||
              module.load_method(name) != et::Error::Ok)
            all_loaded = false;
        }
      }
      if (all_loaded) outcome = Outcome::kAccepted;
    }
  }
  g_capture = nullptr;
  return outcome;
}

Outcome run_engine(const uint8_t* data, size_t size) {
  Result<engine::EngineDesc> desc = engine::parse_engine(data, size);
  if (!desc.is_ok()) return Outcome::kRefused;
  return engine::validate_engine(desc.value()).is_ok() ? Outcome::kAccepted : Outcome::kRefused;
}

size_t pte_program_size(const uint8_t* data, size_t size) {
  // [0,4) flatbuffer root offset, [4,8) "ET12", [8,12) "eh00", [12,16)
  // header length, [16,24) program_size.
  if (size < 24 || std::memcmp(data + 8, "eh00", 4) != 0) return 0;
  const uint64_t program_size = load_le64(data + 16);
  return program_size <= size ? static_cast<size_t>(program_size) : 0;
}

std::vector<Focus> engine_sections(const std::vector<uint8_t>& engine) {
  namespace layout = engine::layout;
  std::vector<Focus> sections;
  const size_t table_end = layout::kHeaderSize + layout::kSectionCount * layout::kEntrySize;
  if (engine.size() < table_end) return sections;
  for (uint32_t i = 0; i < layout::kSectionCount; ++i) {
    const uint8_t* e = engine.data() + layout::kHeaderSize + i * layout::kEntrySize;
    const uint64_t offset = load_le64(e + layout::kEntryOffsetOffset);
    const uint64_t size = load_le64(e + layout::kEntrySizeOffset);
    if (offset <= engine.size() && size <= engine.size() - offset && size > 0)
      sections.push_back({static_cast<size_t>(offset), static_cast<size_t>(offset + size)});
  }
  sections.push_back({0, table_end});  // the header and the section table
  return sections;
}

void reseal_engine(std::vector<uint8_t>* engine) {
  namespace layout = engine::layout;
  std::vector<uint8_t>& b = *engine;
  const size_t table_end = layout::kHeaderSize + layout::kSectionCount * layout::kEntrySize;
  if (b.size() < table_end) return;
  for (uint32_t i = 0; i < layout::kSectionCount; ++i) {
    uint8_t* e = b.data() + layout::kHeaderSize + i * layout::kEntrySize;
    const uint64_t offset = load_le64(e + layout::kEntryOffsetOffset);
    const uint64_t size = load_le64(e + layout::kEntrySizeOffset);
    if (offset <= b.size() && size <= b.size() - offset)
      put_le32(e + layout::kEntryCrcOffset,
                       engine::crc32c(b.data() + offset, static_cast<size_t>(size)));
  }
  uint32_t crc = engine::crc32c(b.data(), layout::kHeaderCrcOffset);
  crc = engine::crc32c(b.data() + layout::kHeaderSize, table_end - layout::kHeaderSize, crc);
  put_le32(b.data() + layout::kHeaderCrcOffset, crc);
}

}  // namespace kiln::fuzz
