/* The stream route (kivi_cache_set_stream): a cache's device work enqueued in call order on one
 * CUDA stream, so that the GPU, not the host, orders it.
 *
 * Why: LLVM 19's offload runtime synchronizes every target region with the host (~20-30 us a
 * region on the H200), and starts an enqueued (`nowait`) region that depends on another only
 * after that one has finished, from a host helper thread (~20-38 us each; docs/PERFORMANCE.md, round
 * 16).  A model's chained decode step is 2 such regions a layer.  A CUDA launch on a stream
 * costs ~3 us of host time and no wait.
 *
 * How, with the kernels still written once as OpenMP target regions: the compiler turns each
 * target region of this library into a call of the offload runtime's entry point
 * __tgt_target_kernel (region id, teams, threads, arguments).  This file defines that entry
 * point, and __tgt_register_lib (which hands the runtime the device image), inside the library
 * with hidden visibility, so the library's own regions call them here and nothing outside the
 * library is affected.  Registration is passed on to the runtime unchanged; the image is
 * remembered.  A region is passed on to the runtime unchanged unless the calling thread is
 * inside a call on a cache with a stream (kivi_stream_enter).  Then, if the region is an
 * `ompx_bare` kernel (CUDA-like: no OpenMP device runtime state; it has no
 * <name>_kernel_environment global) whose arguments are device pointers, scalars and `map(to:)`
 * sections, it is launched with the CUDA driver on the stream: a copy of the image loaded as a
 * CUDA module in the device's primary context (the one the offload runtime uses, so device
 * pointers are shared), the arguments laid out as the runtime would lay them out (LLVM 19:
 * a launch-environment pointer first, then each TARGET_PARAM argument as 8 bytes), and each
 * `map(to:)` section copied into a pinned host ring and from there, on the stream, into a device
 * ring.  Any
 * other region (OpenMP-runtime kernels, other map types) waits for the stream and is passed on
 * to the runtime, which runs it synchronously: slower, still in order.  The cache counts both
 * (kivi_cache_stats).
 *
 * The CUDA driver is opened with dlopen at the first kivi_cache_set_stream, never linked; host
 * builds have none of this (kivi_cache_set_stream returns KIVI_ERR_UNSUPPORTED). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if KIVI_HAVE_OFFLOAD && defined(__linux__) && !defined(KIVI_SIMT_EMU) /* not the emulated GPU (tests/simt) */
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>

/* ---- the offload runtime's ABI (LLVM 19, openmp/libomptarget/include/Shared/APITypes.h) ---- */

typedef struct tgt_entry { /* __tgt_offload_entry */
  void *addr;              /* host address: the region id of a kernel */
  char *name;
  size_t size;
  int32_t flags, data;
} tgt_entry;
typedef struct tgt_image { /* __tgt_device_image */
  void *start, *end;
  tgt_entry *entries_begin, *entries_end;
} tgt_image;
typedef struct tgt_desc { /* __tgt_bin_desc */
  int32_t n_images;
  tgt_image *images;
  tgt_entry *host_begin, *host_end;
} tgt_desc;
typedef struct tgt_kargs { /* KernelArgsTy, version 3 */
  uint32_t version, n_args;
  void **base, **ptrs;
  int64_t *sizes, *types;
  void **names, **mappers;
  uint64_t tripcount, flags;
  uint32_t teams[3], threads[3], dyn_shared;
} tgt_kargs;
_Static_assert(sizeof(tgt_kargs) == 104, "LLVM 19 KernelArgsTy");
#define MAP_TO 0x1
#define MAP_FROM 0x2
#define MAP_PTR_AND_OBJ 0x10
#define MAP_TARGET_PARAM 0x20
#define MAP_PRIVATE 0x80
#define MAP_LITERAL 0x100
#define MAP_MEMBER_OF ((int64_t)0xffff << 48)

typedef int (*register_fn)(tgt_desc *);
typedef int (*kernel_fn)(void *, int64_t, int32_t, int32_t, void *, tgt_kargs *);

/* ---- the CUDA driver, opened at run time ---- */

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef unsigned long long CUdeviceptr;
static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*ModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*MemHostAlloc)(void **, size_t, unsigned);
  CUresult (*MemFreeHost)(void *);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
} cu;
static int cu_state; /* 0 not tried, 1 ready, -1 unavailable */

static int cu_open(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return -1;
#define KIVI_CU(field, name) \
  if (!(*(void **)&cu.field = dlsym(h, name))) return -1;
  KIVI_CU(Init, "cuInit")
  KIVI_CU(DeviceGet, "cuDeviceGet")
  KIVI_CU(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
  KIVI_CU(CtxSetCurrent, "cuCtxSetCurrent")
  KIVI_CU(ModuleLoadData, "cuModuleLoadData")
  KIVI_CU(ModuleGetFunction, "cuModuleGetFunction")
  KIVI_CU(ModuleGetGlobal, "cuModuleGetGlobal_v2")
  KIVI_CU(LaunchKernel, "cuLaunchKernel")
  KIVI_CU(StreamCreate, "cuStreamCreate")
  KIVI_CU(StreamDestroy, "cuStreamDestroy_v2")
  KIVI_CU(StreamSynchronize, "cuStreamSynchronize")
  KIVI_CU(MemHostAlloc, "cuMemHostAlloc")
  KIVI_CU(MemFreeHost, "cuMemFreeHost")
  KIVI_CU(MemAlloc, "cuMemAlloc_v2")
  KIVI_CU(MemFree, "cuMemFree_v2")
  KIVI_CU(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
  KIVI_CU(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
#undef KIVI_CU
  return cu.Init(0) ? -1 : 0; /* the handle stays open for the life of the process */
}

/* ---- the runtime's entry points, seen first by the library's own regions ---- */

/* The device images registered through here: the library's own, and those of programs linked
 * with the hooks below (kivi.h, "The caller's own regions on the stream"). */
enum { MAX_IMG = 8 };
static tgt_desc *g_desc[MAX_IMG];
static int g_n_desc;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((visibility("hidden"))) int __tgt_register_lib(tgt_desc *desc);
__attribute__((visibility("hidden"))) int __tgt_target_kernel(void *loc, int64_t device, int32_t teams,
                                                              int32_t threads, void *region, tgt_kargs *args);

int __tgt_register_lib(tgt_desc *desc) {
  pthread_mutex_lock(&g_lock);
  if (g_n_desc < MAX_IMG) g_desc[g_n_desc++] = desc; /* beyond: its regions take the runtime's route */
  pthread_mutex_unlock(&g_lock);
  register_fn next = (register_fn)dlsym(RTLD_DEFAULT, "__tgt_register_lib"); /* ours is hidden: the runtime's */
  return next ? next(desc) : 0;
}

static kernel_fn g_next_kernel;
static pthread_once_t g_next_once = PTHREAD_ONCE_INIT;
static void find_next_kernel(void) { g_next_kernel = (kernel_fn)dlsym(RTLD_DEFAULT, "__tgt_target_kernel"); }

/* The stream of the cache whose call this thread is in (kivi_stream_enter), or NULL: where the
 * library's own regions go.  t_scope: the stream of the caller's scope (kivi_cache_stream_begin),
 * or NULL: where the program's regions go (they come through the hooks). */
static _Thread_local kivi_stream *t_stream, *t_scope;

/* ---- per device: its context, each image as a CUDA module, the kernels looked up in them ---- */

enum { KTAB = 512 };
typedef struct kivi_module {
  int state; /* 0 not set up, 1 ready, -1 failed */
  CUcontext ctx;
  struct { int state; CUmodule mod; } img[MAX_IMG]; /* state as above */
  struct { void *region; CUfunction fn; } tab[KTAB]; /* fn NULL: not launchable on a stream */
} kivi_module;
enum { MAX_DEV = 64 };
static kivi_module g_mod[MAX_DEV];

/* The cubin inside a registered image: an LLVM offload binary (magic 0x10ff10ad) holding the
 * ELF, or the ELF itself. */
static const void *image_cubin(const tgt_desc *desc) {
  for (int i = 0; i < desc->n_images; ++i) {
    const unsigned char *p = desc->images[i].start, *e = desc->images[i].end;
    if (!p || e - p < 64) continue;
    if (!memcmp(p, "\x7f" "ELF", 4) && p[18] == 190) return p; /* EM_CUDA */
    if (memcmp(p, "\x10\xff\x10\xad", 4)) continue;
    uint64_t entry_off, n_entries_bytes;
    memcpy(&entry_off, p + 16, 8);
    memcpy(&n_entries_bytes, p + 24, 8);
    if (entry_off + 40 > (uint64_t)(e - p)) continue;
    uint64_t img_off, img_size;
    memcpy(&img_off, p + entry_off + 24, 8);
    memcpy(&img_size, p + entry_off + 32, 8);
    if (img_off + img_size > (uint64_t)(e - p) || img_size < 64) continue;
    const unsigned char *elf = p + img_off;
    if (!memcmp(elf, "\x7f" "ELF", 4) && elf[18] == 190) return elf;
  }
  return NULL;
}

/* image i as a module of the device's context; called with g_lock held */
static CUmodule image_module(kivi_module *m, int i) {
  if (!m->img[i].state) {
    const void *cubin = image_cubin(g_desc[i]);
    m->img[i].state = cubin && !cu.CtxSetCurrent(m->ctx) && !cu.ModuleLoadData(&m->img[i].mod, cubin) ? 1 : -1;
  }
  return m->img[i].state > 0 ? m->img[i].mod : NULL;
}

/* The device's primary context, with the library's image loaded (the first registered). */
static kivi_module *module_of(int device) {
  if (device < 0 || device >= MAX_DEV) return NULL;
  kivi_module *m = &g_mod[device];
  if (m->state) return m->state > 0 ? m : NULL;
  pthread_mutex_lock(&g_lock);
  if (!m->state) {
    CUdevice d;
    m->state = g_n_desc && !cu.DeviceGet(&d, device) && !cu.PrimaryCtxRetain(&m->ctx, d) && image_module(m, 0) ? 1 : -1;
  }
  pthread_mutex_unlock(&g_lock);
  return m->state > 0 ? m : NULL;
}

/* The kernel of a region, if it can be launched on a stream (an ompx_bare kernel of a registered
 * image); called with g_lock held. */
static CUfunction lookup(kivi_module *m, void *region) {
  for (int i = 0; i < g_n_desc; ++i)
    for (const tgt_entry *e = g_desc[i]->host_begin; e < g_desc[i]->host_end; ++e) {
      if (e->addr != region || !e->name) continue;
      CUmodule mod = image_module(m, i);
      char env[512];
      CUdeviceptr gp;
      size_t gs;
      CUfunction fn = NULL;
      const size_t nl = strlen(e->name);
      if (!mod || nl + sizeof "_kernel_environment" > sizeof env) return NULL;
      memcpy(env, e->name, nl);
      memcpy(env + nl, "_kernel_environment", sizeof "_kernel_environment");
      /* an OpenMP-runtime kernel has a kernel environment: not for the stream */
      if (cu.ModuleGetGlobal(&gp, &gs, mod, env) == 0) return NULL;
      if (cu.ModuleGetFunction(&fn, mod, e->name) != 0) fn = NULL;
      return fn;
    }
  return NULL;
}

static CUfunction kernel_of(kivi_module *m, void *region) {
  CUfunction fn = NULL;
  pthread_mutex_lock(&g_lock);
  size_t h = ((uintptr_t)region >> 4) % KTAB;
  for (int probe = 0; probe < KTAB; ++probe, h = (h + 1) % KTAB) {
    if (m->tab[h].region == region) {
      fn = m->tab[h].fn;
      break;
    }
    if (!m->tab[h].region) { /* first time: look it up and remember */
      fn = lookup(m, region);
      m->tab[h].region = region;
      m->tab[h].fn = fn;
      break;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return fn;
}

/* ---- a cache's stream ---- */

/* Pinned host ring and device ring for map(to:) sections.  (Kernels reading small sections in
 * place from mapped pinned memory were slower: docs/PERFORMANCE.md, round 17.) */
#define RING_BYTES ((size_t)8 << 20)
enum { MAX_ARGS = 64 };

struct kivi_stream {
  CUstream stream;
  int own;                 /* created by the library */
  int device;
  kivi_module *m;
  unsigned char *hring;    /* pinned */
  CUdeviceptr dring;
  size_t head;             /* next free byte of both rings */
  struct kivi_delivery { void *dst; const void *src; size_t bytes; } *out; /* host outputs at the sync */
  size_t n_out, cap_out;
  int64_t launched, passed; /* kernels launched on the stream, regions passed on to the runtime */
  int failed;               /* a launch or copy failed since the last sync */
};

/* Waits for the stream, delivers the host outputs, empties the rings.  A failure stays recorded
 * (s->failed) until kivi_stream_sync reports it. */
static int deliver_and_reset(kivi_stream *s) {
  if (cu.StreamSynchronize(s->stream)) s->failed = 1;
  for (size_t i = 0; i < s->n_out; ++i) memcpy(s->out[i].dst, s->out[i].src, s->out[i].bytes);
  s->n_out = 0;
  s->head = 0;
  return s->failed ? -1 : 0;
}

/* what `bytes` take of the rings: each piece starts 256-aligned */
static size_t ring_size(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* bytes of both rings, 256-aligned, or -1 (too large: the caller takes the slow path) */
static int64_t ring_take(kivi_stream *s, size_t bytes) {
  bytes = ring_size(bytes);
  if (bytes > RING_BYTES / 2) return -1;
  if (s->head + bytes > RING_BYTES && deliver_and_reset(s)) return -1; /* wrap: what used the ring is done */
  const int64_t at = (int64_t)s->head;
  s->head += bytes;
  return at;
}

static int launch(kivi_stream *s, CUfunction fn, tgt_kargs *a) {
  if (a->version < 3 || a->n_args > MAX_ARGS || a->dyn_shared || a->mappers) return -1;
  /* first pass: every argument must be one we can lay out */
  size_t stage = 0;
  for (uint32_t i = 0; i < a->n_args; ++i) {
    const int64_t t = a->types[i];
    if (!(t & MAP_TARGET_PARAM) || (t & (MAP_PRIVATE | MAP_PTR_AND_OBJ | MAP_FROM | MAP_MEMBER_OF))) return -1;
    if (!(t & MAP_LITERAL)) {
      if (!(t & MAP_TO) || a->sizes[i] < 0) return -1;
      stage += ring_size((size_t)a->sizes[i]);
    }
  }
  int64_t at = 0;
  if (stage && (at = ring_take(s, stage)) < 0) return -1;
  uint64_t val[MAX_ARGS + 1];
  void *par[MAX_ARGS + 1];
  val[0] = ~(uint64_t)0; /* the launch environment: none (no reductions) */
  for (uint32_t i = 0; i < a->n_args; ++i) {
    const int64_t t = a->types[i];
    if (t & MAP_LITERAL) {
      val[i + 1] = (uint64_t)(uintptr_t)a->base[i];
    } else {
      const size_t n = (size_t)a->sizes[i];
      memcpy(s->hring + at, a->ptrs[i], n);
      const CUdeviceptr d = s->dring + (CUdeviceptr)at;
      if (n && cu.MemcpyHtoDAsync(d, s->hring + at, n, s->stream)) return -2;
      /* the device address of the base, as the runtime passes it */
      val[i + 1] = (uint64_t)d + (uint64_t)((char *)a->base[i] - (char *)a->ptrs[i]);
      at += (int64_t)ring_size(n);
    }
  }
  for (uint32_t i = 0; i <= a->n_args; ++i) par[i] = &val[i];
  const unsigned gx = a->teams[0] ? a->teams[0] : 1, gy = a->teams[1] ? a->teams[1] : 1,
                 gz = a->teams[2] ? a->teams[2] : 1;
  const unsigned bx = a->threads[0] ? a->threads[0] : 1, by = a->threads[1] ? a->threads[1] : 1,
                 bz = a->threads[2] ? a->threads[2] : 1;
  return cu.LaunchKernel(fn, gx, gy, gz, bx, by, bz, 0, s->stream, par, NULL) ? -2 : 0;
}

static int target_kernel(kivi_stream *s, void *loc, int64_t device, int32_t teams, int32_t threads, void *region,
                         tgt_kargs *args) {
  pthread_once(&g_next_once, find_next_kernel);
  if (s && device == s->device && !(args->flags & 1)) { /* not `nowait` */
    CUfunction fn = kernel_of(s->m, region);
    const int r = fn ? launch(s, fn, args) : -1;
    if (r == 0) {
      ++s->launched;
      return 0;
    }
    if (r == -2) s->failed = 1;
    /* slow path, in order: what the stream holds first, then the runtime, synchronously */
    (void)deliver_and_reset(s);
    ++s->passed;
  }
  return g_next_kernel ? g_next_kernel(loc, device, teams, threads, region, args) : 1;
}

int __tgt_target_kernel(void *loc, int64_t device, int32_t teams, int32_t threads, void *region, tgt_kargs *args) {
  return target_kernel(t_stream, loc, device, teams, threads, region, args);
}

/* The hooks a program links to with --wrap (kivi.h): its image and regions come here first. */
int __wrap___tgt_register_lib(void *desc) { return __tgt_register_lib(desc); }
int __wrap___tgt_target_kernel(void *loc, int64_t device, int32_t teams, int32_t threads, void *region,
                               void *args) {
  return target_kernel(t_scope, loc, device, teams, threads, region, args);
}

/* ---- the library's side ---- */

kivi_status kivi_stream_open(const kivi_cache *c, void *stream, kivi_stream **out) {
  if (!c->ctx->on_gpu) return KIVI_ERR_UNSUPPORTED;
  pthread_mutex_lock(&g_lock);
  if (!cu_state) cu_state = cu_open() ? -1 : 1;
  pthread_mutex_unlock(&g_lock);
  if (cu_state < 0) return KIVI_ERR_UNSUPPORTED;
  kivi_module *m = module_of(c->ctx->device);
  if (!m) return KIVI_ERR_DEVICE;
  kivi_stream *s = calloc(1, sizeof *s);
  if (!s) return KIVI_ERR_NOMEM;
  s->device = c->ctx->device;
  s->m = m;
  if (cu.CtxSetCurrent(m->ctx)) { free(s); return KIVI_ERR_DEVICE; }
  if (cu.MemHostAlloc((void **)&s->hring, RING_BYTES, 0)) {
    free(s);
    return KIVI_ERR_NOMEM;
  }
  if (cu.MemAlloc(&s->dring, RING_BYTES)) {
    cu.MemFreeHost(s->hring);
    free(s);
    return KIVI_ERR_NOMEM;
  }
  s->stream = stream;
  if (stream == KIVI_STREAM_LIBRARY) {
    s->own = 1;
    if (cu.StreamCreate(&s->stream, 1 /* CU_STREAM_NON_BLOCKING */)) {
      cu.MemFree(s->dring);
      cu.MemFreeHost(s->hring);
      free(s);
      return KIVI_ERR_DEVICE;
    }
  }
  *out = s;
  return KIVI_OK;
}

void kivi_stream_close(kivi_stream *s) {
  if (!s) return;
  if (t_scope == s) t_scope = NULL; /* a scope left open on this thread: ended with its stream */
  (void)cu.CtxSetCurrent(s->m->ctx);
  (void)deliver_and_reset(s);
  if (s->own) cu.StreamDestroy(s->stream);
  cu.MemFree(s->dring);
  cu.MemFreeHost(s->hring);
  free(s->out);
  free(s);
}

void kivi_stream_enter(kivi_cache *c) {
  t_stream = c->stream;
  if (c->stream) (void)cu.CtxSetCurrent(c->stream->m->ctx);
}
void kivi_stream_leave(kivi_cache *c) {
  (void)c;
  t_stream = NULL;
  if (t_scope) (void)cu.CtxSetCurrent(t_scope->m->ctx); /* the scope's device again */
}

int kivi_stream_scope(kivi_cache *c, int on) {
  if (on) {
    if (!c->stream || cu.CtxSetCurrent(c->stream->m->ctx)) return -1;
    t_scope = c->stream;
  } else {
    if (!c->stream || t_scope != c->stream) return -1;
    t_scope = NULL;
  }
  return 0;
}

int kivi_stream_sync(kivi_cache *c) {
  kivi_stream *s = c->stream;
  if (!s) return 0;
  const int err = deliver_and_reset(s);
  s->failed = 0;
  return err;
}

void *kivi_stream_handle(const kivi_cache *c) { return c->stream ? c->stream->stream : NULL; }

void kivi_stream_counts(const kivi_cache *c, int64_t *launched, int64_t *passed) {
  *launched = c->stream ? c->stream->launched : 0;
  *passed = c->stream ? c->stream->passed : 0;
}

int kivi_stream_put(kivi_cache *c, void *dst_dev, const void *src_host, size_t bytes) {
  kivi_stream *s = c->stream;
  if (!bytes) return 0;
  const int64_t at = ring_take(s, bytes);
  if (at < 0) { /* too large for the ring: in order, synchronously */
    if (deliver_and_reset(s)) return -1;
    return kivi_dev_put(c->ctx, dst_dev, src_host, bytes);
  }
  memcpy(s->hring + at, src_host, bytes);
  return cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst_dev, s->hring + at, bytes, s->stream) ? -1 : 0;
}

int kivi_stream_get(kivi_cache *c, void *dst_host, const void *src_dev, size_t bytes) {
  kivi_stream *s = c->stream;
  if (!bytes) return 0;
  const int64_t at = ring_take(s, bytes);
  if (at < 0) { /* too large for the ring: in order, synchronously */
    if (deliver_and_reset(s)) return -1;
    return kivi_dev_get(c->ctx, dst_host, src_dev, bytes);
  }
  if (s->n_out == s->cap_out) {
    const size_t nc = s->cap_out ? 2 * s->cap_out : 16;
    void *p = realloc(s->out, nc * sizeof *s->out);
    if (!p) return -1;
    s->out = p;
    s->cap_out = nc;
  }
  if (cu.MemcpyDtoHAsync(s->hring + at, (CUdeviceptr)(uintptr_t)src_dev, bytes, s->stream)) return -1;
  s->out[s->n_out++] = (struct kivi_delivery){dst_host, s->hring + at, bytes};
  return 0;
}

#else /* no offload: no streams */

kivi_status kivi_stream_open(const kivi_cache *c, void *stream, kivi_stream **out) {
  (void)c;
  (void)stream;
  *out = NULL;
  return KIVI_ERR_UNSUPPORTED;
}
void kivi_stream_close(kivi_stream *s) { (void)s; }
void kivi_stream_enter(kivi_cache *c) { (void)c; }
void kivi_stream_leave(kivi_cache *c) { (void)c; }
int kivi_stream_scope(kivi_cache *c, int on) {
  (void)c;
  (void)on;
  return -1;
}
int kivi_stream_sync(kivi_cache *c) { (void)c; return 0; }
void *kivi_stream_handle(const kivi_cache *c) { (void)c; return NULL; }
void kivi_stream_counts(const kivi_cache *c, int64_t *launched, int64_t *passed) {
  (void)c;
  *launched = *passed = 0;
}
int kivi_stream_put(kivi_cache *c, void *dst_dev, const void *src_host, size_t bytes) {
  return kivi_dev_put(c->ctx, dst_dev, src_host, bytes);
}
int kivi_stream_get(kivi_cache *c, void *dst_host, const void *src_dev, size_t bytes) {
  return kivi_dev_get(c->ctx, dst_host, src_dev, bytes);
}

/* Without offload the hooks have nothing to route: they pass each call on to the runtime, if the
 * program has one. */
#if defined(__linux__)
#include <dlfcn.h>
#endif
typedef int (*kivi_fwd_register)(void *);
typedef int (*kivi_fwd_kernel)(void *, int64_t, int32_t, int32_t, void *, void *);
int __wrap___tgt_register_lib(void *desc) {
#if defined(__linux__)
  kivi_fwd_register f = (kivi_fwd_register)dlsym(RTLD_DEFAULT, "__tgt_register_lib");
  return f ? f(desc) : 0;
#else
  (void)desc;
  return 0;
#endif
}
int __wrap___tgt_target_kernel(void *loc, int64_t device, int32_t teams, int32_t threads, void *region,
                               void *args) {
#if defined(__linux__)
  kivi_fwd_kernel f = (kivi_fwd_kernel)dlsym(RTLD_DEFAULT, "__tgt_target_kernel");
  return f ? f(loc, device, teams, threads, region, args) : 1;
#else
  (void)loc, (void)device, (void)teams, (void)threads, (void)region, (void)args;
  return 1;
#endif
}
#endif
