# Finds cuDNN 9 (header cudnn.h, library libcudnn.so or libcudnn.so.9) and
# defines the imported target kiln::cudnn plus KILN_CUDNN_INCLUDE_DIR,
# KILN_CUDNN_LIBRARY, KILN_CUDNN_LIBRARY_DIR and KILN_CUDNN_VERSION.
#
# Looked for, in order: -DCUDNN_ROOT=..., $CUDNN_ROOT, the CUDA toolkit's
# directories, /usr/local/cuda, /usr/local, /usr (incl. Debian's multiarch
# dirs), then the Python package nvidia-cudnn-cu13/-cu12 (the only cuDNN on
# machines that got it with PyTorch: <site-packages>/nvidia/cudnn/{include,lib},
# which holds libcudnn.so.9 but no libcudnn.so).
if(TARGET kiln::cudnn)
  return()
endif()

set(_kiln_cudnn_hints "")
if(CUDNN_ROOT)
  list(APPEND _kiln_cudnn_hints "${CUDNN_ROOT}")
endif()
if(DEFINED ENV{CUDNN_ROOT})
  list(APPEND _kiln_cudnn_hints "$ENV{CUDNN_ROOT}")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    get_filename_component(_parent "${_dir}" DIRECTORY)
    list(APPEND _kiln_cudnn_hints "${_parent}")
  endforeach()
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _kiln_cudnn_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
list(APPEND _kiln_cudnn_hints /usr/local/cuda /usr/local /usr)

# The pip package, located through whichever Python is about.
set(_kiln_cudnn_python "${Python_EXECUTABLE}")
if(NOT _kiln_cudnn_python)
  find_program(_kiln_cudnn_python NAMES python3 python)
endif()
if(_kiln_cudnn_python)
  execute_process(
    COMMAND "${_kiln_cudnn_python}" -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _kiln_cudnn_pip OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _kiln_cudnn_pip_result ERROR_QUIET)
  if(_kiln_cudnn_pip_result EQUAL 0 AND EXISTS "${_kiln_cudnn_pip}")
    list(APPEND _kiln_cudnn_hints "${_kiln_cudnn_pip}")
  endif()
endif()

find_path(KILN_CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_kiln_cudnn_hints}
  PATH_SUFFIXES include include/x86_64-linux-gnu include/aarch64-linux-gnu
  NO_DEFAULT_PATH)
find_library(KILN_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
  HINTS ${_kiln_cudnn_hints}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu targets/x86_64-linux/lib
                targets/sbsa-linux/lib
  NO_DEFAULT_PATH)

if(NOT KILN_CUDNN_INCLUDE_DIR OR NOT KILN_CUDNN_LIBRARY)
  message(FATAL_ERROR
    "Kiln's runtime needs cuDNN 9 (cudnn.h and libcudnn.so / libcudnn.so.9), not found in: "
    "${_kiln_cudnn_hints}.\n"
    "Install it (apt install cudnn9-cuda-13, or pip install nvidia-cudnn-cu13) and/or "
    "configure with -DCUDNN_ROOT=<dir with include/ and lib/> (or set CUDNN_ROOT), "
    "or build without the runtime: -DKILN_BUILD_RUNTIME=OFF.\n"
    "(found header: '${KILN_CUDNN_INCLUDE_DIR}', library: '${KILN_CUDNN_LIBRARY}')")
endif()

set(_kiln_cudnn_version_header "${KILN_CUDNN_INCLUDE_DIR}/cudnn_version.h")
if(NOT EXISTS "${_kiln_cudnn_version_header}")
  set(_kiln_cudnn_version_header "${KILN_CUDNN_INCLUDE_DIR}/cudnn.h")
endif()
file(STRINGS "${_kiln_cudnn_version_header}" _kiln_cudnn_defines
  REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
foreach(_part MAJOR MINOR PATCHLEVEL)
  string(REGEX MATCH "CUDNN_${_part} +([0-9]+)" _match "${_kiln_cudnn_defines}")
  set(_kiln_cudnn_${_part} "${CMAKE_MATCH_1}")
endforeach()
set(KILN_CUDNN_VERSION "${_kiln_cudnn_MAJOR}.${_kiln_cudnn_MINOR}.${_kiln_cudnn_PATCHLEVEL}")
if(NOT _kiln_cudnn_MAJOR EQUAL 9)
  message(FATAL_ERROR "Kiln needs cuDNN 9; ${KILN_CUDNN_INCLUDE_DIR} has cuDNN ${KILN_CUDNN_VERSION}. "
                      "Point -DCUDNN_ROOT at a cuDNN 9 installation.")
endif()

get_filename_component(KILN_CUDNN_LIBRARY_DIR "${KILN_CUDNN_LIBRARY}" DIRECTORY)
file(REAL_PATH "${KILN_CUDNN_LIBRARY_DIR}" KILN_CUDNN_LIBRARY_DIR)
message(STATUS "cuDNN ${KILN_CUDNN_VERSION}: ${KILN_CUDNN_LIBRARY} (headers ${KILN_CUDNN_INCLUDE_DIR})")

add_library(kiln::cudnn UNKNOWN IMPORTED)
set_target_properties(kiln::cudnn PROPERTIES
  IMPORTED_LOCATION "${KILN_CUDNN_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${KILN_CUDNN_INCLUDE_DIR}")
