// kiln_runner's command line: the flags, their defaults and the exit codes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "green_context.h"

namespace kiln::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitMismatch = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitLoad = 3;
inline constexpr int kExitGreenContext = 4;


inline constexpr const char* kUsage = R"(usage: kiln_runner --model_path=PATH [flags]

Loads an ExecuTorch .pte (with Kiln delegate blobs), runs one method on host
tensors, prints its latency and checks its outputs.

  --model_path=PATH     the .pte file (required)
  --data_path=PATH      the .ptd file holding the weights of a .pte saved with
                        kiln.save(..., external_weights=PATH)
  --method=NAME         method to run (default: forward)
  --inputs=FILE         .ktensors file with the method's inputs; without it,
                        inputs are random: floats uniform in [-1, 1),
                        integers in [0, 16), bools 0/1
  --seed=N              seed for random inputs (default: from std::random_device)
  --expected=FILE       .ktensors file with reference outputs to compare with
  --save_outputs=FILE   write the outputs of the last run to a .ktensors file
  --num_runs=N          timed runs (default: 20)
  --warmup=N            untimed runs first (default: 3)
  --rtol=X              pass when ||out - ref||_2 / ||ref||_2 <= X (default by
                        dtype: 1e-5 float32, 1e-2 float16/bfloat16); integer
                        and bool outputs must match exactly; NaN/Inf never pass
  --green_context_sms=N run on a stream of a CUDA green context holding N SMs
                        (rounded to the driver's granularity; the SMs obtained
                        are printed); 0 (default): an ordinary stream
  --green_context_sweep=N1,N2,...|all
                        for each size, run warmup + num_runs executions on a
                        green context of that many SMs and print a table of
                        latency by SM count; 'all': a ladder from the device's
                        smallest partition, doubling, up to the whole device
  --device_io=true|false
                        for programs exported with inputs and outputs on the
                        GPU (kiln.save(..., backend_config=...)): inputs are
                        uploaded once, outputs are CUDA buffers given to
                        Module::set_output; execute() copies nothing to or
                        from the host
  --use_cuda_graphs=true|false
                        load option for KilnBackend: record each engine's
                        launches once and replay them as a CUDA graph (wins
                        over the engine's metadata and the process default)
  --cuda_events=true|false
                        time each execute() with CUDA events recorded on the
                        stream the Kiln delegate runs on (its caller stream,
                        else cudaStreamPerThread), waiting for the second
                        event before the next run (default false: wall time)
  --timing_json=PATH    also write the timing as JSON: median/p10/p90/mean/
                        min/max ms of the timed runs, load time, GPU memory
                        in use before loading and after the warm-up
                        (cudaMemGetInfo), KilnBackend's counters
  --help                show this text

exit codes: 0 ok, 1 output mismatch, 2 usage or bad input file,
            3 the model could not be loaded or run,
            4 a green context could not be created (the message says why)
)";

struct Options {
  std::string model_path;
  std::string data_path;  // .ptd with the program's external named data; "" = none
  std::string method = "forward";
  std::string inputs;
  std::string expected;
  std::string save_outputs;
  long num_runs = 20;
  long warmup = 3;
  double rtol = -1.0;  // < 0: by dtype
  bool has_seed = false;
  uint64_t seed = 0;
  bool help = false;
  std::string use_cuda_graphs;  // "", "true" or "false" (--use_cuda_graphs)
  bool device_io = false;       // --device_io: inputs and outputs in CUDA memory
  bool cuda_events = false;     // --cuda_events: CUDA-event timing
  std::string timing_json;      // --timing_json: "" = none
  long green_context_sms = 0;                  // 0: ordinary stream
  std::string green_context_sweep;             // the flag's text; "" = no sweep
  std::vector<unsigned> green_context_sweep_sms;  // sizes; "all" resolved in main
  kiln::tools::GreenContext* green_context = nullptr;  // set by run_green_context_modes
};

// Prints `message` and the usage text; returns kExitUsage.
int usage_error(const std::string& message);

// Parses a whole number >= min_value; false when `text` is not one.
bool parse_long(const std::string& text, long min_value, long* out);

// Fills `options` from argv; an empty string on success, else the problem.
std::string parse_flags(int argc, char** argv, Options* options);

}  // namespace kiln::tools
