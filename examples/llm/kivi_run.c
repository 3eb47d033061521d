/* kivi-run: a Llama- or Qwen2-architecture GGUF model (SmolLM2-135M-Instruct by default;
 * Qwen2.5-Coder-1.5B-Instruct and -0.5B through scripts/fetch-model.sh) running on a libkivi-omp
 * KV cache, in C.
 *
 *   kivi-run generate [--prompt TEXT] [--prompt-file F] | --prompts F [--max-tokens N] [--temperature T] ...
 *   kivi-run ppl FILE [--ctx N] [--max-tokens N] [--batch N] ...
 *   kivi-run passkey [--lengths 512,1024,...] [--trials N] ...
 *   kivi-run tokenize [--prompt TEXT | --prompt-file F]     (token ids, no template)
 *
 * Common options: --model PATH, --kv fp16|kivi2|kivi4, --k-bits/--v-bits/--group/--residual,
 * --fake-quant [--k-axis channel|token] [--v-axis token|channel], --chunk N, --device
 * default|host|N, --forward auto|host|device, --precision f16|f32, --no-stream, --json FILE, --quiet.  `kivi-run --help` lists
 * them all. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kivi.h>

#include "gguf.h"
#include "model.h"
#include "model_dev.h"
#include "tokenizer.h"
#include "../kivi_cli.h"

enum { FWD_AUTO, FWD_HOST, FWD_DEVICE };
enum { ROT_BY_AUTO, ROT_BY_CACHE, ROT_BY_MODEL };

typedef struct options {
  const char *cmd, *model, *json, *prompt, *prompt_file, *prompts, *text_file, *kv, *lengths, *system;
  int k_bits, v_bits, group, residual, chunk, device, quiet, raw, no_stream;
  int fake, k_per_token, v_per_channel, sink, pre_rope, rotate, v_clip;
  int rotate_by; /* ROT_BY_*: who rotates for --rotate */
  int max_tokens, ctx, trials;
  int batch; /* ppl: windows run together */
  int score_half; /* ppl --score second-half: llama-perplexity's scoring */
  int edge_layers, edge_k_bits, edge_v_bits; /* per-layer widths */
  int forward; /* FWD_*: where the model (not only the cache) runs */
  int f32;     /* --precision f32: the device model's weights and products in fp32 */
  int invariant; /* --batch-invariant: the device model's decode steps as each sequence alone */
  double temperature;
  unsigned long long seed;
} options;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char usage_text[] =
       "usage: kivi-run generate|ppl|passkey [options]\n"
        "  generate   stream a reply to --prompt TEXT or --prompt-file F (chat template; --raw: none);\n"
        "             with both, the file's text and then TEXT (a document and a question)\n"
        "             --max-tokens N (128) --temperature T (0 = greedy) --seed S --system TEXT\n"
        "             --prompts F: one prompt per line, all generated together (a batch; sequence i\n"
        "             samples with seed S + i), each reply printed when all are done;\n"
        "             --batch-invariant: on the device model, each decode step's products and\n"
        "             attention one sequence at a time, so that every reply is the one its prompt\n"
        "             gets alone, bit for bit (slower; the host model always runs so)\n"
        "  ppl FILE   perplexity of a text file: non-overlapping windows of --ctx N tokens (1024)\n"
        "             over its first --max-tokens N tokens (all); --chunk tokens per forward step;\n"
        "             --score all (every prediction of a window, default) or second-half (only the\n"
        "             predictions of tokens ctx/2+1 .. ctx-1 of each window, the first half being\n"
        "             context, as llama.cpp's llama-perplexity scores); --batch N windows at a time\n"
        "             (the same perplexity as one at a time)\n"
        "  passkey    find a 5-digit key hidden in filler text of --lengths 512,1024,2048,4096\n"
        "             tokens, --trials N key positions per length (5)\n"
        "  tokenize   print the token ids of --prompt TEXT or --prompt-file F (no template)\n"
        "common:\n"
        "  --model PATH       GGUF model, llama or qwen2 ($KIVI_MODEL, else\n"
        "                     ~/.cache/libkivi-omp/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
        "  --kv fp16|kivi2|kivi4   cache setting (kivi2: 2-bit K and V, G=32, R=128)\n"
        "  --k-bits B --v-bits B --group G --residual R   override the setting (bits 2,4,8,16)\n"
        "  --edge-layers N    per-layer widths: the first and the last N layers in a cache of their own\n"
        "                     with --edge-k-bits B (4) and --edge-v-bits B (the others' V bits)\n"
        "  --fake-quant       quantize every K/V vector before use, no fp16 window (paper baseline);\n"
        "                     --k-axis channel|token (channel) --v-axis token|channel (token);\n"
        "                     --pre-rope: keys quantized before the rotary embedding\n"
        "  --sink N           the first N tokens of each sequence kept in fp16, never quantized (the\n"
        "                     cache's kivi_cache_config.sinks; simulated with --fake-quant)\n"
        "  --v-clip           each quantized value group takes the best of nine ranges narrowed about\n"
        "                     its centre (kivi_cache_config.v_clip = KIVI_CLIP_MSE; not with --fake-quant)\n"
        "  --rotate v|k|kv    an orthonormal Hadamard transform of each V and/or K head vector before\n"
        "                     it is cached (q rotated alike, outputs rotated back; head_dim 2^n)\n"
        "  --rotate-by cache|model   who rotates: the cache (kivi_cache_config.rotate; the default)\n"
        "                     or the model around it (the only way with --fake-quant)\n"
        "  --chunk N          tokens per forward step for prompts and ppl (32; a divisor of R keeps\n"
        "                     the quantized cache exactly as token-by-token decoding would see it)\n"
        "  --device default|host|N   where the cache and attention run (default: the GPU if any)\n"
        "  --forward auto|host|device   where the rest of the model runs: device = the cache's\n"
        "                     device (on a GPU: fp16 weights, cuBLAS products, OpenMP target\n"
        "                     regions), host = fp32 on host threads; auto (default) = device when\n"
        "                     the cache is on a GPU and no --fake-quant or --edge-layers\n"
        "  --precision f16|f32   the device model's weights and product inputs (f16, default) or\n"
        "                     fp32 throughout, as the host model computes (cuBLAS without TF32)\n"
        "  --no-stream        on a GPU, each call of the model waited for (default: every forward\n"
        "                     step enqueued on one CUDA stream, waited for once)\n"
        "  --json FILE        write the results as JSON\n"
        "  --quiet            no progress on stderr\n";

static int parse_int(const char *s, int *out) {
  char *end;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < -1000000000L || v > 1000000000L) return -1;
  *out = (int)v;
  return 0;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->kv = "kivi2";
  o->k_bits = o->v_bits = o->group = o->residual = -1;
  o->edge_k_bits = 4;
  o->edge_v_bits = -1;
  o->chunk = 32;
  o->device = KIVI_DEVICE_DEFAULT;
  o->max_tokens = -1;
  o->ctx = 1024;
  o->trials = 5;
  o->batch = 1;
  o->lengths = "512,1024,2048,4096";
  o->seed = 1234;
  if (argc < 2) return -1;
  o->cmd = argv[1];
  if (strcmp(o->cmd, "generate") && strcmp(o->cmd, "ppl") && strcmp(o->cmd, "passkey") && strcmp(o->cmd, "tokenize")) {
    (void)kivi_cli_bad("kivi-run", o->cmd[0] == '-' ? "unknown option (the command comes first: generate, ppl, passkey or tokenize)"
                                                    : "unknown command (generate, ppl, passkey or tokenize)", o->cmd);
    return -2;
  }
  for (int i = 2; i < argc; ++i) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    int *iv = NULL;
    const char **sv = NULL;
    if (!strcmp(a, "--fake-quant")) { o->fake = 1; continue; }
    if (!strcmp(a, "--pre-rope")) { o->pre_rope = 1; continue; }
    if (!strcmp(a, "--v-clip")) { o->v_clip = 1; continue; }
    if (!strcmp(a, "--quiet")) { o->quiet = 1; continue; }
    if (!strcmp(a, "--no-stream")) { o->no_stream = 1; continue; }
    if (!strcmp(a, "--raw")) { o->raw = 1; continue; }
    if (!strcmp(a, "--batch-invariant")) { o->invariant = 1; continue; }
    if (!strcmp(a, "--model")) sv = &o->model;
    else if (!strcmp(a, "--json")) sv = &o->json;
    else if (!strcmp(a, "--prompt")) sv = &o->prompt;
    else if (!strcmp(a, "--prompt-file")) sv = &o->prompt_file;
    else if (!strcmp(a, "--prompts")) sv = &o->prompts;
    else if (!strcmp(a, "--batch")) iv = &o->batch;
    else if (!strcmp(a, "--system")) sv = &o->system;
    else if (!strcmp(a, "--kv")) sv = &o->kv;
    else if (!strcmp(a, "--lengths")) sv = &o->lengths;
    else if (!strcmp(a, "--k-bits")) iv = &o->k_bits;
    else if (!strcmp(a, "--v-bits")) iv = &o->v_bits;
    else if (!strcmp(a, "--group")) iv = &o->group;
    else if (!strcmp(a, "--residual")) iv = &o->residual;
    else if (!strcmp(a, "--chunk")) iv = &o->chunk;
    else if (!strcmp(a, "--max-tokens")) iv = &o->max_tokens;
    else if (!strcmp(a, "--ctx")) iv = &o->ctx;
    else if (!strcmp(a, "--trials")) iv = &o->trials;
    else if (!strcmp(a, "--edge-layers")) iv = &o->edge_layers;
    else if (!strcmp(a, "--sink")) iv = &o->sink;
    else if (!strcmp(a, "--edge-k-bits")) iv = &o->edge_k_bits;
    else if (!strcmp(a, "--edge-v-bits")) iv = &o->edge_v_bits;
    else if (!strcmp(a, "--k-axis") || !strcmp(a, "--v-axis") || !strcmp(a, "--device") || !strcmp(a, "--score") ||
             !strcmp(a, "--rotate") || !strcmp(a, "--rotate-by") || !strcmp(a, "--forward") || !strcmp(a, "--precision") ||
             !strcmp(a, "--temperature") || !strcmp(a, "--seed")) {
      if (!val) goto missing;
      ++i;
      if (!strcmp(a, "--forward")) {
        if (!strcmp(val, "auto")) o->forward = FWD_AUTO;
        else if (!strcmp(val, "host")) o->forward = FWD_HOST;
        else if (!strcmp(val, "device")) o->forward = FWD_DEVICE;
        else goto bad;
      } else if (!strcmp(a, "--precision")) {
        if (strcmp(val, "f16") && strcmp(val, "f32")) goto bad;
        o->f32 = !strcmp(val, "f32");
      } else if (!strcmp(a, "--rotate-by")) {
        if (!strcmp(val, "cache")) o->rotate_by = ROT_BY_CACHE;
        else if (!strcmp(val, "model")) o->rotate_by = ROT_BY_MODEL;
        else goto bad;
      } else if (!strcmp(a, "--rotate")) {
        if (strcmp(val, "v") && strcmp(val, "k") && strcmp(val, "kv")) goto bad;
        o->rotate = (strchr(val, 'v') ? LLM_ROTATE_V : 0) | (strchr(val, 'k') ? LLM_ROTATE_K : 0);
      } else if (!strcmp(a, "--score")) {
        if (strcmp(val, "all") && strcmp(val, "second-half")) goto bad;
        o->score_half = !strcmp(val, "second-half");
      } else if (!strcmp(a, "--k-axis")) {
        if (strcmp(val, "channel") && strcmp(val, "token")) goto bad;
        o->k_per_token = !strcmp(val, "token");
      } else if (!strcmp(a, "--v-axis")) {
        if (strcmp(val, "channel") && strcmp(val, "token")) goto bad;
        o->v_per_channel = !strcmp(val, "channel");
      } else if (!strcmp(a, "--device")) {
        if (!strcmp(val, "default")) o->device = KIVI_DEVICE_DEFAULT;
        else if (!strcmp(val, "host")) o->device = KIVI_DEVICE_HOST;
        else if (parse_int(val, &o->device) || o->device < 0) goto bad;
      } else if (!strcmp(a, "--temperature")) {
        char *end;
        o->temperature = strtod(val, &end);
        if (*end || !(o->temperature >= 0 && o->temperature <= 100)) goto bad;
      } else {
        char *end;
        o->seed = strtoull(val, &end, 10);
        if (*end) goto bad;
      }
      continue;
    } else if (a[0] != '-' && !strcmp(o->cmd, "ppl") && !o->text_file) {
      o->text_file = a;
      continue;
    } else {
      (void)kivi_cli_bad("kivi-run", "unknown option", a);
      return -2;
    }
    if (!val) goto missing;
    ++i;
    if (sv) *sv = val;
    else if (parse_int(val, iv)) goto bad;
    continue;
  missing:
    fprintf(stderr, "kivi-run: %s needs a value\n", a);
    return -1;
  bad:
    fprintf(stderr, "kivi-run: bad value '%s' for %s\n", val, a);
    return -1;
  }
  if (o->chunk < 1 || o->chunk > 8192 || o->ctx < 2 || o->trials < 1) {
    fprintf(stderr, "kivi-run: --chunk must be 1..8192, --ctx >= 2, --trials >= 1\n");
    return -1;
  }
  if (!strcmp(o->cmd, "ppl") && !o->text_file) {
    fprintf(stderr, "kivi-run ppl: give the text file\n");
    return -1;
  }
  return 0;
}

/* The cache setting: --kv, then the overrides.  *kbits / *vbits: the requested bits (with
 * --fake-quant the simulated ones; the cache itself then stores fp16). */
static int cache_setting(const options *o, kivi_cache_config *cfg, char *name, size_t nlen, int *kbits, int *vbits) {
  int kb = 2, vb = 2;
  if (!strcmp(o->kv, "fp16")) kb = vb = 16;
  else if (!strcmp(o->kv, "kivi4")) kb = vb = 4;
  else if (strcmp(o->kv, "kivi2")) {
    fprintf(stderr, "kivi-run: --kv must be fp16, kivi2 or kivi4\n");
    return -1;
  }
  if (o->k_bits > 0) kb = o->k_bits;
  if (o->v_bits > 0) vb = o->v_bits;
  if (o->group > 0) cfg->group = o->group;
  if (o->residual > 0) cfg->residual = o->residual;
  cfg->k_bits = *kbits = kb;
  cfg->v_bits = *vbits = vb;
  if (o->fake) {
    snprintf(name, nlen, "fake-quant K%d(%s%s) V%d(%s) G%d%s", kb, o->k_per_token ? "token" : "channel",
             o->pre_rope ? ", pre-RoPE" : "", vb, o->v_per_channel ? "channel" : "token", cfg->group,
             o->sink ? ", sinks" : "");
    cfg->k_bits = cfg->v_bits = 16; /* the cache stores the fake-quantized values in fp16 */
  } else if (kb == 16 && vb == 16) {
    snprintf(name, nlen, "fp16");
  } else {
    snprintf(name, nlen, "kivi K%d V%d G%d R%d", kb, vb, cfg->group, cfg->residual);
  }
  return 0;
}

typedef struct runner {
  options o;
  gguf_file file;
  llm_model model;
  llm_tokenizer *tok;
  kivi_context *ctx;
  kivi_cache *cache, *edge;
  kivi_cache_config cfg;
  llm_session sess;
  int n_seqs;         /* sequence slots of the cache (a batch); 0 means 1 */
  int on_dev;         /* the model runs through model_dev.c on the cache's device */
  llm_dev_model dm;
  llm_dev_batch db;
  char setting[96];
  int kbits, vbits; /* requested (fake-quant: simulated) */
  FILE *json;
  char path[1024]; /* the model file */
} runner;

/* --model, else $KIVI_MODEL, else the fetch script's cache. */
static const char *model_path(const options *o, char *buf, size_t n) {
  const char *path = o->model ? o->model : getenv("KIVI_MODEL");
  if (path) return path;
  const char *home = getenv("HOME");
  snprintf(buf, n, "%s/.cache/libkivi-omp/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
  return buf;
}

/* Maps the model file and loads the weights and the tokenizer. */
static int runner_open(runner *r) {
  char err[512];
  const char *path = model_path(&r->o, r->path, sizeof r->path);
  if (path != r->path) snprintf(r->path, sizeof r->path, "%s", path);
  if (gguf_open(r->path, &r->file, err, sizeof err)) {
    fprintf(stderr, "kivi-run: %s: %s\n(fetch the model with: sh scripts/fetch-model.sh)\n", r->path, err);
    return -1;
  }
  if (llm_model_load(&r->file, &r->model, err, sizeof err) || llm_tokenizer_load(&r->file, &r->tok, err, sizeof err)) {
    fprintf(stderr, "kivi-run: %s: %s\n", r->path, err);
    return -1;
  }
  return 0;
}

/* A cache of config cfg, or -1 after saying why not (the rule a refused config breaks). */
static int create_cache(kivi_context *ctx, const kivi_cache_config *cfg, kivi_cache **cache, const char *what) {
  const kivi_status st = kivi_cache_create(ctx, cfg, cache);
  if (!st) return 0;
  const char *why = kivi_cache_config_reason(cfg);
  fprintf(stderr, "kivi-run: cache (%s): %s%s%s\n", what, kivi_status_string(st), *why ? ": " : "", why);
  return -1;
}

/* Appends to the setting's description (truncated to its buffer). */
__attribute__((format(printf, 2, 3))) static void setting_add(runner *r, const char *fmt, ...) {
  const size_t len = strlen(r->setting);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->setting + len, sizeof r->setting - len, fmt, ap);
  va_end(ap);
}

/* The device context, a cache of max_len tokens in the chosen setting, the session; prints the
 * setup and starts the JSON. */
static int runner_start(runner *r, int max_len) {
  const char *path = r->path;
  const llm_model *m = &r->model;
  if (max_len > m->ctx_train) {
    fprintf(stderr, "kivi-run: %d tokens exceed the model's context of %d\n", max_len, m->ctx_train);
    return -1;
  }
  kivi_status st = kivi_context_create(&r->ctx, r->o.device);
  if (st) {
    fprintf(stderr, "kivi-run: device: %s\n", kivi_status_string(st));
    return -1;
  }
  if (r->n_seqs < 1) r->n_seqs = 1;
  kivi_cache_config_init(&r->cfg, m->n_layers, m->n_kv_heads, m->head_dim, r->n_seqs, max_len);
  if (cache_setting(&r->o, &r->cfg, r->setting, sizeof r->setting, &r->kbits, &r->vbits)) return -1;
  /* --rotate: by the cache's option unless simulated (--fake-quant) or asked of the model */
  if (r->o.rotate_by == ROT_BY_CACHE && r->o.fake) {
    fprintf(stderr, "kivi-run: --fake-quant simulates the cache: --rotate-by model\n");
    return -1;
  }
  const int by_cache = r->o.rotate && r->o.rotate_by != ROT_BY_MODEL && !r->o.fake;
  if (by_cache)
    r->cfg.rotate = (r->o.rotate & LLM_ROTATE_K ? KIVI_ROTATE_K : 0) | (r->o.rotate & LLM_ROTATE_V ? KIVI_ROTATE_V : 0);
  const int model_rotate = by_cache ? 0 : r->o.rotate;
  if (!r->o.fake) r->cfg.sinks = r->o.sink; /* the cache's sink tokens (simulated with --fake-quant) */
  if (r->o.v_clip && r->o.fake) {
    fprintf(stderr, "kivi-run: --v-clip is the cache's option: not with --fake-quant\n");
    return -1;
  }
  r->cfg.v_clip = r->o.v_clip ? KIVI_CLIP_MSE : KIVI_CLIP_NONE;
  if (create_cache(r->ctx, &r->cfg, &r->cache, r->setting)) return -1;
  if (r->cfg.sinks) setting_add(r, ", %d sink tokens", r->cfg.sinks);
  if (r->cfg.v_clip) setting_add(r, ", searched V ranges");
  if (r->o.edge_layers > 0) { /* the first and last layers in a cache of their own widths */
    if (2 * r->o.edge_layers >= m->n_layers || r->o.fake) {
      fprintf(stderr, "kivi-run: --edge-layers must be below half the %d layers (and without --fake-quant)\n", m->n_layers);
      return -1;
    }
    kivi_cache_config e = r->cfg;
    e.n_layers = 2 * r->o.edge_layers;
    e.k_bits = r->o.edge_k_bits;
    e.v_bits = r->o.edge_v_bits > 0 ? r->o.edge_v_bits : r->cfg.v_bits;
    if (create_cache(r->ctx, &e, &r->edge, "edge layers")) return -1;
    setting_add(r, ", layers 0-%d and %d-%d K%d V%d", r->o.edge_layers - 1, m->n_layers - r->o.edge_layers,
                m->n_layers - 1, e.k_bits, e.v_bits);
  }
  if (r->o.pre_rope && !r->o.fake) {
    fprintf(stderr, "kivi-run: --pre-rope is simulated: it needs --fake-quant\n");
    return -1;
  }
  llm_fake_quant fq = {r->o.fake, r->kbits, r->vbits, r->cfg.group, r->o.k_per_token, r->o.v_per_channel, r->o.sink,
                       r->o.pre_rope, model_rotate};
  if (r->o.pre_rope && (r->o.rotate & LLM_ROTATE_K)) {
    fprintf(stderr, "kivi-run: --pre-rope quantizes keys before RoPE, --rotate k after it: choose one\n");
    return -1;
  }
  if (r->o.rotate && (m->head_dim & (m->head_dim - 1))) {
    fprintf(stderr, "kivi-run: --rotate needs a head_dim that is a power of two (this model: %d)\n", m->head_dim);
    return -1;
  }
  if (r->o.rotate)
    setting_add(r, ", Hadamard-rotated %s by the %s",
                r->o.rotate == LLM_ROTATE_V ? "V" : r->o.rotate == LLM_ROTATE_K ? "K" : "K and V",
                by_cache ? "cache" : "model");
  if (r->o.fake && (r->kbits > 8 || r->vbits > 8 || r->kbits < 1 || r->vbits < 1)) {
    fprintf(stderr, "kivi-run: --fake-quant needs K/V bits of 1..8\n");
    return -1;
  }
  if (llm_session_init(&r->sess, m, r->cache, 0, r->o.chunk, &fq)) {
    fprintf(stderr, "kivi-run: out of memory\n");
    return -1;
  }
  r->sess.edge = r->edge;
  r->sess.n_edge = r->o.edge_layers;
  kivi_context_info info;
  (void)kivi_context_get_info(r->ctx, &info);
  const int simulated = r->o.fake || r->o.edge_layers > 0;
  if (r->o.forward == FWD_DEVICE && simulated) {
    fprintf(stderr, "kivi-run: --forward device runs the model with one cache and no simulation: no --fake-quant or --edge-layers\n");
    return -1;
  }
  r->on_dev = r->o.forward == FWD_DEVICE || (r->o.forward == FWD_AUTO && info.on_gpu && !simulated);
  if (r->on_dev) {
    char err[256];
    if (llm_dev_model_from_host(&r->dm, m, info.device, r->o.f32 ? LLM_DEV_F32 : LLM_DEV_F16, err, sizeof err)) {
      fprintf(stderr, "kivi-run: model on the device: %s\n", err);
      return -1;
    }
    r->dm.rotate = model_rotate;
    const int rows = r->o.chunk * r->n_seqs;
    if (llm_dev_batch_init(&r->db, &r->dm, rows, r->n_seqs, rows)) {
      fprintf(stderr, "kivi-run: out of device memory for the activations\n");
      return -1;
    }
    r->db.invariant = r->o.invariant;
    if (info.on_gpu && !r->o.no_stream && llm_dev_batch_set_stream(&r->db, r->cache, 1) && !r->o.quiet)
      fprintf(stderr, "kivi-run: no CUDA stream here (cuBLAS or the CUDA driver missing): calls waited for one by one\n");
  }
  if (!r->o.quiet) {
    fprintf(stderr, "kivi-run: %s: %d layers, %d heads / %d kv-heads x %d, vocab %d; weights %.0f MB fp32; "
                    "cache %s on %s\n",
            path, m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->n_vocab, m->weight_bytes / 1e6, r->setting,
            info.on_gpu ? "the GPU" : "host threads");
    if (r->on_dev)
      fprintf(stderr, "kivi-run: the model on %s too: %.0f MB of %s weights, products by %s%s\n",
              info.on_gpu ? "the GPU" : "host threads (device code)", r->dm.weight_bytes / 1e6, r->dm.f32 ? "fp32" : "fp16",
              llm_dev_matmul_name(&r->dm), r->db.stream ? ", each step on one CUDA stream" : "");
  }
  if (r->o.json) {
    r->json = fopen(r->o.json, "w");
    if (!r->json) {
      fprintf(stderr, "kivi-run: cannot write %s\n", r->o.json);
      return -1;
    }
    fprintf(r->json, "{\n  \"command\": \"%s\",\n  \"model\": \"%s\",\n  \"setting\": \"%s\",\n", r->o.cmd, path,
            r->setting);
    fprintf(r->json, "  \"k_bits\": %d, \"v_bits\": %d, \"group\": %d, \"residual\": %d, \"fake_quant\": %s,\n",
            r->kbits, r->vbits, r->cfg.group, r->o.fake ? 0 : r->cfg.residual, r->o.fake ? "true" : "false");
    if (r->o.fake)
      fprintf(r->json, "  \"k_axis\": \"%s\", \"v_axis\": \"%s\",\n", r->o.k_per_token ? "token" : "channel",
              r->o.v_per_channel ? "channel" : "token");
    fprintf(r->json, "  \"chunk\": %d, \"on_gpu\": %s, \"forward\": \"%s\", \"precision\": \"%s\", \"batch_invariant\": %s, \"stream\": %s, \"library\": \"%s\",\n",
            r->o.chunk, info.on_gpu ? "true" : "false", r->on_dev ? "device" : "host", r->on_dev && !r->dm.f32 ? "f16" : "f32",
            !r->on_dev || r->o.invariant ? "true" : "false",
            r->on_dev && r->db.stream ? "true" : "false", kivi_version_string());
  }
  return 0;
}

static void runner_close(runner *r) {
  if (r->json) fclose(r->json);
  if (r->on_dev) {
    if (r->db.stream) (void)llm_dev_batch_set_stream(&r->db, r->cache, 0);
    llm_dev_batch_free(&r->db);
    llm_dev_model_free(&r->dm);
  }
  llm_session_free(&r->sess);
  kivi_cache_destroy(r->cache);
  kivi_cache_destroy(r->edge);
  kivi_context_destroy(r->ctx);
  llm_tokenizer_free(r->tok);
  llm_model_free(&r->model);
  gguf_close(&r->file);
}

/* Runs n tokens of the sequence (n <= chunk) where the model lives; logits NULL, or of the last
 * token ([n_vocab]), or with `all` of every token ([n][n_vocab]). */
static kivi_status forward_seqs(runner *r, int ns, const int *seq_ids, const int *toks, int n, const int *pos,
                                float *logits, int all);
static kivi_status forward(runner *r, const int *ids, int n, float *logits, int all) {
  if (n < 1 || n > r->o.chunk) return KIVI_ERR_ARG;
  const int seq = r->sess.seq_id, pos = r->sess.pos;
  const kivi_status st = forward_seqs(r, 1, &seq, ids, n, &pos, logits, all);
  if (!st) r->sess.pos += n;
  return st;
}

/* Runs n tokens of each of the sequences seq_ids[0..ns) (toks: [ns][n], at positions pos[i]..),
 * one call on the device or one sequence after another on the host; logits NULL, or [ns][n_vocab]
 * of each sequence's last token, or with `all` [ns][n][n_vocab]. */
static kivi_status forward_seqs(runner *r, int ns, const int *seq_ids, const int *toks, int n, const int *pos,
                                float *logits, int all) {
  const size_t V = (size_t)r->model.n_vocab;
  if (r->on_dev) {
    int *nn = malloc((size_t)ns * sizeof *nn);
    if (!nn) return KIVI_ERR_NOMEM;
    for (int i = 0; i < ns; ++i) nn[i] = n;
    const kivi_status st = llm_dev_forward(&r->db, r->cache, ns, seq_ids, nn, pos, toks, logits, all && logits, NULL, NULL);
    free(nn);
    return st;
  }
  const int seq0 = r->sess.seq_id, pos0 = r->sess.pos; /* the session's scratch serves each in turn */
  kivi_status st = KIVI_OK;
  for (int i = 0; i < ns && !st; ++i) {
    r->sess.seq_id = seq_ids[i];
    r->sess.pos = pos[i];
    st = llm_forward(&r->sess, toks + (size_t)i * n, n, logits ? logits + (size_t)i * (all ? n : 1) * V : NULL, all);
  }
  r->sess.seq_id = seq0;
  r->sess.pos = pos0;
  return st;
}

/* Runs a prompt in chunks; logits of the last token into `last`. */
static kivi_status prefill(runner *r, const int *ids, int n, float *last) {
  for (int i = 0; i < n; i += r->o.chunk) {
    const int c = n - i < r->o.chunk ? n - i : r->o.chunk;
    kivi_status st = forward(r, ids + i, c, i + c == n ? last : NULL, 0);
    if (st) return st;
  }
  return KIVI_OK;
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int pick_token(const float *logits, int n, double temperature, uint64_t *rng) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  if (temperature <= 0) return best;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += exp((logits[i] - logits[best]) / temperature);
  double u = (double)(rng_next(rng) >> 11) * 0x1.0p-53 * sum;
  for (int i = 0; i < n; ++i) {
    u -= exp((logits[i] - logits[best]) / temperature);
    if (u <= 0) return i;
  }
  return best;
}

static void json_string(FILE *f, const char *s, size_t n) {
  fputc('"', f);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  for (size_t got; buf && (got = fread(buf + len, 1, cap - len, f)) > 0;) {
    len += got;
    if (len == cap) {
      char *p = realloc(buf, 2 * cap + 1);
      if (!p) { free(buf); buf = NULL; break; }
      buf = p;
      cap *= 2;
    }
  }
  fclose(f);
  if (buf) buf[len] = 0;
  *n = len;
  return buf;
}

static void print_memory(runner *r, FILE *out) {
  kivi_cache_stats st, se;
  if (kivi_cache_get_stats(r->cache, &st) || !st.tokens) return;
  if (r->edge && !kivi_cache_get_stats(r->edge, &se)) { /* both caches' tokens and bytes */
    st.tokens += se.tokens;
    st.total_bytes += se.total_bytes;
    st.fp16_bytes += se.fp16_bytes;
    st.bits_per_element = 16.0 * (double)st.total_bytes / (double)st.fp16_bytes; /* fp16 is 16 bits/element */
  }
  fprintf(out, "KV cache: %lld tokens x %d layers in %.2f MB (%s) vs %.2f MB as fp16: %.2fx smaller, %.2f bits/element\n",
          (long long)(st.tokens / r->model.n_layers), r->model.n_layers, st.total_bytes / 1e6, r->setting,
          st.fp16_bytes / 1e6, (double)st.fp16_bytes / (double)st.total_bytes, st.bits_per_element);
  if (r->json)
    fprintf(r->json, "  \"cache_tokens\": %lld, \"cache_bytes\": %zu, \"fp16_bytes\": %zu, \"bits_per_element\": %.4f,\n",
            (long long)st.tokens, st.total_bytes, st.fp16_bytes, st.bits_per_element);
}

/* The prompt text: --prompt-file's text, and --prompt after it (a blank line between them) when
 * both are given, so a document and a question about it make one prompt; a default question
 * when neither is. */
static char *prompt_text(const options *o, size_t *n) {
  if (o->prompt_file) {
    char *t = read_file(o->prompt_file, n);
    if (!t) {
      fprintf(stderr, "kivi-run: cannot read %s\n", o->prompt_file);
      return NULL;
    }
    if (o->prompt) {
      const size_t m = strlen(o->prompt);
      char *u = realloc(t, *n + 2 + m + 1);
      if (!u) {
        free(t);
        return NULL;
      }
      memcpy(u + *n, "\n\n", 2);
      memcpy(u + *n + 2, o->prompt, m + 1);
      *n += 2 + m;
      t = u;
    }
    return t;
  }
  char *t = strdup(o->prompt ? o->prompt : "What is the capital of France? Answer in one sentence.");
  *n = t ? strlen(t) : 0;
  return t;
}

/* Tokenizes text with the file's tokenizer alone (the weights are not loaded), no template. */
static int tokenize_raw(const options *o, const char *text, size_t n, int **ids, size_t *nids, size_t *cap) {
  gguf_file f;
  char err[512], def[1024];
  llm_tokenizer *tok = NULL;
  const char *path = model_path(o, def, sizeof def);
  if (gguf_open(path, &f, err, sizeof err) || llm_tokenizer_load(&f, &tok, err, sizeof err)) {
    fprintf(stderr, "kivi-run: %s: %s\n(fetch the model with: sh scripts/fetch-model.sh)\n", path, err);
    gguf_close(&f);
    return -1;
  }
  const int rc = llm_tokenize(tok, text, n, 0, ids, nids, cap);
  llm_tokenizer_free(tok);
  gguf_close(&f);
  return rc;
}

/* ---- tokenize --------------------------------------------------------------------------- */
static int cmd_tokenize(options *o) {
  size_t plen = 0, n = 0, cap = 0;
  int *ids = NULL;
  char *ptext = prompt_text(o, &plen);
  if (!ptext || tokenize_raw(o, ptext, plen, &ids, &n, &cap)) {
    free(ptext);
    return 1;
  }
  for (size_t i = 0; i < n; ++i) printf("%d%c", ids[i], i + 1 < n ? ' ' : '\n');
  free(ids);
  free(ptext);
  return 0;
}

/* ---- generate --------------------------------------------------------------------------- */
static int cmd_generate_batch(options *o);

static int cmd_generate(options *o) {
  if (o->prompts) return cmd_generate_batch(o);
  size_t plen = 0;
  char *ptext = prompt_text(o, &plen);
  if (!ptext) return 1;
  const int max_new = o->max_tokens < 0 ? 128 : o->max_tokens;
  runner r = {.o = *o};
  int rc = 1, *ids = NULL;
  size_t n = 0, cap = 0;
  /* the cache must hold the prompt and the reply: tokenize first (the chat template unless raw) */
  if (runner_open(&r)) goto out;
  if (o->raw ? llm_tokenize(r.tok, ptext, plen, 0, &ids, &n, &cap)
             : llm_chat_prompt(r.tok, o->system, ptext, &ids, &n, &cap))
    goto out;
  if (n == 0) {
    fprintf(stderr, "kivi-run: empty prompt\n");
    goto out;
  }
  if (runner_start(&r, (int)n + max_new)) goto out;
  const int V = r.model.n_vocab, eos = llm_tokenizer_eos(r.tok);
  float *logits = malloc((size_t)V * sizeof *logits);
  char *text = malloc(64 * (size_t)max_new + 64);
  size_t tlen = 0;
  if (!logits || !text) goto out_free;
  uint64_t rng = o->seed;
  const double t0 = now_s();
  kivi_status st = prefill(&r, ids, (int)n, logits);
  const double t1 = now_s();
  int produced = 0;
  for (; !st && produced < max_new; ++produced) {
    const int next = pick_token(logits, V, o->temperature, &rng);
    if (next == eos) break;
    char piece[256];
    const size_t pl = llm_token_bytes(r.tok, next, piece, sizeof piece);
    fwrite(piece, 1, pl, stdout);
    fflush(stdout);
    if (tlen + pl < 64 * (size_t)max_new + 64) {
      memcpy(text + tlen, piece, pl);
      tlen += pl;
    }
    if (produced + 1 < max_new) st = forward(&r, &next, 1, logits, 0);
  }
  const double t2 = now_s();
  printf("\n");
  fflush(stdout);
  if (st) {
    fprintf(stderr, "kivi-run: %s\n", kivi_status_string(st));
    goto out_free;
  }
  const double pre_tps = n / (t1 - t0), gen_tps = produced > 1 ? (produced - 1) / (t2 - t1) : 0;
  fprintf(stderr, "prompt: %zu tokens at %.1f tokens/s; generated %d tokens at %.1f tokens/s\n", n, pre_tps,
          produced, gen_tps);
  print_memory(&r, stderr);
  if (r.json) {
    fprintf(r.json, "  \"prompt_tokens\": %zu, \"generated_tokens\": %d,\n", n, produced);
    fprintf(r.json, "  \"prompt_tokens_per_s\": %.3f, \"generate_tokens_per_s\": %.3f,\n  \"text\": ", pre_tps, gen_tps);
    json_string(r.json, text, tlen);
    fprintf(r.json, "\n}\n");
  }
  rc = 0;
out_free:
  free(logits);
  free(text);
out:
  runner_close(&r);
  free(ids);
  free(ptext);
  return rc;
}

/* generate --prompts FILE: every line a prompt, all generated together.  Each prompt runs alone
 * through its chunks (its own length), then every unfinished sequence takes one decode step per
 * forward call. */
static int cmd_generate_batch(options *o) {
  size_t flen = 0;
  char *file = read_file(o->prompts, &flen);
  if (!file) {
    fprintf(stderr, "kivi-run: cannot read %s\n", o->prompts);
    return 1;
  }
  const int max_new = o->max_tokens < 0 ? 128 : o->max_tokens;
  runner r = {.o = *o};
  int rc = 1, ns = 0, maxlen = 0;
  enum { MAX_PROMPTS = 1024 };
  int *ids[MAX_PROMPTS] = {0};
  size_t nids[MAX_PROMPTS] = {0}, cap = 0;
  char *texts[MAX_PROMPTS] = {0};
  size_t tlens[MAX_PROMPTS] = {0};
  int *seqs = NULL, *pos = NULL, *toks = NULL, *done = NULL, *count = NULL, *apos = NULL;
  uint64_t *rng = NULL;
  float *logits = NULL, *al = NULL;
  if (runner_open(&r)) goto out;
  for (char *line = file, *end; line < file + flen; line = end + 1) {
    end = memchr(line, '\n', (size_t)(file + flen - line));
    if (!end) end = file + flen;
    if (end == line) continue;
    if (ns == MAX_PROMPTS) {
      fprintf(stderr, "kivi-run: more than %d prompts in %s\n", MAX_PROMPTS, o->prompts);
      goto out;
    }
    cap = 0;
    char *user = strndup(line, (size_t)(end - line));
    const int bad = !user || (o->raw ? llm_tokenize(r.tok, user, strlen(user), 0, &ids[ns], &nids[ns], &cap)
                                     : llm_chat_prompt(r.tok, o->system, user, &ids[ns], &nids[ns], &cap));
    free(user);
    if (bad) goto out;
    if (nids[ns] == 0) continue;
    maxlen = (int)nids[ns] > maxlen ? (int)nids[ns] : maxlen;
    ++ns;
  }
  if (ns == 0) {
    fprintf(stderr, "kivi-run: no prompt in %s\n", o->prompts);
    goto out;
  }
  r.n_seqs = ns;
  if (runner_start(&r, maxlen + max_new)) goto out;
  const int V = r.model.n_vocab, eos = llm_tokenizer_eos(r.tok);
  logits = malloc((size_t)ns * V * sizeof *logits);
  seqs = malloc((size_t)ns * sizeof *seqs), pos = malloc((size_t)ns * sizeof *pos);
  toks = malloc((size_t)ns * sizeof *toks), done = calloc((size_t)ns, sizeof *done);
  count = calloc((size_t)ns, sizeof *count), apos = malloc((size_t)ns * sizeof *apos);
  al = malloc((size_t)ns * V * sizeof *al);
  rng = malloc((size_t)ns * sizeof *rng);
  for (int i = 0; i < ns; ++i) texts[i] = malloc(64 * (size_t)max_new + 64);
  if (!logits || !seqs || !pos || !toks || !done || !count || !apos || !al || !rng) goto out;
  for (int i = 0; i < ns; ++i)
    if (!texts[i]) goto out;
  kivi_status st = KIVI_OK;
  long long prompt_tokens = 0, generated = 0;
  const double t0 = now_s();
  for (int i = 0; i < ns && !st; ++i) { /* each prompt alone, in chunks: its logits into row i */
    rng[i] = o->seed + (uint64_t)i;
    for (int p = 0; p < (int)nids[i] && !st; p += o->chunk) {
      const int c = (int)nids[i] - p < o->chunk ? (int)nids[i] - p : o->chunk;
      st = forward_seqs(&r, 1, &i, ids[i] + p, c, &p, logits + (size_t)i * V, 0);
    }
    pos[i] = (int)nids[i];
    prompt_tokens += (long long)nids[i];
  }
  const double t1 = now_s();
  while (!st) { /* the unfinished sequences seqs[0..na), at positions apos, logits al */
    int na = 0;
    for (int i = 0; i < ns; ++i) { /* row i of logits is sequence i's */
      if (done[i]) continue;
      const int next = pick_token(logits + (size_t)i * V, V, o->temperature, &rng[i]);
      if (next == eos) {
        done[i] = 1;
        continue;
      }
      char piece[256];
      const size_t pl = llm_token_bytes(r.tok, next, piece, sizeof piece);
      if (tlens[i] + pl < 64 * (size_t)max_new + 64) {
        memcpy(texts[i] + tlens[i], piece, pl);
        tlens[i] += pl;
      }
      ++generated;
      if (++count[i] == max_new) {
        done[i] = 1;
        continue;
      }
      seqs[na] = i;
      apos[na] = pos[i];
      toks[na] = next;
      ++na;
    }
    if (!na) break;
    st = forward_seqs(&r, na, seqs, toks, 1, apos, al, 0);
    for (int a = 0; a < na && !st; ++a) {
      memcpy(logits + (size_t)seqs[a] * V, al + (size_t)a * V, (size_t)V * sizeof *al);
      ++pos[seqs[a]];
    }
  }
  const double t2 = now_s();
  if (st) {
    fprintf(stderr, "kivi-run: %s\n", kivi_status_string(st));
    goto out;
  }
  for (int i = 0; i < ns; ++i) {
    printf("[%d] ", i);
    fwrite(texts[i], 1, tlens[i], stdout);
    printf("\n");
  }
  fflush(stdout);
  const double pre_tps = (double)prompt_tokens / (t1 - t0), gen_tps = (double)generated / (t2 - t1);
  fprintf(stderr, "%d sequences: prompts %lld tokens at %.1f tokens/s; generated %lld tokens at %.1f tokens/s\n", ns,
          prompt_tokens, pre_tps, generated, gen_tps);
  print_memory(&r, stderr);
  if (r.json) {
    fprintf(r.json, "  \"sequences\": %d, \"prompt_tokens\": %lld, \"generated_tokens\": %lld,\n", ns, prompt_tokens,
            generated);
    fprintf(r.json, "  \"prompt_tokens_per_s\": %.3f, \"generate_tokens_per_s\": %.3f,\n  \"texts\": [", pre_tps, gen_tps);
    for (int i = 0; i < ns; ++i) {
      if (i) fprintf(r.json, ", ");
      json_string(r.json, texts[i], tlens[i]);
    }
    fprintf(r.json, "]\n}\n");
  }
  rc = 0;
out:
  runner_close(&r);
  for (int i = 0; i < MAX_PROMPTS; ++i) {
    free(ids[i]);
    free(texts[i]);
  }
  free(logits), free(al), free(seqs), free(pos), free(toks), free(done), free(count), free(apos), free(rng);
  free(file);
  return rc;
}

/* ---- ppl -------------------------------------------------------------------------------- */
static int cmd_ppl(options *o) {
  runner r = {.o = *o};
  int rc = 1, *ids = NULL;
  size_t n = 0, cap = 0, tlen = 0;
  char *text = read_file(o->text_file, &tlen);
  float *logits = NULL;
  if (!text) {
    fprintf(stderr, "kivi-run: cannot read %s\n", o->text_file);
    return 1;
  }
  if (o->batch < 1 || o->batch > 4096) {
    fprintf(stderr, "kivi-run: --batch must be 1 .. 4096\n");
    goto out;
  }
  r.n_seqs = o->batch;
  if (runner_open(&r) || runner_start(&r, o->ctx)) goto out;
  if (llm_tokenize(r.tok, text, tlen, 0, &ids, &n, &cap)) goto out;
  const size_t total = o->max_tokens > 0 && (size_t)o->max_tokens < n ? (size_t)o->max_tokens : n;
  const int windows = (int)(total / (size_t)o->ctx);
  if (windows < 1) {
    fprintf(stderr, "kivi-run: %s has %zu tokens, fewer than one window of %d\n", o->text_file, n, o->ctx);
    goto out;
  }
  const int V = r.model.n_vocab, B = o->batch, C = o->chunk;
  logits = malloc((size_t)C * B * V * sizeof *logits);
  int *seqs = malloc((size_t)B * sizeof *seqs), *pos = malloc((size_t)B * sizeof *pos),
      *toks = malloc((size_t)B * C * sizeof *toks);
  double *nll_w = calloc((size_t)windows, sizeof *nll_w); /* summed in window order: any --batch, the same sum */
  if (!logits || !seqs || !pos || !toks || !nll_w) {
    free(seqs), free(pos), free(toks), free(nll_w);
    goto out;
  }
  double nll = 0;
  long long scored = 0;
  const double t0 = now_s();
  /* the logits of position p predict token p+1; second-half scoring starts at p = ctx/2 */
  const int p0 = o->score_half ? o->ctx / 2 : 0;
  kivi_status st = KIVI_OK;
  for (int w0 = 0; w0 < windows && !st; w0 += B) {
    const int nb = windows - w0 < B ? windows - w0 : B; /* windows w0 .. w0+nb-1 in slots 0 .. nb-1 */
    for (int b = 0; b < nb && !st; ++b) {
      seqs[b] = b;
      st = kivi_cache_reset_seq(r.cache, b);
      if (!st && r.edge) st = kivi_cache_reset_seq(r.edge, b);
    }
    for (int i = 0; !st && i < o->ctx; i += C) {
      const int c = o->ctx - i < C ? o->ctx - i : C;
      for (int b = 0; b < nb; ++b) {
        pos[b] = i;
        memcpy(toks + (size_t)b * c, ids + (size_t)(w0 + b) * o->ctx + i, (size_t)c * sizeof *toks);
      }
      if ((st = forward_seqs(&r, nb, seqs, toks, c, pos, logits, 1))) break;
      for (int b = 0; b < nb; ++b) {
        const int *wid = ids + (size_t)(w0 + b) * o->ctx;
        for (int t = 0; t < c && i + t + 1 < o->ctx; ++t) { /* predict token i+t+1 */
          if (i + t < p0) continue;
          const float *lg = logits + ((size_t)b * c + t) * V;
          float mx = lg[0];
          for (int j = 1; j < V; ++j) mx = lg[j] > mx ? lg[j] : mx;
          double se = 0;
          for (int j = 0; j < V; ++j) se += exp((double)lg[j] - mx);
          nll_w[w0 + b] += log(se) + mx - lg[wid[i + t + 1]];
          ++scored;
        }
      }
      if (!o->quiet)
        fprintf(stderr, "\rppl %s ctx %d: windows %d-%d of %d, %lld tokens scored   ", r.setting, o->ctx, w0 + 1,
                w0 + nb, windows, scored);
    }
  }
  for (int w = 0; w < windows; ++w) nll += nll_w[w];
  free(seqs), free(pos), free(toks), free(nll_w);
  if (st) {
    fprintf(stderr, "\nkivi-run: %s\n", kivi_status_string(st));
    goto out;
  }
  const double dt = now_s() - t0, ppl = exp(nll / (double)scored);
  if (!o->quiet) fprintf(stderr, "\n");
  printf("%s: ppl %.4f at ctx %d (%d windows, %lld predictions%s, %zu tokens in %s) in %.1f s\n", r.setting, ppl,
         o->ctx, windows, scored, o->score_half ? " of the second halves" : "", n, o->text_file, dt);
  if (r.json) {
    fprintf(r.json, "  \"text_file\": \"%s\", \"text_tokens\": %zu, \"ctx\": %d, \"windows\": %d, \"predictions\": %lld,\n"
            "  \"score\": \"%s\", \"batch\": %d,\n", o->text_file, n, o->ctx, windows, scored,
            o->score_half ? "second-half" : "all", o->batch);
    fprintf(r.json, "  \"seconds\": %.3f,\n  \"ppl\": %.6f\n}\n", dt, ppl);
  }
  rc = 0;
out:
  runner_close(&r);
  free(logits);
  free(ids);
  free(text);
  return rc;
}

/* ---- passkey ---------------------------------------------------------------------------- */
static int append_text(const llm_tokenizer *tok, const char *s, int **ids, size_t *n, size_t *cap) {
  return llm_tokenize(tok, s, strlen(s), 0, ids, n, cap);
}

/* The prompt of the passkey test (Mohtashami & Jaggi's, as in KIVI's example): an instruction,
 * filler sentences, the key sentence at `depth` (0..1) of the filler, the question. */
static int passkey_prompt(const llm_tokenizer *tok, int length, double depth, int key, int **ids, size_t *n,
                          size_t *cap) {
  static const char *intro = "There is an important info hidden inside a lot of irrelevant text. Find it and "
                             "memorize them. I will quiz you about the important information there.";
  static const char *filler = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
  static const char *question = " What is the pass key? The pass key is";
  char keytext[128];
  snprintf(keytext, sizeof keytext, " The pass key is %05d. Remember it. %05d is the pass key.", key, key);
  int *tmp = NULL;
  size_t nf = 0, cf = 0, nk = 0, nq = 0, ni = 0;
  int rc = -1;
  if (append_text(tok, filler, &tmp, &nf, &cf)) goto done;
  ni = nf;
  if (append_text(tok, intro, &tmp, &ni, &cf)) goto done;
  nk = ni;
  if (append_text(tok, keytext, &tmp, &nk, &cf)) goto done;
  nq = nk;
  if (append_text(tok, question, &tmp, &nq, &cf)) goto done;
  /* tmp: [filler | intro | key | question] */
  const size_t lf = nf, li = ni - nf, lk = nk - ni, lq = nq - nk;
  const long reps = ((long)length - (long)(li + lk + lq)) / (long)lf;
  if (reps < 1) goto done;
  const long before = (long)floor(depth * (double)reps + 0.5);
  *n = 0;
#define PUT(off, len)                                                                                 \
  for (size_t j_ = 0; j_ < (len); ++j_) {                                                            \
    if (*n == *cap) {                                                                                \
      size_t nc_ = *cap ? 2 * *cap : 1024;                                                           \
      int *p_ = realloc(*ids, nc_ * sizeof *p_);                                                     \
      if (!p_) goto done;                                                                            \
      *ids = p_;                                                                                     \
      *cap = nc_;                                                                                    \
      --j_;                                                                                          \
    } else                                                                                           \
      (*ids)[(*n)++] = tmp[(off) + j_];                                                              \
  }
  PUT(nf, li);
  for (long i = 0; i < reps; ++i) {
    if (i == before) { PUT(ni, lk); }
    PUT(0, lf);
  }
  if (before >= reps) { PUT(ni, lk); }
  PUT(nk, lq);
#undef PUT
  rc = 0;
done:
  free(tmp);
  return rc;
}

static int cmd_passkey(options *o) {
  int lengths[32], nl = 0, maxlen = 0;
  for (const char *p = o->lengths; *p && nl < 32;) {
    char *end;
    const long v = strtol(p, &end, 10);
    if (end == p || v < 64 || v > 1 << 20) {
      fprintf(stderr, "kivi-run: bad --lengths '%s'\n", o->lengths);
      return 1;
    }
    lengths[nl++] = (int)v;
    maxlen = (int)v > maxlen ? (int)v : maxlen;
    p = *end == ',' ? end + 1 : end;
  }
  enum { ANSWER_TOKENS = 8 };
  runner r = {.o = *o};
  int rc = 1, *ids = NULL;
  size_t n = 0, cap = 0;
  float *logits = NULL;
  if (runner_open(&r) || runner_start(&r, maxlen + ANSWER_TOKENS + 8)) goto out;
  const int V = r.model.n_vocab;
  logits = malloc((size_t)V * sizeof *logits);
  if (!logits) goto out;
  uint64_t rng = o->seed;
  if (r.json) fprintf(r.json, "  \"results\": [");
  printf("%-40s %8s %8s %s\n", "setting", "tokens", "found", "answers");
  for (int li = 0; li < nl; ++li) {
    int found = 0;
    char answers[32][80];
    for (int t = 0; t < o->trials; ++t) {
      const int key = 10000 + (int)(rng_next(&rng) % 90000);
      const double depth = (t + 0.5) / o->trials;
      if (passkey_prompt(r.tok, lengths[li], depth, key, &ids, &n, &cap)) {
        fprintf(stderr, "kivi-run: --lengths %d is too short for the passkey prompt\n", lengths[li]);
        goto out;
      }
      kivi_status st = llm_session_reset(&r.sess);
      if (!st) st = prefill(&r, ids, (int)n, logits);
      char ans[64];
      size_t al = 0;
      for (int g = 0; !st && g < ANSWER_TOKENS; ++g) {
        const int next = pick_token(logits, V, 0, NULL);
        char piece[64];
        const size_t pl = llm_token_bytes(r.tok, next, piece, sizeof piece);
        for (size_t j = 0; j < pl && al + 1 < sizeof ans; ++j) ans[al++] = piece[j] == '\n' ? ' ' : piece[j];
        if (g + 1 < ANSWER_TOKENS) st = forward(&r, &next, 1, logits, 0);
      }
      if (st) {
        fprintf(stderr, "kivi-run: %s\n", kivi_status_string(st));
        goto out;
      }
      ans[al] = 0;
      char keytext[8];
      snprintf(keytext, sizeof keytext, "%05d", key);
      const int ok = strstr(ans, keytext) != NULL;
      found += ok;
      if (t < 32) snprintf(answers[t], sizeof answers[t], "%s%s", ok ? "" : "x", ans);
      if (!o->quiet) fprintf(stderr, "\rpasskey %d tokens: trial %d/%d, %d found   ", (int)n, t + 1, o->trials, found);
    }
    if (!o->quiet) fprintf(stderr, "\n");
    printf("%-40s %8d %5d/%-2d", r.setting, (int)n, found, o->trials);
    for (int t = 0; t < o->trials && t < 3; ++t) printf(" [%s]", answers[t]);
    printf("\n");
    if (r.json)
      fprintf(r.json, "%s\n    {\"length\": %d, \"tokens\": %d, \"trials\": %d, \"found\": %d}", li ? "," : "",
              lengths[li], (int)n, o->trials, found);
  }
  if (r.json) fprintf(r.json, "\n  ],\n");
  print_memory(&r, stdout);
  if (r.json) fprintf(r.json, "  \"answer_tokens\": %d\n}\n", ANSWER_TOKENS);
  rc = 0;
out:
  runner_close(&r);
  free(logits);
  free(ids);
  return rc;
}

int main(int argc, char **argv) {
  const int info_rc = kivi_cli_info(argc, argv, "kivi-run", kivi_version_string(), usage_text);
  if (info_rc >= 0) return info_rc;
  options o;
  const int p = parse_args(argc, argv, &o);
  if (p == -2) return 2; /* the error named the option */
  if (p) {
    fputs(usage_text, stderr);
    return 2;
  }
  if (!strcmp(o.cmd, "generate")) return cmd_generate(&o);
  if (!strcmp(o.cmd, "ppl")) return cmd_ppl(&o);
  if (!strcmp(o.cmd, "tokenize")) return cmd_tokenize(&o);
  return cmd_passkey(&o);
}
