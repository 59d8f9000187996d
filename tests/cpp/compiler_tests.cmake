# Compiler tests: passes, kernel generation through the real NVRTC, and the
# whole pipeline down to a parsed engine.
add_executable(kiln_compiler_tests
  compiler_test_util.cpp
  memory_plan_test.cpp
  dtype_convert_test.cpp
  compiler_pipeline_test.cpp
  view_layout_test.cpp
  compiler_conv_test.cpp
  compiler_patchify_test.cpp
  compiler_decode_layers_test.cpp
  input_bounds_test.cpp
  nvrtc_compiler_test.cpp)
# CUDA::nvrtc: the persistent decode kernel's ptxas report (no register spills).
target_link_libraries(kiln_compiler_tests PRIVATE kiln_compiler GTest::gtest_main CUDA::nvrtc)
gtest_discover_tests(kiln_compiler_tests)

# Generated kernels run on the CPU: their CUDA source is compiled as host C++
# (through a shim header, with this build's C++ compiler) and loaded
# (host_kernel.h).
add_library(kiln_host_kernel_util STATIC host_kernel.cpp)
target_compile_definitions(kiln_host_kernel_util PRIVATE KILN_HOST_CXX="${CMAKE_CXX_COMPILER}")
target_link_libraries(kiln_host_kernel_util PUBLIC kiln_compiler GTest::gtest ${CMAKE_DL_LIBS})

# Depthwise conv kernels, thread by thread (cuda_host_shim.h).
add_executable(kiln_compiler_depthwise_tests compiler_depthwise_test.cpp compiler_test_util.cpp)
target_compile_definitions(kiln_compiler_depthwise_tests PRIVATE
  KILN_SHIM_HEADER="${CMAKE_CURRENT_SOURCE_DIR}/cuda_host_shim.h")
target_link_libraries(kiln_compiler_depthwise_tests PRIVATE kiln_host_kernel_util GTest::gtest_main)
gtest_discover_tests(kiln_compiler_depthwise_tests)

# Generated kernels run on the CPU like the depthwise tests (cuda_host_shim.h):
# resample / pad kernels; transposed and 1-D convolutions and 1-D pooling;
# gathers; pointwise kernels in their vector and scalar forms; launch groups;
# the cumsum scan.
foreach(family resample convt gather pointwise launch_group scan)
  add_executable(kiln_compiler_${family}_tests compiler_${family}_test.cpp compiler_test_util.cpp)
  target_compile_definitions(kiln_compiler_${family}_tests PRIVATE
    KILN_SHIM_HEADER="${CMAKE_CURRENT_SOURCE_DIR}/cuda_host_shim.h")
  target_link_libraries(kiln_compiler_${family}_tests PRIVATE kiln_host_kernel_util GTest::gtest_main)
  gtest_discover_tests(kiln_compiler_${family}_tests)
endforeach()
# Kernels whose threads cooperate, each block's threads as fibers
# (cuda_block_shim.h), with their planning and layout: normalization (layer,
# group, instance norm); row ops (softmax, safe softmax, RMSNorm); decode-step
# ops (argmax, the fused rotary embedding, cache update); decode attention;
# the GEMV kernel; attention writing through the heads merge after it
# (grouped-query rows).
foreach(family norm rows decode decode_attention gemv gemv_loop attention_output)
  add_executable(kiln_compiler_${family}_tests compiler_${family}_test.cpp compiler_test_util.cpp)
  target_compile_definitions(kiln_compiler_${family}_tests PRIVATE
    KILN_SHIM_HEADER="${CMAKE_CURRENT_SOURCE_DIR}/cuda_host_shim.h"
    KILN_BLOCK_SHIM_HEADER="${CMAKE_CURRENT_SOURCE_DIR}/cuda_block_shim.h")
  target_link_libraries(kiln_compiler_${family}_tests PRIVATE kiln_host_kernel_util GTest::gtest_main)
  gtest_discover_tests(kiln_compiler_${family}_tests)
endforeach()
