// The delegate's checks of its arguments (kiln_backend.cpp's execute()):
// each ExecuTorch tensor against the engine's input or output (dtype, shape,
// device, contiguity, device memory for device-resident I/O) and, for a
// dynamic partition, the shape variant its dims select. Refusals return
// InvalidArgument/NotSupported with one ET_LOG line naming the argument,
// expected vs got; nothing here allocates (execute() must not).
#pragma once

#include <cstddef>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/span.h>

#include "engine_format/engine_desc.h"
#include "engine_format/variant_set.h"
#include "runtime/execution_context.h"

namespace kiln::delegate {

// The engine dtype of an ExecuTorch scalar type; false for one Kiln has no
// engine dtype for.
bool to_engine_dtype(executorch::aten::ScalarType type, engine::DType* out);

// "float32 [8, 512]" for an engine tensor, into a fixed buffer.
void describe(char* buffer, size_t capacity, const engine::TensorDesc& t);

// Checks delegate argument `value` against the engine's input/output `index`
// (`what`: "input" or "output"): a tensor of the engine's dtype and shape,
// contiguous, on the host or on CUDA device `engine_device`.
executorch::runtime::Error check_tensor(const executorch::runtime::EValue* value, const engine::TensorDesc& want,
                                        const char* what, size_t index, int engine_device);

// Fills `io` from a checked tensor. A CUDA-tagged tensor (a program exported
// for device-resident I/O) must hold device memory: host memory there is
// refused rather than staged, so the mistake (and its hidden copies) shows.
executorch::runtime::Error describe_io(const executorch::aten::Tensor& t, bool is_input, size_t index,
                                       int engine_device, runtime::IoBuffer* io);

// The shape variant of `shapes` whose sizes equal the inputs' dims; a size
// outside its dim's range, or one no variant was compiled for, is refused
// naming the input, the dim and what the program takes.
executorch::runtime::Error pick_variant(const engine::VariantSetDesc& shapes,
                                        executorch::runtime::Span<executorch::runtime::EValue*> args, size_t* pick);

}  // namespace kiln::delegate
