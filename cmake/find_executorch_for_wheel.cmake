# Included at project() for wheel builds (pyproject.toml). Puts the building
# Python's executorch package on CMAKE_PREFIX_PATH: scikit-build-core only
# adds its own site-packages, which misses an ExecuTorch installed in a base
# environment (venv --system-site-packages, --no-build-isolation).
set(_kiln_python "${Python_EXECUTABLE}")
if(NOT _kiln_python)
  find_program(_kiln_python NAMES python3 python REQUIRED)
endif()
execute_process(
  COMMAND "${_kiln_python}" -c "import executorch; print(list(executorch.__path__)[0])"
  OUTPUT_VARIABLE _kiln_et_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _kiln_et_result ERROR_QUIET)
if(_kiln_et_result EQUAL 0 AND _kiln_et_prefix)
  list(APPEND CMAKE_PREFIX_PATH "${_kiln_et_prefix}")
else()
  message(FATAL_ERROR "Kiln's wheel build needs executorch==1.5.1 importable by ${_kiln_python}")
endif()
