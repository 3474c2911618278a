#include "support/dtype.h"

namespace selscan_support {

int64_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case SELSCAN_DTYPE_FLOAT16:
    case SELSCAN_DTYPE_BFLOAT16: return 2;
    case SELSCAN_DTYPE_COMPLEX64:
    case SELSCAN_DTYPE_INT64: return 8;
    case SELSCAN_DTYPE_BOOL: return 1;
    default: return 4;
  }
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case SELSCAN_DTYPE_FLOAT32: return "fp32";
    case SELSCAN_DTYPE_FLOAT16: return "fp16";
    case SELSCAN_DTYPE_BFLOAT16: return "bf16";
    case SELSCAN_DTYPE_COMPLEX64: return "c64";
    case SELSCAN_DTYPE_INT32: return "i32";
    case SELSCAN_DTYPE_INT64: return "i64";
    case SELSCAN_DTYPE_BOOL: return "bool";
    default: return "?";
  }
}

bool parse_dtype(const std::string& s, int32_t* dtype) {
  if (s == "fp32" || s == "float32" || s == "float") *dtype = SELSCAN_DTYPE_FLOAT32;
  else if (s == "fp16" || s == "float16" || s == "half") *dtype = SELSCAN_DTYPE_FLOAT16;
  else if (s == "bf16" || s == "bfloat16") *dtype = SELSCAN_DTYPE_BFLOAT16;
  else return false;
  return true;
}

}  // namespace selscan_support
