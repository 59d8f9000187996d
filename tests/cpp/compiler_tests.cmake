# Compiler tests: passes, kernel generation through the real NVRTC, and the
# whole pipeline down to a parsed engine.
add_executable(kiln_compiler_tests
  compiler_test_util.cpp
  memory_plan_test.cpp
  dtype_convert_test.cpp
  compiler_pipeline_test.cpp
  compiler_conv_test.cpp)
target_link_libraries(kiln_compiler_tests PRIVATE kiln_compiler GTest::gtest_main)
gtest_discover_tests(kiln_compiler_tests)
