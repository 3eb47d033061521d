#include "internal.h"

const char *kivi_version_string(void) { return PACKAGE_VERSION; }
int kivi_version_major(void) { return KIVI_BUILD_VERSION_MAJOR; }
int kivi_version_minor(void) { return KIVI_BUILD_VERSION_MINOR; }
int kivi_version_patch(void) { return KIVI_BUILD_VERSION_PATCH; }
int kivi_built_with_offload(void) { return KIVI_HAVE_OFFLOAD; }
const char *kivi_build_config(void) { return KIVI_BUILD_CONFIG; }
