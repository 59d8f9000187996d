// Step kinds, format side: every kind of engine step (GEMM, generated kernel,
// conv, ...) registers ONE StepFormat here, keyed by its stable on-disk
// StepKind id. The writer, reader, validator, `kiln inspect` and the step
// profiler go through it, so none of them switches on the kind. The run side
// registers the same kind's loader and executor separately
// (runtime/step_runtime.h), because this library has no CUDA.
//
// A kind's format code lives in src/engine_format/steps/<kind>_step_format.cpp
// and is listed once in step_format_registry.cpp. See src/engine_format/README.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::engine {

class ByteReader;
class ByteWriter;

// What a step validator sees. Before it runs, validate_engine has checked
// every tensor (shape, element count, byte range inside the arena/weights,
// io binding) and every module, so numel() is exact; the step's own fields
// (tensor indices included) are the validator's to check. Messages start
// with label(), e.g. "step 3 (gemm 'addmm')".
class StepCheck {
 public:
  StepCheck(const EngineDesc& desc, const std::vector<int64_t>& numel, uint32_t index,
            std::string label)
      : desc_(desc), numel_(numel), index_(index), label_(std::move(label)) {}

  const EngineDesc& desc() const { return desc_; }
  const Step& step() const { return desc_.steps[index_]; }
  uint32_t index() const { return index_; }
  const std::string& label() const { return label_; }
  // Element count of tensor `t` (t < desc().tensors.size()).
  int64_t numel(uint32_t t) const { return numel_[t]; }
  // "tensor 3 'x'".
  std::string tensor_label(uint32_t t) const;

  // `index` names a tensor; `role` (e.g. "gemm a") names it in the message.
  Status tensor_ref(const char* role, uint32_t index) const;
  // numel(tensor) == rows * cols, and the rows fall on the tensor's own
  // dim boundaries (row_boundary). A matrix operand is the tensor's bytes read
  // row-major with leading dimension `cols`; the recorded shape is the
  // storage root's, which a view may reshape ([1, c, 1, 1] read as [1, c]).
  Status matrix(const char* role, uint32_t index, int64_t rows, int64_t cols) const;
  // Some trailing dims of the tensor's shape multiply to `cols` (a row of
  // the matrix is a whole sub-tensor), which catches an operand read with the
  // wrong orientation or layout.
  Status row_boundary(const char* role, uint32_t index, int64_t cols) const;
  // `batch` rows x cols matrices `stride` elements apart (0 broadcasts one),
  // every one inside the tensor; batch == 1 is matrix().
  Status batched_matrix(const char* role, uint32_t index, int64_t rows, int64_t cols,
                        int64_t batch, int64_t stride) const;

 private:
  const EngineDesc& desc_;
  const std::vector<int64_t>& numel_;
  uint32_t index_;
  std::string label_;
};

// Receives a step's fields for `kiln inspect` (python_bindings/inspect.cpp
// turns them into a dict), so the description of each kind is written once,
// by the kind, with no Python types here.
class StepFieldSink {
 public:
  virtual ~StepFieldSink() = default;
  virtual void text(const char* key, const std::string& value) = 0;
  virtual void integer(const char* key, int64_t value) = 0;
  virtual void real(const char* key, double value) = 0;
  virtual void flag(const char* key, bool value) = 0;
  virtual void tensor(const char* key, uint32_t index) = 0;  // kNoTensor: none
  virtual void integers(const char* key, const std::vector<int64_t>& values) = 0;
  // A list of records under `key`: begin_record() starts each record (the
  // fields that follow go into it), end_list() closes the list.
  virtual void begin_list(const char* key) = 0;
  virtual void begin_record() = 0;
  virtual void end_list() = 0;
};

// One step kind's format: static data, registered once (step_format_registry.cpp).
// The payload is what follows the common step header (u8 kind, str label,
// u32 payload size) in the steps section.
struct StepFormat {
  StepKind kind;
  const char* name;  // "gemm": messages, inspect's "kind"
  // Appends the payload. Only called on a validated desc.
  void (*write)(const Step& step, ByteWriter* w);
  // Reads the payload into `step` (kind and label already set). `r` covers
  // exactly the payload; reading past it fails, leftover bytes are refused
  // by the caller. `index` is the step number for messages.
  Status (*read)(ByteReader& r, uint32_t index, Step* step);
  // Every rule the runtime relies on for this kind: indices, dtypes, and the
  // meaning checks (every element count, extent, stride and launch size
  // proven inside the tensors it touches). kInvalidArgument naming the step
  // and field.
  Status (*validate)(const StepCheck& check);
  // inspect's fields for the step (after "label" and "kind").
  void (*describe)(const Step& step, StepFieldSink& sink);
  // One line for logs and the step profiler, e.g. "gemm m=8 n=32 k=64 batch=1".
  std::string (*summary)(const EngineDesc& desc, const Step& step);
};

// The registered kind with on-disk id `kind`; nullptr when there is none.
const StepFormat* find_step_format(uint8_t kind);
inline const StepFormat* find_step_format(StepKind kind) {
  return find_step_format(static_cast<uint8_t>(kind));
}
// Every registered kind, in id order.
const std::vector<const StepFormat*>& step_formats();

}  // namespace kiln::engine
