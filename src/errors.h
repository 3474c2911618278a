// Status + thread-local message: the only error channel below the API layer (no exceptions cross it).
#pragma once

#include <string>

#include "selscan/selscan.h"

namespace selscan {

using Status = selscan_status_t;

// Records `message` as this thread's last error and returns `status` (so callers can `return fail(...)`).
Status fail(Status status, std::string message);
// The current thread's message ("" when none).
const char* last_error_message();
void clear_last_error();

}  // namespace selscan
