/* Every compile-time constant of kivi_version.h has a runtime twin; they must agree. */
#include <string.h>

#include "../check_util.h"

START_TEST(header_matches_library) {
  ck_assert_str_eq(kivi_version_string(), KIVI_VERSION_STRING);
  ck_assert_int_eq(kivi_version_major(), KIVI_VERSION_MAJOR);
  ck_assert_int_eq(kivi_version_minor(), KIVI_VERSION_MINOR);
  ck_assert_int_eq(kivi_version_patch(), KIVI_VERSION_PATCH);
  ck_assert_int_eq(kivi_built_with_offload(), KIVI_BUILT_WITH_OFFLOAD);
  char v[64];
  snprintf(v, sizeof v, "%d.%d.%d", KIVI_VERSION_MAJOR, KIVI_VERSION_MINOR, KIVI_VERSION_PATCH);
  ck_assert_str_eq(v, kivi_version_string());
  ck_assert_ptr_nonnull(kivi_build_config());
  ck_assert(strstr(kivi_build_config(), KIVI_BUILT_WITH_OFFLOAD ? "nvptx" : "offload: none") != NULL);
}
END_TEST

START_TEST(status_strings) {
  const char *seen[16] = {0};
  for (int s = KIVI_OK; s <= KIVI_ERR_IO; ++s) {
    const char *t = kivi_status_string((kivi_status)s);
    ck_assert_ptr_nonnull(t);
    ck_assert_str_ne(t, "unknown status");
    for (int j = 0; j < s; ++j) ck_assert_str_ne(t, seen[j]);
    seen[s] = t;
  }
  ck_assert_str_eq(kivi_status_string((kivi_status)99), "unknown status");
}
END_TEST

int main(void) {
  Suite *s = suite_create("version");
  TCase *tc = tcase_create("version");
  tcase_add_test(tc, header_matches_library);
  tcase_add_test(tc, status_strings);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
