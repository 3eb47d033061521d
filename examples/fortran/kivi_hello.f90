! kivi_hello in Fortran: where the work runs, a 2-bit KIVI cache of 1000 tokens, one attention
! step, the memory it takes.  Build against an installed libkivi-omp (docs/USING.md):
!   gfortran -c $(pkg-config --variable=fortran_module libkivi-omp)
!   gfortran kivi_hello.f90 kivi.o $(pkg-config --libs libkivi-omp) -Wl,-rpath,$(pkg-config --variable=libdir libkivi-omp)
program kivi_hello_f
  use, intrinsic :: iso_c_binding
  use kivi
  implicit none
  integer, parameter :: H = 2, D = 64, L = 1000, HQ = 6
  type(c_ptr) :: ctx, cache
  type(kivi_context_info) :: info
  type(kivi_cache_config) :: cfg
  type(kivi_cache_stats) :: st
  real(c_float), allocatable :: k(:), v(:)
  real(c_float) :: q(HQ * D), out(HQ * D)
  integer(c_int) :: seq(1), n(1), on_gpu
  integer :: i

  print '(a,a,a,a,a)', "libkivi-omp ", kivi_version_string(), " (module ", KIVI_MODULE_VERSION_STRING, ")"
  call check(kivi_context_create(ctx, KIVI_DEVICE_DEFAULT), "kivi_context_create")
  call check(kivi_context_get_info(ctx, info), "kivi_context_get_info")
  call check(kivi_context_selftest(ctx, on_gpu), "kivi_context_selftest")
  if (info%on_gpu /= 0) then
    print '(a,i0)', "running on a GPU, OpenMP device ", info%device
  else
    print '(a)', "running on host threads"
  end if

  call kivi_cache_config_init(cfg, 1_c_int, int(H, c_int), int(D, c_int), 1_c_int, 4096_c_int)
  call check(kivi_cache_create(ctx, cfg, cache), "kivi_cache_create")
  allocate(k(L * H * D), v(L * H * D))
  do i = 1, L * H * D
    k(i) = sin(0.001 * real(i - 1))
    v(i) = cos(0.002 * real(i - 1))
  end do
  do i = 1, HQ * D
    q(i) = 0.1 * real(mod(i - 1, 7))
  end do
  seq(1) = 0
  n(1) = L
  call check(kivi_cache_append(cache, 0_c_int, 1_c_int, seq, n, k, v, KIVI_F32, KIVI_MEM_HOST), "kivi_cache_append")
  call check(kivi_attention_decode(cache, 0_c_int, 1_c_int, seq, int(HQ, c_int), q, 0.125_c_float, out, KIVI_F32, &
             KIVI_MEM_HOST), "kivi_attention_decode")
  call check(kivi_cache_get_stats(cache, st), "kivi_cache_get_stats")
  print '(a,i0,a,i0,a,i0,a,f5.2,a)', "cache: ", st%tokens, " tokens in ", st%total_bytes, " bytes vs ", &
       st%fp16_bytes, " as fp16 (", st%bits_per_element, " bits/element)"
  print '(a,f12.6)', "attention output checksum: ", sum(real(out, kind=8))
  deallocate(k, v)
  call kivi_cache_destroy(cache)
  call kivi_context_destroy(ctx)
  print '(a)', "kivi_hello (Fortran): OK"

contains

  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status /= KIVI_OK) then
      print '(a,a,a,a)', what, " failed: ", kivi_status_string(status)
      error stop 1
    end if
  end subroutine check
end program kivi_hello_f
