#include "internal.h"

const char *kivi_status_string(kivi_status status) {
  switch (status) {
  case KIVI_OK: return "success";
  case KIVI_ERR_ARG: return "invalid argument";
  case KIVI_ERR_UNSUPPORTED: return "unsupported configuration";
  case KIVI_ERR_NO_DEVICE: return "requested device is not available";
  case KIVI_ERR_NOMEM: return "out of memory";
  case KIVI_ERR_CAPACITY: return "cache capacity exhausted";
  case KIVI_ERR_NONFINITE: return "non-finite or out-of-fp16-range input";
  case KIVI_ERR_DEVICE: return "offload runtime failure";
  case KIVI_ERR_BUFFER: return "output buffer too small";
  case KIVI_ERR_FORMAT: return "truncated, corrupted or unknown checkpoint format";
  case KIVI_ERR_MISMATCH: return "checkpoint geometry differs from the cache";
  case KIVI_ERR_IO: return "file input/output error";
  }
  return "unknown status";
}
