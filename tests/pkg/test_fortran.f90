! The Fortran module against the C header and the library.
!  1. Prints every constant, struct size and member offset as tests/pkg/abi_dump.c prints them from
!     kivi.h; tests/pkg/test_fortran.sh compares the two line by line (drift in either fails).
!  2. Calls the library through the module's generic interfaces and checks results whose
!     values are known without the library: one token in an fp16 cache attends to itself
!     (softmax weight 1), so the output is that token's V exactly; the 16-bit and pointer forms
!     of append give the same cache as the fp32 form; statuses and strings match kivi.h.
program test_fortran
  use, intrinsic :: iso_c_binding
  use kivi
  implicit none
  type(kivi_context_info), target :: info
  type(kivi_cache_config), target :: cfg
  type(kivi_cache_stats), target :: st
  type(c_ptr) :: ctx, cache, twin
  integer(c_int) :: ids(1), n1(1), len, kern, on_gpu
  integer, parameter :: H = 1, D = 32
  real(c_float), target :: k(H * D), v(H * D), q(2 * H * D), out(2 * H * D)
  integer(c_int16_t), target :: k16(H * D), v16(H * D), o16(2 * H * D)
  integer(c_int8_t), allocatable :: a(:), b(:)
  integer(c_size_t) :: na, nb
  integer :: i

  ! ---- 1. layout ----
  call c("KIVI_OK", KIVI_OK); call c("KIVI_ERR_ARG", KIVI_ERR_ARG)
  call c("KIVI_ERR_UNSUPPORTED", KIVI_ERR_UNSUPPORTED); call c("KIVI_ERR_NO_DEVICE", KIVI_ERR_NO_DEVICE)
  call c("KIVI_ERR_NOMEM", KIVI_ERR_NOMEM); call c("KIVI_ERR_CAPACITY", KIVI_ERR_CAPACITY)
  call c("KIVI_ERR_NONFINITE", KIVI_ERR_NONFINITE); call c("KIVI_ERR_DEVICE", KIVI_ERR_DEVICE)
  call c("KIVI_ERR_BUFFER", KIVI_ERR_BUFFER); call c("KIVI_ERR_FORMAT", KIVI_ERR_FORMAT)
  call c("KIVI_ERR_MISMATCH", KIVI_ERR_MISMATCH); call c("KIVI_ERR_IO", KIVI_ERR_IO)
  call c("KIVI_DEVICE_DEFAULT", KIVI_DEVICE_DEFAULT); call c("KIVI_DEVICE_HOST", KIVI_DEVICE_HOST)
  call c("KIVI_MEM_HOST", KIVI_MEM_HOST); call c("KIVI_MEM_DEVICE", KIVI_MEM_DEVICE)
  call c("KIVI_F32", KIVI_F32); call c("KIVI_F16", KIVI_F16); call c("KIVI_BF16", KIVI_BF16)
  call c("KIVI_ATTENTION_FAST", KIVI_ATTENTION_FAST); call c("KIVI_ATTENTION_FP32", KIVI_ATTENTION_FP32)
  call c("KIVI_MAX_ASYNC_LANES", KIVI_MAX_ASYNC_LANES); call c("KIVI_ALL_SEQS", KIVI_ALL_SEQS)
  call c("KIVI_KERNEL_PORTABLE", KIVI_KERNEL_PORTABLE); call c("KIVI_KERNEL_GPU_F16X2", KIVI_KERNEL_GPU_F16X2)
  call c("KIVI_KERNEL_GPU_GQA", KIVI_KERNEL_GPU_GQA)
  call c("KIVI_KERNEL_GPU_F16", KIVI_KERNEL_GPU_F16); call c("KIVI_KERNEL_GPU_NEW", KIVI_KERNEL_GPU_NEW)
  call c("KIVI_ROTATE_NONE", KIVI_ROTATE_NONE); call c("KIVI_ROTATE_K", KIVI_ROTATE_K)
  call c("KIVI_ROTATE_V", KIVI_ROTATE_V); call c("KIVI_ROTATE_KV", KIVI_ROTATE_KV)
  call c("KIVI_CLIP_NONE", KIVI_CLIP_NONE); call c("KIVI_CLIP_MSE", KIVI_CLIP_MSE)
  call c("KIVI_MAX_SINKS", KIVI_MAX_SINKS)

  call sz("kivi_context_info", c_sizeof(info))
  call off("kivi_context_info.device", c_loc(info), c_loc(info%device))
  call off("kivi_context_info.on_gpu", c_loc(info), c_loc(info%on_gpu))
  call off("kivi_context_info.num_devices", c_loc(info), c_loc(info%num_devices))
  call off("kivi_context_info.reserved", c_loc(info), c_loc(info%reserved))
  call sz("kivi_cache_config", c_sizeof(cfg))
  call off("kivi_cache_config.n_layers", c_loc(cfg), c_loc(cfg%n_layers))
  call off("kivi_cache_config.n_kv_heads", c_loc(cfg), c_loc(cfg%n_kv_heads))
  call off("kivi_cache_config.head_dim", c_loc(cfg), c_loc(cfg%head_dim))
  call off("kivi_cache_config.max_seqs", c_loc(cfg), c_loc(cfg%max_seqs))
  call off("kivi_cache_config.max_seq_len", c_loc(cfg), c_loc(cfg%max_seq_len))
  call off("kivi_cache_config.pool_tokens", c_loc(cfg), c_loc(cfg%pool_tokens))
  call off("kivi_cache_config.k_bits", c_loc(cfg), c_loc(cfg%k_bits))
  call off("kivi_cache_config.v_bits", c_loc(cfg), c_loc(cfg%v_bits))
  call off("kivi_cache_config.group", c_loc(cfg), c_loc(cfg%group))
  call off("kivi_cache_config.residual", c_loc(cfg), c_loc(cfg%residual))
  call off("kivi_cache_config.attention", c_loc(cfg), c_loc(cfg%attention))
  call off("kivi_cache_config.async_lanes", c_loc(cfg), c_loc(cfg%async_lanes))
  call off("kivi_cache_config.rotate", c_loc(cfg), c_loc(cfg%rotate))
  call off("kivi_cache_config.sinks", c_loc(cfg), c_loc(cfg%sinks))
  call off("kivi_cache_config.v_clip", c_loc(cfg), c_loc(cfg%v_clip))
  call off("kivi_cache_config.reserved", c_loc(cfg), c_loc(cfg%reserved))
  call sz("kivi_cache_stats", c_sizeof(st))
  call off("kivi_cache_stats.tokens", c_loc(st), c_loc(st%tokens))
  call off("kivi_cache_stats.code_bytes", c_loc(st), c_loc(st%code_bytes))
  call off("kivi_cache_stats.scale_zero_bytes", c_loc(st), c_loc(st%scale_zero_bytes))
  call off("kivi_cache_stats.residual_bytes", c_loc(st), c_loc(st%residual_bytes))
  call off("kivi_cache_stats.bookkeeping_bytes", c_loc(st), c_loc(st%bookkeeping_bytes))
  call off("kivi_cache_stats.total_bytes", c_loc(st), c_loc(st%total_bytes))
  call off("kivi_cache_stats.fp16_bytes", c_loc(st), c_loc(st%fp16_bytes))
  call off("kivi_cache_stats.bits_per_element", c_loc(st), c_loc(st%bits_per_element))
  call off("kivi_cache_stats.allocated_bytes", c_loc(st), c_loc(st%allocated_bytes))
  call off("kivi_cache_stats.free_blocks", c_loc(st), c_loc(st%free_blocks))
  call off("kivi_cache_stats.total_blocks", c_loc(st), c_loc(st%total_blocks))
  call off("kivi_cache_stats.stream_kernels", c_loc(st), c_loc(st%stream_kernels))
  call off("kivi_cache_stats.stream_waits", c_loc(st), c_loc(st%stream_waits))
  call off("kivi_cache_stats.reserved", c_loc(st), c_loc(st%reserved))

  ! ---- 2. calls ----
  call expect(kivi_version_string() == KIVI_MODULE_VERSION_STRING, "library version = module version")
  call expect(kivi_version_major() == KIVI_MODULE_VERSION_MAJOR .and. kivi_version_minor() == KIVI_MODULE_VERSION_MINOR &
              .and. kivi_version_patch() == KIVI_MODULE_VERSION_PATCH, "version numbers")
  call expect(kivi_built_with_offload() == KIVI_MODULE_BUILT_WITH_OFFLOAD, "offload flag")
  call expect(len_trim(kivi_build_config()) > 0, "build config")
  call expect(kivi_status_string(KIVI_ERR_BUFFER) == "output buffer too small", "status string")
  call ok(kivi_context_create(ctx, KIVI_DEVICE_DEFAULT), "context_create")
  call ok(kivi_context_get_info(ctx, info), "context_get_info")
  call ok(kivi_context_selftest(ctx, on_gpu), "context_selftest")
  call expect(on_gpu == info%on_gpu, "self-test ran where the context runs")
  call expect(kivi_context_create(twin, 1000_c_int) == KIVI_ERR_NO_DEVICE, "device 1000 does not exist")

  call kivi_cache_config_init(cfg, 1_c_int, int(H, c_int), int(D, c_int), 2_c_int, 256_c_int)
  call expect(cfg%k_bits == 2 .and. cfg%group == 32 .and. cfg%residual == 128 .and. all(cfg%reserved == 0), &
              "config_init defaults")
  cfg%group = 48
  call expect(kivi_cache_config_check(cfg) == KIVI_ERR_UNSUPPORTED, "config_check")
  call expect(kivi_cache_config_reason(cfg) == "group must be 32, 64 or 128", "config_reason")
  cfg%group = 32
  call expect(kivi_cache_config_reason(cfg) == "", "valid config: no reason")
  cfg%k_bits = 16
  cfg%v_bits = 16
  cfg%attention = KIVI_ATTENTION_FP32
  call ok(kivi_cache_create(ctx, cfg, cache), "cache_create")
  call ok(kivi_cache_create(ctx, cfg, twin), "cache_create twin")

  ! values exact in fp16: multiples of 1/64 below 1
  do i = 1, H * D
    k(i) = real(mod(i * 7, 64), c_float) / 64.0_c_float
    v(i) = real(mod(i * 5, 64) - 32, c_float) / 64.0_c_float
  end do
  q = 0.25_c_float
  ids(1) = 1
  n1(1) = 1
  call ok(kivi_cache_append(cache, 0_c_int, 1_c_int, ids, n1, k, v, KIVI_F32, KIVI_MEM_HOST), "append f32")
  call ok(kivi_cache_seq_length(cache, 1_c_int, 0_c_int, len), "seq_length")
  call expect(len == 1, "length 1")
  ! two q-heads over the one kv-head (GQA 2:1): each output row is V
  call ok(kivi_attention_decode(cache, 0_c_int, 1_c_int, ids, 2_c_int, q, 0.125_c_float, out, KIVI_F32, &
          KIVI_MEM_HOST), "decode f32")
  call expect(all(out(1:D) == v) .and. all(out(D + 1:2 * D) == v), "decode of one token = its V")
  call ok(kivi_attention_decode(cache, 0_c_int, 1_c_int, ids, 2_c_int, q, 0.125_c_float, o16, KIVI_F16, &
          KIVI_MEM_HOST), "decode f16 out")
  call ok(kivi_cache_last_kernels(cache, kern), "last_kernels")
  call expect(iand(kern, KIVI_KERNEL_PORTABLE) /= 0, "portable kernel ran (fp16 cache, FP32 mode)")

  ! the same token as fp16 bits through the 16-bit form, and through pointers: same cache
  do i = 1, H * D
    k16(i) = f16_bits(k(i))
    v16(i) = f16_bits(v(i))
  end do
  call expect(all(o16(1:D) == v16), "fp16 output bits = V's fp16 bits")
  call ok(kivi_cache_append(twin, 0_c_int, 1_c_int, ids, n1, k16, v16, KIVI_F16, KIVI_MEM_HOST), "append f16")
  call ok(kivi_cache_append(twin, 0_c_int, 1_c_int, ids, n1, c_loc(k), c_loc(v), KIVI_F32, KIVI_MEM_HOST), &
          "append ptr")
  call ok(kivi_cache_append(cache, 0_c_int, 1_c_int, ids, n1, k, v, KIVI_F32, KIVI_MEM_HOST), "append f32 again")
  na = 0
  call ok(kivi_cache_export_seq(cache, 1_c_int, 0_c_int, c_null_ptr, na), "export size")
  allocate(a(na), b(na))
  nb = na
  call ok(kivi_cache_export_seq(cache, 1_c_int, 0_c_int, a, na), "export")
  call ok(kivi_cache_export_seq(twin, 1_c_int, 0_c_int, b, nb), "export twin")
  call expect(na == nb .and. all(a == b), "f32, f16 and pointer appends store the same bytes")
  na = 4
  call expect(kivi_cache_export_seq(cache, 1_c_int, 0_c_int, a, na) == KIVI_ERR_BUFFER .and. na == nb, &
              "KIVI_ERR_BUFFER reports the size needed")

  call ok(kivi_cache_get_stats(cache, st), "get_stats")
  call expect(st%tokens == 2 .and. st%fp16_bytes == 2 * 2 * H * D * 2, "stats")
  call ok(kivi_cache_get_config(cache, cfg), "get_config")
  call expect(cfg%k_bits == 16 .and. cfg%max_seqs == 2, "get_config")
  call ok(kivi_cache_wait(cache), "wait")
  call expect(c_associated(kivi_cache_dependence(cache)), "dependence object")
  call ok(kivi_cache_reset_seq(twin, 1_c_int), "reset_seq")
  call expect(kivi_attention_decode(twin, 0_c_int, 1_c_int, ids, 2_c_int, q, 0.125_c_float, out, KIVI_F32, &
              KIVI_MEM_HOST) == KIVI_ERR_ARG, "decode of an empty sequence is KIVI_ERR_ARG")
  call expect(kivi_cache_load_file(twin, KIVI_ALL_SEQS, "/nonexistent/dir/x.kivi") == KIVI_ERR_IO, "load_file IO")
  deallocate(a, b)
  call kivi_cache_destroy(twin)
  call kivi_cache_destroy(cache)
  call kivi_context_destroy(ctx)
  print '(a)', "fortran: OK"

contains

  subroutine c(name, value)
    character(len=*), intent(in) :: name
    integer(c_int), intent(in) :: value
    print '(a,1x,a,1x,i0)', "const", name, value
  end subroutine c

  subroutine sz(name, n)
    character(len=*), intent(in) :: name
    integer(c_size_t), intent(in) :: n
    print '(a,1x,a,1x,i0)', "size", name, n
  end subroutine sz

  subroutine off(name, base, member)
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: base, member
    print '(a,1x,a,1x,i0)', "offset", name, transfer(member, 0_c_intptr_t) - transfer(base, 0_c_intptr_t)
  end subroutine off

  subroutine ok(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status /= KIVI_OK) then
      print '(a,a,a,a)', "FAIL: ", what, ": ", kivi_status_string(status)
      error stop 1
    end if
  end subroutine ok

  subroutine expect(cond, what)
    logical, intent(in) :: cond
    character(len=*), intent(in) :: what
    if (.not. cond) then
      print '(a,a)', "FAIL: ", what
      error stop 1
    end if
  end subroutine expect

  ! fp16 bits of x, for |x| in [2^-14, 1) with at most 11 significant bits (exact): an independent
  ! encoder, so the 16-bit path is checked against values the library did not compute.
  integer(c_int16_t) function f16_bits(x) result(h)
    real(c_float), intent(in) :: x
    integer :: e, m, sgn
    real :: a
    if (x == 0) then
      h = 0
      return
    end if
    sgn = 0
    if (x < 0) sgn = 1
    a = abs(x)
    e = exponent(a) - 1           ! a = 1.f * 2^e
    m = nint((a / 2.0**e - 1.0) * 1024.0)
    e = ior(ior(ishft(sgn, 15), ishft(e + 15, 10)), m)
    if (e >= 32768) e = e - 65536    ! the same 16 bits as a signed integer(c_int16_t)
    h = int(e, c_int16_t)
  end function f16_bits

end program test_fortran
