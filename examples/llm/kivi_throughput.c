/* kivi_throughput: a whole model's generation throughput against batch size, one curve per KV
 * cache (KIVI paper, Figure 5).  A Llama or Qwen2 shape with random fp16 weights on the cache's
 * device; each sequence gets a prompt of P random tokens and generates N tokens greedily (P + N - 1
 * forward passes: the prompt in chunks through kivi_attention_extend, the rest one token at a
 * time through append + decode).  For each cache the batch rises until the cache and the
 * batch's scratch no longer fit in device memory (or the listed batches end).
 *
 * Reported per (cache, batch): generated tokens/s over the whole run (prompt included, like a
 * serving engine's generate), tokens/s of the decode steps alone, the mean decode step split
 * into matrix products, attention, append and the rest, and device memory in use. */
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kivi_cli.h"
#include "kivi.h"
#include "model_dev.h"

#define PROG "kivi_throughput"

static const char usage[] =
    "usage: " PROG " [options]\n"
    "  A model of a Llama or Qwen2 shape with random fp16 weights generates on each KV cache at\n"
    "  rising batch sizes; tokens/s, the decode step's parts and device memory for each.\n"
    "  --shape S        llama2-7b (default: 32 layers, 4096 wide, 32 heads x 128, FFN 11008,\n"
    "                   vocabulary 32000) or tiny (2 layers, 256 wide, 2 heads x 128, FFN 512,\n"
    "                   vocabulary 512: a check that runs anywhere) or smollm2-135m (SmolLM2-135M's\n"
    "                   shape: 30 layers, 576 wide, 9 heads x 64 over 3 kv-heads, FFN 1536,\n"
    "                   vocabulary 49152) or qwen2.5-1.5b (Qwen2.5-1.5B's: 28 layers, 1536 wide,\n"
    "                   12 heads x 128 over 2 kv-heads, q/k/v biases, FFN 8960, vocabulary 151936)\n"
    "  --prompt P       prompt tokens per sequence (default 161)\n"
    "  --gen N          generated tokens per sequence (default 338)\n"
    "  --kv LIST        caches, comma-separated from fp16, kivi4, kivi2, kivi2-r32\n"
    "                   (default: all four; kivi* use G = 32 and R = 128 unless -r32)\n"
    "  --batches LIST   batch sizes, comma-separated (default on a GPU: 1 16 64 128 256 512 1024\n"
    "                   2048 4096 8192 and each cache's largest; on the host: 1,2)\n"
    "  --no-max         do not search for and run each cache's largest batch\n"
    "  --max-only       only find each cache's largest batch (one prompt chunk and one decode\n"
    "                   step of it run) and its memory (GPU)\n"
    "  --chunk T        prompt tokens per prefill call, all sequences together (default 8192)\n"
    "  --device N|host  OpenMP device number, or host threads (default: the default device)\n"
    "  --stream         each forward call on one CUDA stream, waited for once (GPU, cuBLAS):\n"
    "                   the step's split is then the host's time to enqueue each part, the\n"
    "                   wait counted in other\n"
    "  --json FILE      write the results as JSON\n";

typedef struct kv_kind {
  const char *name;
  int k_bits, v_bits, residual;
} kv_kind;
static const kv_kind kinds[] = {{"fp16", 16, 16, 128}, {"kivi4", 4, 4, 128}, {"kivi2", 2, 2, 128}, {"kivi2-r32", 2, 2, 32}};
enum { N_KINDS = sizeof kinds / sizeof *kinds };

typedef struct run_result {
  int batch, ok;
  double prefill_s, decode_s, tok_s, decode_tok_s, bits_per_element;
  llm_dev_times step; /* mean decode step, seconds */
  size_t mem_used, cache_bytes;
  unsigned kernels;
} run_result;

typedef struct opts {
  llm_dev_shape shape;
  const char *shape_name;
  int prompt, gen, chunk, device, no_max, max_only, stream;
  int kv[N_KINDS], n_kv;
  int batches[64], n_batches;
  const char *json;
} opts;

static int parse_list(const char *s, int *out, int max) {
  int n = 0;
  while (*s && n < max) {
    char *end;
    const long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > (1 << 20)) return -1;
    out[n++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return *s ? -1 : n;
}

static kivi_status make_cache(kivi_context *ctx, const opts *o, const kv_kind *k, int batch, kivi_cache **c) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, o->shape.n_layers, o->shape.n_kv_heads, o->shape.head_dim, batch, o->prompt + o->gen);
  cfg.k_bits = k->k_bits;
  cfg.v_bits = k->v_bits;
  cfg.residual = k->residual;
  return kivi_cache_create(ctx, &cfg, c);
}

/* rows of a call: whole prompts up to --chunk tokens (at least one), or a decode step's batch */
static int prefill_rows(const opts *o, int batch) {
  int r = o->chunk / o->prompt * o->prompt;
  if (r < o->prompt) r = o->prompt;
  return batch > r ? batch : r;
}

static kivi_status run_batch(kivi_context *ctx, const llm_dev_model *dm, const opts *o, const kv_kind *k, int B,
                             int probe, run_result *res);

/* Whether a batch fits: the cache and the batch's buffers allocate, its largest calls run (one
 * prompt chunk and one decode step of every sequence: the library's per-call scratch grows to
 * them), and 2 % of the device stays free for the rest (cuBLAS, scratch that grows with the
 * context). */
static int fits(kivi_context *ctx, const llm_dev_model *dm, const opts *o, const kv_kind *k, int batch,
                size_t total) {
  run_result r;
  return run_batch(ctx, dm, o, k, batch, 1, &r) == KIVI_OK && r.mem_used + total / 50 <= total;
}

static size_t cache_bytes(kivi_context *ctx, const opts *o, const kv_kind *k, int batch) {
  kivi_cache *c = NULL;
  kivi_cache_stats cs;
  const int ok = make_cache(ctx, o, k, batch, &c) == KIVI_OK && kivi_cache_get_stats(c, &cs) == KIVI_OK;
  kivi_cache_destroy(c);
  return ok ? cs.allocated_bytes : 0;
}

/* The largest batch that fits: predicted from what a cache of 1 and of 2 sequences allocates
 * (it grows linearly with its slots) and the batch buffers' size, then confirmed by running its
 * largest calls (fits), 1 % lower each time they run out of memory (the offload runtime prints
 * a message for each such failure). */
static int max_batch(kivi_context *ctx, const llm_dev_model *dm, const opts *o, const kv_kind *k, size_t total) {
  const size_t a1 = cache_bytes(ctx, o, k, 1), a2 = cache_bytes(ctx, o, k, 2);
  if (!a1 || a2 <= a1) return 0;
  const size_t used = llm_dev_memory(dm, NULL), per = a2 - a1, base = a1 - per, margin = total / 50;
  int lo = 0, hi = 1 << 20;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    const size_t need = used + base + per * (size_t)mid + llm_dev_batch_bytes(dm, prefill_rows(o, mid), mid, mid) + margin;
    if (need <= total)
      lo = mid;
    else
      hi = mid;
  }
  while (lo > 0 && !fits(ctx, dm, o, k, lo, total)) lo -= lo / 100 + 1;
  return lo;
}

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* One run of batch B: all prompts, then the generated tokens.  probe: only the first prompt
 * chunk and one decode step of all B sequences (the calls with the most rows), for fits. */
static kivi_status run_batch(kivi_context *ctx, const llm_dev_model *dm, const opts *o, const kv_kind *k, int B,
                             int probe, run_result *res) {
  memset(res, 0, sizeof *res);
  res->batch = B;
  kivi_cache *c = NULL;
  llm_dev_batch b;
  kivi_status st = make_cache(ctx, o, k, B, &c);
  if (st) return st;
  if (llm_dev_batch_init(&b, dm, prefill_rows(o, B), B, B)) {
    kivi_cache_destroy(c);
    return KIVI_ERR_NOMEM;
  }
  if (o->stream && llm_dev_batch_set_stream(&b, c, 1)) {
    llm_dev_batch_free(&b);
    kivi_cache_destroy(c);
    return KIVI_ERR_UNSUPPORTED;
  }
  const int P = o->prompt, per_chunk = b.max_rows / P < B ? b.max_rows / P : B;
  int *ids = malloc((size_t)B * sizeof *ids), *nn = malloc((size_t)B * sizeof *nn),
      *pos = malloc((size_t)B * sizeof *pos), *tok = malloc((size_t)b.max_rows * sizeof *tok),
      *next = malloc((size_t)B * sizeof *next);
  if (!ids || !nn || !pos || !tok || !next) {
    st = KIVI_ERR_NOMEM;
    goto out;
  }
  llm_dev_times t = {0};
  /* the prompts, per_chunk sequences per call */
  double t0 = omp_get_wtime();
  for (int s0 = 0; s0 < B && !st && !(probe && s0 > 0); s0 += per_chunk) {
    const int n = B - s0 < per_chunk ? B - s0 : per_chunk;
    for (int i = 0; i < n; ++i) {
      ids[i] = s0 + i;
      nn[i] = P;
      pos[i] = 0;
      for (int j = 0; j < P; ++j) tok[i * P + j] = (int)(mix(((uint64_t)(s0 + i) << 20) + (uint64_t)j) % (uint64_t)o->shape.n_vocab);
    }
    st = llm_dev_forward(&b, c, n, ids, nn, pos, tok, NULL, 0, next + s0, &t);
  }
  res->prefill_s = omp_get_wtime() - t0;
  /* the rest, one token per sequence per step */
  for (int i = 0; i < B; ++i) {
    ids[i] = i;
    nn[i] = 1;
    pos[i] = P;
  }
  memset(&t, 0, sizeof t);
  t0 = omp_get_wtime();
  const int gen = probe && o->gen > 2 ? 2 : o->gen;
  for (int step = 1; step < gen && !st; ++step) {
    memcpy(tok, next, (size_t)B * sizeof *tok);
    st = llm_dev_forward(&b, c, B, ids, nn, pos, tok, NULL, 0, next, &t);
    for (int i = 0; i < B; ++i) ++pos[i];
  }
  res->decode_s = omp_get_wtime() - t0;
  if (st) goto out;
  const int steps = o->gen - 1 > 0 ? o->gen - 1 : 1;
  res->step = (llm_dev_times){t.matmul / steps, t.attention / steps, t.append / steps, t.other / steps};
  res->tok_s = (double)B * o->gen / (res->prefill_s + res->decode_s);
  res->decode_tok_s = o->gen > 1 ? (double)B * (o->gen - 1) / res->decode_s : 0.0;
  res->mem_used = llm_dev_memory(dm, NULL);
  kivi_cache_stats cs;
  if (kivi_cache_get_stats(c, &cs) == KIVI_OK) {
    res->cache_bytes = cs.allocated_bytes;
    res->bits_per_element = cs.bits_per_element;
  }
  kivi_cache_last_kernels(c, &res->kernels);
  res->ok = 1;
out:
  free(ids);
  free(nn);
  free(pos);
  free(tok);
  free(next);
  llm_dev_batch_free(&b);
  kivi_cache_destroy(c);
  return st;
}

static int parse(int argc, char **argv, opts *o) {
  static const llm_dev_shape llama2 = {32, 32, 32, 128, 4096, 11008, 32000, 10000.0f, 1e-5f, 0};
  static const llm_dev_shape tiny = {2, 2, 2, 128, 256, 512, 512, 10000.0f, 1e-5f, 0};
  static const llm_dev_shape smollm2 = {30, 9, 3, 64, 576, 1536, 49152, 100000.0f, 1e-5f, 0};
  static const llm_dev_shape qwen15 = {28, 12, 2, 128, 1536, 8960, 151936, 1000000.0f, 1e-6f, 1};
  memset(o, 0, sizeof *o);
  o->shape = llama2;
  o->shape_name = "llama2-7b";
  o->prompt = 161;
  o->gen = 338;
  o->chunk = 8192;
  o->device = KIVI_DEVICE_DEFAULT;
  for (int i = 0; i < N_KINDS; ++i) o->kv[o->n_kv++] = i;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-max")) {
      o->no_max = 1;
      continue;
    }
    if (!strcmp(a, "--max-only")) {
      o->max_only = 1;
      continue;
    }
    if (!strcmp(a, "--stream")) {
      o->stream = 1;
      continue;
    }
    static const char *const with_value[] = {"--shape", "--prompt", "--gen", "--kv", "--batches", "--chunk", "--device", "--json"};
    int known = 0;
    for (size_t j = 0; j < sizeof with_value / sizeof *with_value; ++j) known |= !strcmp(a, with_value[j]);
    if (!known) return kivi_cli_bad(PROG, "unknown option", a);
    if (!v) return kivi_cli_bad(PROG, "missing value after", a);
    ++i;
    char *end;
    const long n = strtol(v, &end, 10);
    const int num = *v && !*end && n >= 1 && n <= (1 << 24);
    if (!strcmp(a, "--shape")) {
      if (!strcmp(v, "llama2-7b"))
        o->shape = llama2;
      else if (!strcmp(v, "tiny"))
        o->shape = tiny;
      else if (!strcmp(v, "smollm2-135m"))
        o->shape = smollm2;
      else if (!strcmp(v, "qwen2.5-1.5b"))
        o->shape = qwen15;
      else
        return kivi_cli_bad(PROG, "unknown shape", v);
      o->shape_name = v;
    } else if (!strcmp(a, "--kv")) {
      o->n_kv = 0;
      for (const char *p = v; *p;) {
        const size_t len = strcspn(p, ",");
        int found = -1;
        for (int j = 0; j < N_KINDS; ++j)
          if (strlen(kinds[j].name) == len && !strncmp(p, kinds[j].name, len)) found = j;
        if (found < 0 || o->n_kv == N_KINDS) return kivi_cli_bad(PROG, "unknown cache in --kv", v);
        o->kv[o->n_kv++] = found;
        p += len + (p[len] == ',');
      }
      if (!o->n_kv) return kivi_cli_bad(PROG, "empty --kv", v);
    } else if (!strcmp(a, "--batches")) {
      if ((o->n_batches = parse_list(v, o->batches, 64)) < 1) return kivi_cli_bad(PROG, "bad batch list", v);
    } else if (!strcmp(a, "--json")) {
      o->json = v;
    } else if (!strcmp(a, "--device")) {
      if (!strcmp(v, "host"))
        o->device = KIVI_DEVICE_HOST;
      else if (!*v || *end || n < 0 || n > 1024)
        return kivi_cli_bad(PROG, "bad device", v);
      else
        o->device = (int)n;
    } else {
      if (!num) return kivi_cli_bad(PROG, "bad number", v);
      *(!strcmp(a, "--prompt") ? &o->prompt : !strcmp(a, "--gen") ? &o->gen : &o->chunk) = (int)n;
    }
  }
  return -1;
}

static void json_result(FILE *f, const run_result *r, int last) {
  fprintf(f,
          "      {\"batch\": %d, \"tokens_per_s\": %.1f, \"decode_tokens_per_s\": %.1f, \"prefill_s\": %.3f, "
          "\"decode_s\": %.3f, \"step_ms\": {\"matmul\": %.3f, \"attention\": %.3f, \"append\": %.3f, "
          "\"other\": %.3f}, \"memory_gb\": %.2f, \"cache_gb\": %.2f, \"bits_per_element\": %.2f, \"kernels\": %u}%s\n",
          r->batch, r->tok_s, r->decode_tok_s, r->prefill_s, r->decode_s, 1e3 * r->step.matmul,
          1e3 * r->step.attention, 1e3 * r->step.append, 1e3 * r->step.other, (double)r->mem_used / 1e9,
          (double)r->cache_bytes / 1e9, r->bits_per_element, r->kernels, last ? "" : ",");
}

int main(int argc, char **argv) {
  const int info = kivi_cli_info(argc, argv, PROG, kivi_version_string(), usage);
  if (info >= 0) return info;
  opts o;
  const int prc = parse(argc, argv, &o);
  if (prc >= 0) return prc;
  kivi_context *ctx = NULL;
  kivi_status st = kivi_context_create(&ctx, o.device);
  if (st) {
    fprintf(stderr, PROG ": device %d: %s\n", o.device, kivi_status_string(st));
    return 1;
  }
  kivi_context_info ci;
  if ((st = kivi_context_get_info(ctx, &ci)) != KIVI_OK) {
    fprintf(stderr, PROG ": %s\n", kivi_status_string(st));
    kivi_context_destroy(ctx);
    return 1;
  }
  llm_dev_model dm;
  char err[256];
  const double tw = omp_get_wtime();
  if (llm_dev_model_synthetic(&dm, &o.shape, 0x5EED, ci.device, LLM_DEV_F16, err, sizeof err)) {
    fprintf(stderr, PROG ": %s\n", err);
    kivi_context_destroy(ctx);
    return 1;
  }
  size_t total = 0;
  llm_dev_memory(&dm, &total);
  fprintf(stderr, PROG ": %s, %.2f GB of fp16 weights made in %.1f s on %s; products: %s\n", o.shape_name,
          (double)dm.weight_bytes / 1e9, omp_get_wtime() - tw, ci.on_gpu ? "the GPU" : "the host",
          llm_dev_matmul_name(&dm));
  if (!o.n_batches) {
    static const int gpu_default[] = {1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
    if (ci.on_gpu) {
      o.n_batches = (int)(sizeof gpu_default / sizeof *gpu_default);
      memcpy(o.batches, gpu_default, sizeof gpu_default);
    } else {
      o.n_batches = 2;
      o.batches[0] = 1;
      o.batches[1] = 2;
    }
  }
  const int search = ci.on_gpu && total && !o.no_max;
  if (o.max_only && !search) {
    fprintf(stderr, PROG ": --max-only needs a GPU (device memory to fill) and no --no-max\n");
    llm_dev_model_free(&dm);
    kivi_context_destroy(ctx);
    return 1;
  }
  FILE *jf = o.json ? fopen(o.json, "w") : NULL;
  if (o.json && !jf) {
    fprintf(stderr, PROG ": cannot write %s\n", o.json);
    llm_dev_model_free(&dm);
    kivi_context_destroy(ctx);
    return 1;
  }
  if (jf)
    fprintf(jf,
            "{\n  \"program\": \"" PROG "\", \"library\": \"%s\", \"shape\": \"%s\",\n"
            "  \"model\": {\"layers\": %d, \"dim\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
            "\"ffn\": %d, \"vocab\": %d, \"weight_gb\": %.2f},\n"
            "  \"prompt\": %d, \"generated\": %d, \"device\": \"%s\", \"device_memory_gb\": %.1f, \"matmul\": \"%s\", \"stream\": %s,\n"
            "  \"caches\": [\n",
            kivi_version_string(), o.shape_name, o.shape.n_layers, o.shape.dim, o.shape.n_heads, o.shape.n_kv_heads,
            o.shape.head_dim, o.shape.ffn_dim, o.shape.n_vocab, (double)dm.weight_bytes / 1e9, o.prompt, o.gen,
            ci.on_gpu ? "gpu" : "host", (double)total / 1e9, llm_dev_matmul_name(&dm), o.stream ? "true" : "false");
  if (!o.max_only)
    printf("%-10s %6s %10s %10s %8s %8s %8s %8s %8s %8s\n", "cache", "batch", "tok/s", "decode/s", "step ms", "matmul",
         "attn", "append", "other", "mem GB");
  int rc = 0;
  for (int ki = 0; ki < o.n_kv && !rc; ++ki) {
    const kv_kind *k = &kinds[o.kv[ki]];
    const int maxb = search ? max_batch(ctx, &dm, &o, k, total) : 0;
    if (search) fprintf(stderr, PROG ": %s: the largest batch that fits is %d\n", k->name, maxb);
    int list[65], n = 0; /* the batches to run: none with --max-only */
    size_t cb = 0;       /* --max-only: the cache's bytes at its largest batch */
    if (o.max_only) {
      cb = maxb > 0 ? cache_bytes(ctx, &o, k, maxb) : 0;
      printf("%-10s largest batch %d, cache %.2f GB\n", k->name, maxb, (double)cb / 1e9);
    } else {
      for (int i = 0; i < o.n_batches; ++i)
        if (!search || o.batches[i] < maxb) list[n++] = o.batches[i];
      if (search && maxb > 0) list[n++] = maxb;
    }
    if (jf) {
      fprintf(jf, "    {\"cache\": \"%s\", \"k_bits\": %d, \"v_bits\": %d, \"group\": 32, \"residual\": %d, \"max_batch\": %d, ",
              k->name, k->k_bits, k->v_bits, k->residual, maxb);
      if (o.max_only) fprintf(jf, "\"cache_gb\": %.2f, ", (double)cb / 1e9);
      fprintf(jf, "\"runs\": [\n");
    }
    for (int i = 0; i < n; ++i) {
      run_result r;
      st = run_batch(ctx, &dm, &o, k, list[i], 0, &r);
      if (st) {
        fprintf(stderr, PROG ": %s batch %d: %s\n", k->name, list[i], kivi_status_string(st));
        rc = 1;
        break;
      }
      const double step = r.step.matmul + r.step.attention + r.step.append + r.step.other;
      printf("%-10s %6d %10.1f %10.1f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", k->name, r.batch, r.tok_s, r.decode_tok_s,
             1e3 * step, 1e3 * r.step.matmul, 1e3 * r.step.attention, 1e3 * r.step.append, 1e3 * r.step.other,
             (double)r.mem_used / 1e9);
      if (jf) {
        json_result(jf, &r, i == n - 1);
        fflush(jf);
      }
    }
    if (jf) fprintf(jf, "    ]}%s\n", ki == o.n_kv - 1 || rc ? "" : ",");
  }
  if (jf) {
    fprintf(jf, "  ]\n}\n");
    fclose(jf);
  }
  llm_dev_model_free(&dm);
  kivi_context_destroy(ctx);
  return rc;
}
