/* Device choice and device memory: truthful reporting, explicit devices, no silent fallback. */
#include "../check_util.h"

START_TEST(default_context_reports_truthfully) {
  kivi_context *ctx = tu_context();
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  int ran_on_gpu = -1;
  ck_assert_int_eq(kivi_context_selftest(ctx, &ran_on_gpu), KIVI_OK);
  ck_assert_int_eq(ran_on_gpu, info.on_gpu);
  if (!kivi_built_with_offload()) ck_assert_int_eq(info.on_gpu, 0);
  if (info.num_devices == 0) ck_assert_int_eq(info.on_gpu, 0);
  printf("context: device %d, on_gpu %d, %d device(s)\n", info.device, info.on_gpu, info.num_devices);
  kivi_context_destroy(ctx);
}
END_TEST

START_TEST(host_context_stays_on_host) {
  kivi_context *ctx = NULL;
  ck_assert_int_eq(kivi_context_create(&ctx, KIVI_DEVICE_HOST), KIVI_OK);
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  ck_assert_int_eq(info.on_gpu, 0);
  int ran_on_gpu = -1;
  ck_assert_int_eq(kivi_context_selftest(ctx, &ran_on_gpu), KIVI_OK);
  ck_assert_int_eq(ran_on_gpu, 0);
  kivi_context_destroy(ctx);
}
END_TEST

START_TEST(explicit_devices) {
  kivi_context *ctx = tu_context();
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  kivi_context_destroy(ctx);
  kivi_context *c2 = (kivi_context *)0x1;
  /* a device that does not exist is an error, never a quiet run on the host */
  ck_assert_int_eq(kivi_context_create(&c2, info.num_devices), KIVI_ERR_NO_DEVICE);
  ck_assert_ptr_null(c2);
  ck_assert_int_eq(kivi_context_create(&c2, 1000), KIVI_ERR_NO_DEVICE);
  ck_assert_int_eq(kivi_context_create(&c2, -3), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_context_create(NULL, KIVI_DEVICE_HOST), KIVI_ERR_ARG);
  for (int d = 0; d < info.num_devices; ++d) {
    ck_assert_int_eq(kivi_context_create(&c2, d), KIVI_OK);
    kivi_context_info i2;
    ck_assert_int_eq(kivi_context_get_info(c2, &i2), KIVI_OK);
    ck_assert_int_eq(i2.device, d);
    ck_assert_int_eq(i2.on_gpu, 1);
    kivi_context_destroy(c2);
  }
  kivi_context_destroy(NULL);
  ck_assert_int_eq(kivi_context_get_info(NULL, &info), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_context_selftest(NULL, NULL), KIVI_ERR_ARG);
}
END_TEST

START_TEST(device_memory_round_trip) {
  kivi_context *ctx = tu_context();
  enum { N = 4096 };
  float src[N], back[N];
  for (int i = 0; i < N; ++i) src[i] = (float)i * 0.25f - 7.0f;
  void *d = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, 0, &d), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_context_alloc(ctx, sizeof src, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_context_alloc(ctx, sizeof src, &d), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, d, src, sizeof src), KIVI_OK);
  memset(back, 0, sizeof back);
  ck_assert_int_eq(kivi_context_download(ctx, back, d, sizeof back), KIVI_OK);
  ck_assert_int_eq(memcmp(src, back, sizeof src), 0);
  ck_assert_int_eq(kivi_context_upload(ctx, NULL, src, 4), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_context_download(ctx, back, NULL, 4), KIVI_ERR_ARG);
  kivi_context_free(ctx, d);
  kivi_context_free(ctx, NULL);
  kivi_context_destroy(ctx);
}
END_TEST

int main(void) {
  Suite *s = suite_create("context");
  TCase *tc = tcase_create("context");
  tcase_add_test(tc, default_context_reports_truthfully);
  tcase_add_test(tc, host_context_stays_on_host);
  tcase_add_test(tc, explicit_devices);
  tcase_add_test(tc, device_memory_round_trip);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
