#include "kiln/caller_stream.h"

namespace kiln {
namespace {

// Per thread, so a guard on one thread never redirects another thread's work.
thread_local cudaStream_t t_stream = nullptr;
thread_local bool t_set = false;

}  // namespace

CallerStreamGuard::CallerStreamGuard(cudaStream_t stream) : previous_(t_stream), previous_set_(t_set) {
  t_stream = stream;
  t_set = true;
}

CallerStreamGuard::~CallerStreamGuard() {
  t_stream = previous_;
  t_set = previous_set_;
}

cudaStream_t current_caller_stream(bool* is_set) {
  if (is_set) *is_set = t_set;
  return t_stream;
}

}  // namespace kiln
