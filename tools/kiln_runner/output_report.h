// The end of a kiln_runner run: a method's outputs copied to host, saved
// (--save_outputs), summarized, or compared with --expected under one
// tolerance rule, which the green-context sweep's check shares.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <executorch/runtime/core/evalue.h>

#include "engine_format/engine_desc.h"
#include "runner_flags.h"
#include "tensor_file.h"

namespace kiln::tools {

// An EValue tag's name ("Tensor", "Int", ...).
std::string tag_name(executorch::runtime::Tag tag);

// Output `i` copied to host (from host or CUDA memory); false, after printing
// why, when it is not a tensor of a dtype the runner handles or cannot be read.
bool collect_output(size_t i, const executorch::runtime::EValue& value, HostTensor* out);

// The norm-relative tolerance an output of `dtype` is held to: --rtol for a
// floating dtype when given, else the dtype's default (0 for exact dtypes).
double output_rtol(const Options& options, engine::DType dtype);

// Whether every output matches `expected` (dtype, shape, finite, within
// output_rtol); prints nothing but collect_output's reasons.
bool outputs_match(const Options& options, const std::vector<executorch::runtime::EValue>& outputs,
                   const std::vector<HostTensor>& expected);

// --save_outputs, then a line an output: its summary when `expected` is empty
// (no --expected), else its comparison, and PASS or FAIL. Returns kExitOk,
// kExitMismatch, or kExitUsage when the outputs cannot be saved.
int report_outputs(const Options& options, const std::vector<executorch::runtime::EValue>& outputs,
                   const std::vector<HostTensor>& expected);

}  // namespace kiln::tools
