# Run-side tests that need no GPU: the delegate's option parsing, and
# KilnBackend::set_option/get_option through ExecuTorch's registry (the
# delegate library loads and registers without a GPU).
find_package(Threads REQUIRED)
add_executable(kiln_backend_options_tests backend_options_test.cpp)
target_link_libraries(kiln_backend_options_tests PRIVATE
  kiln_backend_options kiln::backend executorch::runtime GTest::gtest_main)
gtest_discover_tests(kiln_backend_options_tests)

# GPU test program for the runtime features (graphs, caller streams, shared
# engines, shared scratch); run on the GPU machine by
# tests/gpu/runtime_features_test.py, not by ctest.
if(TARGET kiln_runner)
  set(_runner_dir ${PROJECT_SOURCE_DIR}/tools/kiln_runner)
  add_executable(kiln_runtime_features_test
    ${PROJECT_SOURCE_DIR}/tests/gpu/runtime_features_test.cpp
    ${_runner_dir}/tensor_math.cpp)
  target_include_directories(kiln_runtime_features_test PRIVATE ${_runner_dir})
  target_link_libraries(kiln_runtime_features_test PRIVATE kiln_runner_support
    kiln::backend kiln_caller_stream kiln_runtime executorch::runtime
    executorch::kernels_optimized Threads::Threads)

  # Several methods in one .pte, weights stored and uploaded once; run on the
  # GPU machine by tests/gpu/multi_method_test.py, not by ctest.
  add_executable(kiln_multi_method_test
    ${PROJECT_SOURCE_DIR}/tests/gpu/multi_method_test.cpp
    ${_runner_dir}/tensor_math.cpp)
  target_include_directories(kiln_multi_method_test PRIVATE ${_runner_dir})
  target_link_libraries(kiln_multi_method_test PRIVATE kiln_runner_support
    kiln::backend kiln_runtime executorch::runtime executorch::kernels_optimized)

  # Engine-owned mutable state (a KV cache updated in place); run on the GPU
  # machine by scripts/gpu_check.sh, not by ctest.
  add_executable(kiln_state_test
    ${PROJECT_SOURCE_DIR}/tests/gpu/state_test.cpp
    ${_runner_dir}/tensor_math.cpp)
  target_include_directories(kiln_state_test PRIVATE ${_runner_dir})
  target_link_libraries(kiln_state_test PRIVATE kiln_runner_support
    kiln::backend kiln_runtime executorch::runtime executorch::kernels_optimized)

  # Issue 13's GPU reliability tests (bad inputs through Module, 8 threads x 10,000
  # runs, alternating caller streams, load/run/destroy cycles, out of memory, SM
  # mismatch), on the files of tests/gpu/export_reliability_tests.py; run by
  # scripts/gpu_reliability_tests.sh, not by ctest. Prints SKIP without a GPU.
  add_executable(kiln_reliability_test
    ${PROJECT_SOURCE_DIR}/tests/gpu/reliability_test.cpp
    ${_runner_dir}/tensor_math.cpp)
  target_include_directories(kiln_reliability_test PRIVATE ${_runner_dir})
  target_link_libraries(kiln_reliability_test PRIVATE kiln_runner_support
    kiln::backend kiln_caller_stream kiln_runtime executorch::runtime
    executorch::kernels_optimized Threads::Threads)
endif()

# The shared-engine cache's hash and failure path (no GPU needed).
add_executable(kiln_engine_cache_tests engine_cache_test.cpp)
target_link_libraries(kiln_engine_cache_tests PRIVATE kiln_runtime GTest::gtest_main)
gtest_discover_tests(kiln_engine_cache_tests)

# Engine format v2: conv steps and batched GEMMs (no GPU needed).
add_executable(kiln_engine_format_conv_tests engine_format_conv_test.cpp)
target_link_libraries(kiln_engine_format_conv_tests PRIVATE kiln_engine_format GTest::gtest_main)
gtest_discover_tests(kiln_engine_format_conv_tests)

# Conv algorithm cache key/file format (no GPU), plus conv and batched-GEMM
# engines against CPU references (skipped, with the reason, without a GPU).
add_executable(kiln_runtime_conv_tests runtime_conv_test.cpp)
target_link_libraries(kiln_runtime_conv_tests PRIVATE kiln_runtime GTest::gtest_main)
gtest_discover_tests(kiln_runtime_conv_tests)

# GEMM autotuning: key, cache line format and the shared conv+GEMM cache file,
# the KILN_GEMM_AUTOTUNE switch, the runtime log hook (no GPU); autotuned
# engines and load time (skipped, with the reason, without a GPU).
add_executable(kiln_runtime_gemm_autotune_tests runtime_gemm_autotune_test.cpp)
target_link_libraries(kiln_runtime_gemm_autotune_tests PRIVATE kiln_runtime GTest::gtest_main)
gtest_discover_tests(kiln_runtime_gemm_autotune_tests)

# Named weights: upload once per (device, key, content), share, verify (no GPU needed).
add_executable(kiln_named_weight_cache_tests named_weight_cache_test.cpp)
target_link_libraries(kiln_named_weight_cache_tests PRIVATE kiln_runtime Threads::Threads GTest::gtest_main)
gtest_discover_tests(kiln_named_weight_cache_tests)

# Which code of a kernel module a GPU runs: cubin, same-major cubin, PTX or a
# refusal (no GPU needed).
add_executable(kiln_kernel_code_choice_tests kernel_code_choice_test.cpp)
target_link_libraries(kiln_kernel_code_choice_tests PRIVATE kiln_runtime GTest::gtest_main)
gtest_discover_tests(kiln_kernel_code_choice_tests)

# Engine format v6 on the GPU: derived weights made at load (inline and named
# sources) and persistent kernel steps (co-resident grid, clusters, refusal);
# the test kernels compile with NVRTC everywhere, the rest is skipped, with the
# reason, without a GPU.
if(TARGET kiln_codegen)
  # The runner's green contexts (driver entry points through cudart): a persistent step on a
  # stream with too few SMs.
  add_executable(kiln_runtime_derived_weight_tests runtime_derived_weight_test.cpp
    ${PROJECT_SOURCE_DIR}/tools/kiln_runner/green_context.cpp)
  target_include_directories(kiln_runtime_derived_weight_tests PRIVATE ${PROJECT_SOURCE_DIR}/tools/kiln_runner)
  target_link_libraries(kiln_runtime_derived_weight_tests PRIVATE kiln_runtime kiln_codegen GTest::gtest_main CUDA::cudart)
  # RUN_SERIAL: a persistent-grid test fills every SM with blocks that wait on each other; run
  # beside other GPU tests it slowed the GEMM autotune test's load past its budget (H100,
  # seventh session), and two at once could each hold part of the GPU and wait forever.
  gtest_discover_tests(kiln_runtime_derived_weight_tests PROPERTIES RUN_SERIAL TRUE)
endif()
