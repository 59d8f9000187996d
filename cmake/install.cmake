# Kiln's run side as users get it, in one relocatable layout used three ways:
#
#   <prefix>/lib/libexecutorch_backend_kiln.so, libkiln_caller_stream.so
#   <prefix>/lib/cmake/executorch_backend_kiln/  (find_package config)
#   <prefix>/include/kiln/caller_stream.h
#
# 1. `cmake --install build --prefix P`: the CMake package at P.
# 2. The wheel (scikit-build-core, SKBUILD set): P = the Python package
#    kiln_executorch_runtime/, plus the compiler extension in kiln/.
# 3. Every build (except a cross build) mirrors the layout into
#    python/kiln_executorch_runtime/ (git-ignored) so PYTHONPATH=python imports
#    a working runtime package, as the compiler extension lands in python/kiln/.
if(NOT TARGET executorch_backend_kiln OR NOT TARGET kiln_caller_stream)
  return()
endif()
include(CMakePackageConfigHelpers)

if(SKBUILD)
  set(_kiln_prefix kiln_executorch_runtime/)
else()
  set(_kiln_prefix "")
endif()
set(_kiln_libdir ${_kiln_prefix}lib)
set(_kiln_incdir ${_kiln_prefix}include)
set(_kiln_cmakedir ${_kiln_libdir}/cmake/executorch_backend_kiln)
set(_kiln_gen ${PROJECT_BINARY_DIR}/kiln_executorch_runtime)

# ---- generated files ----------------------------------------------------
configure_file(${CMAKE_CURRENT_LIST_DIR}/_build_info.py.in ${_kiln_gen}/_build_info.py @ONLY)
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/executorch_backend_kiln-config.cmake.in
  ${_kiln_gen}/executorch_backend_kiln-config.cmake
  INSTALL_DESTINATION ${_kiln_cmakedir}
  PATH_VARS _kiln_libdir _kiln_incdir)
# Kiln is 0.x: a minor version may change the engine format.
write_basic_package_version_file(
  ${_kiln_gen}/executorch_backend_kiln-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)

# ---- install ----------------------------------------------------------------
# The installed delegate finds libexecutorch.so without LD_LIBRARY_PATH:
# first beside itself, then where the wheel layout puts ExecuTorch
# (site-packages/executorch/lib), then the ExecuTorch and CUDA it was built
# with. Inside Python the already loaded libexecutorch.so is reused by soname.
# cuDNN likewise: the pip package's place beside the wheel
# (site-packages/nvidia/cudnn/lib), then the cuDNN it was built with.
file(REAL_PATH "${EXECUTORCH_RUNTIME_LIBRARY_DIR}" _kiln_et_libdir)
set(_kiln_install_rpath
  "$ORIGIN"
  "$ORIGIN/../../executorch/lib"
  "$ORIGIN/../../nvidia/cudnn/lib"
  "${_kiln_et_libdir}"
  "${CUDAToolkit_LIBRARY_DIR}"
  "${KILN_CUDNN_LIBRARY_DIR}")
set_target_properties(executorch_backend_kiln kiln_caller_stream PROPERTIES
  INSTALL_RPATH "${_kiln_install_rpath}")

install(TARGETS executorch_backend_kiln kiln_caller_stream
  LIBRARY DESTINATION ${_kiln_libdir} COMPONENT kiln_runtime)
# libkiln_c_api.so (src/c_api) and its C header. In the wheel it goes to the
# torch-free Python package kiln_runtime/lib/ (beside it: the delegate in
# ../../kiln_executorch_runtime/lib, ExecuTorch in ../../executorch/lib); in a
# CMake install, beside the delegate.
if(TARGET kiln_c_api)
  if(SKBUILD)
    set(_kiln_c_api_dir kiln_runtime/lib)
  else()
    set(_kiln_c_api_dir ${_kiln_libdir})
  endif()
  set_target_properties(kiln_c_api PROPERTIES INSTALL_RPATH
    "$ORIGIN;$ORIGIN/../../kiln_executorch_runtime/lib;${_kiln_install_rpath}")
  install(TARGETS kiln_c_api LIBRARY DESTINATION ${_kiln_c_api_dir} COMPONENT kiln_runtime)
  install(FILES ${PROJECT_SOURCE_DIR}/src/c_api/include/kiln/c_api.h
    DESTINATION ${_kiln_incdir}/kiln COMPONENT kiln_runtime)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/src/caller_stream/include/kiln/caller_stream.h
  DESTINATION ${_kiln_incdir}/kiln COMPONENT kiln_runtime)
install(FILES
  ${_kiln_gen}/executorch_backend_kiln-config.cmake
  ${_kiln_gen}/executorch_backend_kiln-config-version.cmake
  DESTINATION ${_kiln_cmakedir} COMPONENT kiln_runtime)
if(SKBUILD)
  # The wheel: Python sources from the tree, binaries from this build.
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/kiln/ DESTINATION kiln
    COMPONENT kiln_compiler FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/kiln_executorch_runtime/ DESTINATION kiln_executorch_runtime
    COMPONENT kiln_runtime FILES_MATCHING PATTERN "*.py"
    PATTERN "_build_info.py" EXCLUDE PATTERN "__pycache__" EXCLUDE PATTERN "lib" EXCLUDE
    PATTERN "include" EXCLUDE)
  install(FILES ${_kiln_gen}/_build_info.py DESTINATION kiln_executorch_runtime
    COMPONENT kiln_runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/kiln_runtime/ DESTINATION kiln_runtime
    COMPONENT kiln_runtime FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE PATTERN "lib" EXCLUDE)
  if(TARGET _kiln_compiler)
    set_target_properties(_kiln_compiler PROPERTIES INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
    install(TARGETS _kiln_compiler LIBRARY DESTINATION kiln COMPONENT kiln_compiler)
  endif()
  return()  # no copies into the source tree while building a wheel
endif()

# ---- in-tree mirror: python/kiln_executorch_runtime/ -------------------------
# Not for a cross build (build-aarch64/): its libraries would replace the host
# ones that `PYTHONPATH=python` imports.
if(CMAKE_CROSSCOMPILING)
  return()
endif()
set(_kiln_pkg ${PROJECT_SOURCE_DIR}/python/kiln_executorch_runtime)
set(_kiln_stamp ${_kiln_gen}/mirror.stamp)
add_custom_command(
  OUTPUT ${_kiln_stamp}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_kiln_pkg}/lib/cmake/executorch_backend_kiln
          ${_kiln_pkg}/include/kiln
  COMMAND ${CMAKE_COMMAND} -E copy_if_different $<TARGET_FILE:executorch_backend_kiln>
          $<TARGET_FILE:kiln_caller_stream> ${_kiln_pkg}/lib/
  COMMAND ${CMAKE_COMMAND} -E copy_if_different
          ${_kiln_gen}/executorch_backend_kiln-config.cmake
          ${_kiln_gen}/executorch_backend_kiln-config-version.cmake
          ${_kiln_pkg}/lib/cmake/executorch_backend_kiln/
  COMMAND ${CMAKE_COMMAND} -E copy_if_different
          ${PROJECT_SOURCE_DIR}/src/caller_stream/include/kiln/caller_stream.h
          ${_kiln_pkg}/include/kiln/
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${_kiln_gen}/_build_info.py ${_kiln_pkg}/
  COMMAND ${CMAKE_COMMAND} -E touch ${_kiln_stamp}
  DEPENDS executorch_backend_kiln kiln_caller_stream
          ${_kiln_gen}/_build_info.py
          ${_kiln_gen}/executorch_backend_kiln-config.cmake
          ${_kiln_gen}/executorch_backend_kiln-config-version.cmake
          ${PROJECT_SOURCE_DIR}/src/caller_stream/include/kiln/caller_stream.h
  COMMENT "Mirroring the Kiln runtime into python/kiln_executorch_runtime/"
  VERBATIM)
add_custom_target(kiln_python_runtime ALL DEPENDS ${_kiln_stamp})
