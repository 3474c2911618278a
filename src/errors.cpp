#include "errors.h"

#include <utility>

namespace selscan {
namespace {
// One message per thread: errors stay with the thread that caused them.
thread_local std::string t_last_error;
}  // namespace

Status fail(Status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

const char* last_error_message() { return t_last_error.c_str(); }

void clear_last_error() { t_last_error.clear(); }

}  // namespace selscan
