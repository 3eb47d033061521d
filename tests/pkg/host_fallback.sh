#!/bin/sh
# The device conformance runner again with OMP_TARGET_OFFLOAD=DISABLED: the host fallback of the
# same target regions must pass the same assertions (LLVM offload-test practice).
set -eu
b=${top_builddir:-.}
OMP_TARGET_OFFLOAD=DISABLED CK_FORK=no KIVI_TEST_EXPECT_GPU=0 exec "$b/tests/test_conformance${EXEEXT:-}"
