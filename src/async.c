/* Asynchronous execution: the bookkeeping of enqueued work and kivi_cache_wait.
 *
 * An _async call on a GPU context does its host-side work at once (validation, block
 * allocation, lengths, descriptors) and enqueues its device work as `nowait` target regions
 * with the dependences of its lane (internal.h): the OpenMP runtime runs the calls of a lane in
 * call order, on its hidden helper threads, the lanes side by side, while the caller goes on.
 * Host buffers those regions read are copies the library owns (kept until the wait), so the
 * caller's inputs are free at return; outputs to host memory arrive when the wait returns.
 *
 * Run-time errors: an enqueued append whose input is not finite records its id in its layer's
 * device flag (c->aflag[layer]); its kernels and those of every later enqueued append on the
 * layer then do nothing, and the wait undoes the host side of those appends, returns
 * KIVI_ERR_NONFINITE and clears the flag.  Each layer is then as if the calls on it from the
 * failed append on had not been made; calls on other layers are not touched.  (Appends to one
 * layer always run on one lane, in call order, so "later" is well defined per layer; across
 * lanes it is not.) */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? 2 * *cap : 16;
  while (nc < need) nc *= 2;
  void *p = realloc(*arr, nc * elem);
  if (!p) return -1;
  *arr = p;
  *cap = nc;
  return 0;
}

int kivi_async_keep(kivi_cache *c, void *host) {
  if (grow((void **)&c->keep, &c->cap_keep, c->n_keep + 1, sizeof *c->keep)) {
    free(host);
    return -1;
  }
  c->keep[c->n_keep++] = host;
  return 0;
}

void *kivi_async_keep_copy(kivi_cache *c, const void *src, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) return NULL;
  memcpy(p, src, bytes);
  return kivi_async_keep(c, p) ? NULL : p;
}

int kivi_async_log_append(kivi_cache *c, int64_t id, int layer, int n_seqs, const int *seq_ids, const int *n_new) {
  if (grow((void **)&c->log, &c->cap_log, c->n_log + 1, sizeof *c->log)) return -1;
  int *ids = malloc(2 * (size_t)n_seqs * sizeof *ids);
  if (!ids) return -1;
  memcpy(ids, seq_ids, (size_t)n_seqs * sizeof *ids);
  memcpy(ids + n_seqs, n_new, (size_t)n_seqs * sizeof *ids);
  c->log[c->n_log++] = (kivi_async_append){id, layer, n_seqs, ids, ids + n_seqs};
  return 0;
}

void kivi_async_put(kivi_cache *c, int lane, void *dst_dev, const void *src_host, size_t bytes) {
  const int dev = c->ctx->device;
  char *dep_a, *dep_b; /* named only in depend clauses */
  kivi_lane_deps(c, lane, &dep_a, &dep_b);
  unsigned char *d = dst_dev;
  const unsigned char *s = src_host;
  const int64_t n = (int64_t)bytes;
#pragma omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS nowait depend(inout : dep_a[0]) \
    depend(KIVI_DEP_SET : dep_b[0]) map(to : s[0:bytes]) \
    is_device_ptr(d)
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}

void kivi_async_get(kivi_cache *c, int lane, void *dst_host, const void *src_dev, size_t bytes) {
  const int dev = c->ctx->device;
  char *dep_a, *dep_b; /* named only in depend clauses */
  kivi_lane_deps(c, lane, &dep_a, &dep_b);
  unsigned char *d = dst_host;
  const unsigned char *s = src_dev;
  const int64_t n = (int64_t)bytes;
#pragma omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS nowait depend(inout : dep_a[0]) \
    depend(KIVI_DEP_SET : dep_b[0]) map(from : d[0:bytes]) \
    is_device_ptr(s)
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}

kivi_status kivi_call_begin(kivi_cache *c, int enqueue, int *run) {
  if (!c) return KIVI_ERR_ARG;
  if (!enqueue) {
    const kivi_status st = kivi_async_drain(c);
    if (st) return st;
  }
  *run = c->stream ? KIVI_RUN_STREAM : enqueue && c->ctx->on_gpu ? KIVI_RUN_ENQUEUE : KIVI_RUN_SYNC;
  if (c->stream) kivi_stream_enter(c);
  return KIVI_OK;
}

kivi_status kivi_call_end(kivi_cache *c, int enqueue, kivi_status st) {
  if (!c->stream) return st;
  kivi_stream_leave(c);
  if (enqueue) return st;
  const kivi_status w = kivi_async_drain(c);
  return st ? st : w;
}

int kivi_async_reserve(kivi_cache *c, kivi_scratch *s, size_t bytes) {
  if (bytes > s->bytes && c->stream && kivi_stream_sync(c)) return -1; /* the stream may still use it */
  if (bytes > s->bytes && c->pending) {
    /* the enqueued regions may still use the old allocation: let them finish (an error they
     * report stays recorded in the flag and comes back from the next wait) */
    char *dep = c->dep;
    (void)dep; /* named only in depend clauses */
#pragma omp taskwait depend(inout : dep[0])
  }
  return kivi_scratch_reserve(c->ctx, s, bytes);
}

kivi_status kivi_async_drain(kivi_cache *c) {
  /* nothing of the library's own pending: on a stream, the caller's work there is still waited
   * for (kernels it enqueued, in a kivi_cache_stream_begin scope or through a vendor library) */
  if (!c->pending && !c->n_keep && !c->n_log) return c->stream && kivi_stream_sync(c) ? KIVI_ERR_DEVICE : KIVI_OK;
  char *dep = c->dep;
  (void)dep; /* named only in depend clauses */
#pragma omp taskwait depend(inout : dep[0])
  /* The layers' flags tell whether an enqueued append failed; with no append enqueued since the
   * last wait they are all 0 (every wait clears them).  On a stream they are read back in
   * stream order, after its work, in the same wait. */
  enum { CHUNK = 64, NSTACK = 256 };
  const int NL = c->cfg.n_layers, nflags = c->n_log ? NL : 0;
  int64_t stack_flags[NSTACK];
  int64_t *flags = nflags > NSTACK ? malloc((size_t)nflags * sizeof *flags) : stack_flags;
  if (!flags) return KIVI_ERR_NOMEM; /* nothing consumed: the next wait does it all */
  kivi_status st = KIVI_OK;
  if (nflags && c->stream && kivi_stream_get(c, flags, c->aflag, (size_t)nflags * sizeof *flags))
    st = KIVI_ERR_DEVICE;
  /* the stream's work (and the host outputs it delivers); a failure there is a device error */
  if (kivi_stream_sync(c)) st = KIVI_ERR_DEVICE;
  if (!st && nflags && !c->stream && kivi_dev_get(c->ctx, flags, c->aflag, (size_t)nflags * sizeof *flags))
    st = KIVI_ERR_DEVICE;
  /* on each layer with a failed append, undo it and the layer's later ones, newest first, then
   * clear the flag (64 layers at a time) */
  for (int l0 = 0; l0 < nflags && (st == KIVI_OK || st == KIVI_ERR_NONFINITE); l0 += CHUNK) {
    const int nl = NL - l0 < CHUNK ? NL - l0 : CHUNK;
    int64_t failed[CHUNK];
    memcpy(failed, flags + l0, (size_t)nl * sizeof *failed);
    int any = 0;
    for (int l = 0; l < nl; ++l) any |= failed[l] != 0;
    if (!any) continue;
    for (size_t i = c->n_log; i-- > 0;) {
      const kivi_async_append *a = &c->log[i];
      const int l = a->layer - l0;
      if (l >= 0 && l < nl && failed[l] && a->id >= failed[l])
        kivi_append_rollback(c, a->layer, a->n_seqs, a->seq_ids, a->n_new);
    }
    memset(failed, 0, sizeof failed);
    st = kivi_dev_put(c->ctx, c->aflag + l0, failed, (size_t)nl * sizeof *failed) ? KIVI_ERR_DEVICE
                                                                                 : KIVI_ERR_NONFINITE;
  }
  if (flags != stack_flags) free(flags);
  for (size_t i = 0; i < c->n_log; ++i) free(c->log[i].seq_ids);
  for (size_t i = 0; i < c->n_keep; ++i) free(c->keep[i]);
  c->n_log = c->n_keep = 0;
  c->pending = 0;
  c->next_id = 0;
  return st;
}

kivi_status kivi_cache_wait(kivi_cache *c) {
  if (!c) return KIVI_ERR_ARG;
  return kivi_async_drain(c);
}

void *kivi_cache_dependence(kivi_cache *c) { return c ? c->dep : NULL; }
