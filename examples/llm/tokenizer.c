/* Byte-level BPE tokenizer: see tokenizer.h. */
#include "tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a string -> int hash table (open addressing, keys are views into the GGUF mapping or
 *      into the tokenizer's own storage) -------------------------------------------------- */
typedef struct strmap {
  const char **key;
  uint32_t *len;
  int *val;
  size_t mask;
} strmap;

static uint64_t hash_bytes(const char *p, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < n; ++i) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
  return h;
}

static int strmap_init(strmap *m, size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  m->key = calloc(cap, sizeof *m->key);
  m->len = calloc(cap, sizeof *m->len);
  m->val = calloc(cap, sizeof *m->val);
  m->mask = cap - 1;
  return m->key && m->len && m->val ? 0 : -1;
}

static void strmap_free(strmap *m) {
  free(m->key);
  free(m->len);
  free(m->val);
}

/* Inserts if absent (the first occurrence wins). */
static void strmap_put(strmap *m, const char *k, size_t n, int v) {
  for (size_t i = hash_bytes(k, n) & m->mask;; i = (i + 1) & m->mask) {
    if (!m->key[i]) {
      m->key[i] = k;
      m->len[i] = (uint32_t)n;
      m->val[i] = v;
      return;
    }
    if (m->len[i] == n && !memcmp(m->key[i], k, n)) return;
  }
}

static int strmap_get(const strmap *m, const char *k, size_t n) {
  for (size_t i = hash_bytes(k, n) & m->mask; m->key[i]; i = (i + 1) & m->mask)
    if (m->len[i] == n && !memcmp(m->key[i], k, n)) return m->val[i];
  return -1;
}

/* ---- the tokenizer ---------------------------------------------------------------------- */
struct llm_tokenizer {
  int n_vocab, bos, eos, unk;
  gguf_str *tokens;   /* vocabulary strings in the byte alphabet (views into the file) */
  int *is_control;    /* token_type == 3 (control) */
  char **bytes;       /* decoded bytes of each token */
  uint32_t *n_bytes;
  strmap vocab;       /* string -> id */
  strmap merges;      /* "left right" -> rank */
  int *control_ids;   /* control tokens longest first, for splitting text */
  int n_control;
  uint16_t byte_cp[256]; /* byte -> code point of the GPT-2 byte alphabet */
  int16_t cp_byte[512];  /* inverse, -1 if none */
  int qwen2;             /* tokenizer.ggml.pre = "qwen2": Qwen2's pre-tokenizer (tokenizer.h) */
  char *system;          /* the chat template's default system message, or NULL */
};

static void build_byte_alphabet(llm_tokenizer *t) {
  int next = 256;
  for (int i = 0; i < 512; ++i) t->cp_byte[i] = -1;
  for (int b = 0; b < 256; ++b) {
    const int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    t->byte_cp[b] = (uint16_t)(printable ? b : next++);
    t->cp_byte[t->byte_cp[b]] = (int16_t)b;
  }
}

/* UTF-8 decode one code point (invalid or truncated sequences: one byte, returned as 0xFFFD
 * with *len = 1). */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len) {
  const unsigned c = s[0];
  size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (need == 1) { *len = 1; return c; }
  if (!need || need > n) { *len = 1; return 0xFFFD; }
  uint32_t cp = c & (0x7F >> need);
  for (size_t i = 1; i < need; ++i) {
    if ((s[i] & 0xC0) != 0x80) { *len = 1; return 0xFFFD; }
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  *len = need;
  return cp;
}

static size_t utf8_put(uint32_t cp, char *out) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  out[0] = (char)(0xC0 | (cp >> 6));
  out[1] = (char)(0x80 | (cp & 0x3F));
  return 2; /* the byte alphabet stays below U+0800 */
}

/* The default system message of a ChatML template (tokenizer.chat_template): the text between
 * "<|im_start|>system" plus a newline (or a Jinja "\\n") and "<|im_end|>", where that text is
 * plain (no quote or brace: not an expression).  *out = a copy, or NULL where there is none.
 * 0, or -1 when out of memory. */
static int chat_system(const gguf_file *f, char **out) {
  *out = NULL;
  const gguf_kv *kv = gguf_find_kv(f, "tokenizer.chat_template");
  if (!kv || kv->type != GGUF_STRING) return 0;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | kv->val[i];
  const char *p = (const char *)kv->val + 8, *end = p + n;
  static const char head[] = "<|im_start|>system", tail[] = "<|im_end|>";
  for (const char *h = p; h + sizeof head - 1 <= end; ++h) {
    if (memcmp(h, head, sizeof head - 1)) continue;
    const char *b = h + sizeof head - 1;
    if (b < end && *b == '\n') b += 1;
    else if (b + 1 < end && b[0] == '\\' && b[1] == 'n') b += 2;
    else continue;
    const char *e = b;
    while (e + sizeof tail - 1 <= end && memcmp(e, tail, sizeof tail - 1) && *e != '\'' && *e != '{' && *e != '}') ++e;
    if (e + sizeof tail - 1 > end || memcmp(e, tail, sizeof tail - 1) || e == b) continue;
    if (!(*out = malloc((size_t)(e - b) + 1))) return -1;
    memcpy(*out, b, (size_t)(e - b));
    (*out)[e - b] = 0;
    return 0;
  }
  return 0;
}

int llm_tokenizer_load(const gguf_file *f, llm_tokenizer **out, char *err, size_t errlen) {
  *out = NULL;
  const gguf_kv *model = gguf_find_kv(f, "tokenizer.ggml.model");
  if (!model || model->type != GGUF_STRING) {
    snprintf(err, errlen, "no tokenizer.ggml.model in the file");
    return -1;
  }
  uint64_t mn = 0; /* the string's u64 length, little-endian */
  for (int i = 7; i >= 0; --i) mn = mn << 8 | model->val[i];
  if (mn != 4 || memcmp(model->val + 8, "gpt2", 4)) {
    snprintf(err, errlen, "tokenizer %.*s is not supported (byte-level BPE, \"gpt2\", is)", (int)(mn > 32 ? 32 : mn),
             (const char *)model->val + 8);
    return -1;
  }
  /* the pre-tokenizer: SmolLM2's (also for files that name none, "default" or "gpt2") or Qwen2's */
  const gguf_kv *pre = gguf_find_kv(f, "tokenizer.ggml.pre");
  int qwen2 = 0;
  if (pre && pre->type == GGUF_STRING) {
    uint64_t pn = 0;
    for (int i = 7; i >= 0; --i) pn = pn << 8 | pre->val[i];
    const char *pp = (const char *)pre->val + 8;
#define PRE_IS(name) (pn == sizeof name - 1 && !memcmp(pp, name, pn))
    qwen2 = PRE_IS("qwen2");
    if (!qwen2 && !PRE_IS("smollm") && !PRE_IS("default") && !PRE_IS("gpt2")) {
      snprintf(err, errlen, "pre-tokenizer %.*s is not supported (smollm, gpt2 and qwen2 are)", (int)(pn > 32 ? 32 : pn), pp);
      return -1;
    }
#undef PRE_IS
  }
  llm_tokenizer *t = calloc(1, sizeof *t);
  if (!t) goto oom;
  t->qwen2 = qwen2;
  if (chat_system(f, &t->system)) goto oom_free0;
  uint64_t nv = 0, nm = 0, ntt = 0;
  gguf_str *merges = NULL;
  const void *types = NULL;
  if (gguf_get_str_array(f, "tokenizer.ggml.tokens", &t->tokens, &nv) != 1 || nv == 0 || nv > (1u << 24)) {
    snprintf(err, errlen, "no usable tokenizer.ggml.tokens array");
    llm_tokenizer_free(t);
    return -1;
  }
  if (gguf_get_str_array(f, "tokenizer.ggml.merges", &merges, &nm) != 1) {
    snprintf(err, errlen, "no tokenizer.ggml.merges array");
    llm_tokenizer_free(t);
    return -1;
  }
  t->n_vocab = (int)nv;
  int64_t v;
  t->bos = gguf_get_int(f, "tokenizer.ggml.bos_token_id", &v) && v >= 0 && v < (int64_t)nv ? (int)v : -1;
  t->eos = gguf_get_int(f, "tokenizer.ggml.eos_token_id", &v) && v >= 0 && v < (int64_t)nv ? (int)v : -1;
  t->unk = gguf_get_int(f, "tokenizer.ggml.unknown_token_id", &v) && v >= 0 && v < (int64_t)nv ? (int)v : 0;
  build_byte_alphabet(t);
  t->is_control = calloc(nv, sizeof *t->is_control);
  t->bytes = calloc(nv, sizeof *t->bytes);
  t->n_bytes = calloc(nv, sizeof *t->n_bytes);
  t->control_ids = calloc(nv, sizeof *t->control_ids);
  if (!t->is_control || !t->bytes || !t->n_bytes || !t->control_ids) goto oom_free;
  if (gguf_get_array(f, "tokenizer.ggml.token_type", GGUF_INT32, &types, &ntt) == 1 && ntt == nv) {
    const uint8_t *p = types;
    for (uint64_t i = 0; i < nv; ++i) t->is_control[i] = p[4 * i] == 3;
  }
  if (strmap_init(&t->vocab, nv) || strmap_init(&t->merges, nm)) goto oom_free;
  for (uint64_t i = 0; i < nv; ++i) {
    const gguf_str *s = &t->tokens[i];
    strmap_put(&t->vocab, s->p, s->n, (int)i);
    /* decoded bytes: control tokens are literal text, the others map back from the alphabet */
    char *b = malloc(s->n ? s->n : 1);
    if (!b) goto oom_free;
    size_t nb = 0;
    if (t->is_control[i]) {
      memcpy(b, s->p, s->n);
      nb = s->n;
    } else {
      for (size_t k = 0; k < s->n;) {
        size_t len;
        const uint32_t cp = utf8_next((const unsigned char *)s->p + k, s->n - k, &len);
        const int byte = cp < 512 ? t->cp_byte[cp] : -1;
        if (byte >= 0) b[nb++] = (char)byte;
        else { memcpy(b + nb, s->p + k, len); nb += len; } /* not in the alphabet: keep as is */
        k += len;
      }
    }
    t->bytes[i] = b;
    t->n_bytes[i] = (uint32_t)nb;
    if (t->is_control[i] && s->n > 0) t->control_ids[t->n_control++] = (int)i;
  }
  for (uint64_t i = 0; i < nm; ++i) strmap_put(&t->merges, merges[i].p, merges[i].n, (int)i);
  free(merges);
  /* longest control token first, so that a prefix never wins */
  for (int i = 1; i < t->n_control; ++i)
    for (int j = i; j > 0 && t->tokens[t->control_ids[j]].n > t->tokens[t->control_ids[j - 1]].n; --j) {
      const int x = t->control_ids[j];
      t->control_ids[j] = t->control_ids[j - 1];
      t->control_ids[j - 1] = x;
    }
  *out = t;
  return 0;
oom_free:
  free(merges);
oom_free0:
  llm_tokenizer_free(t);
oom:
  snprintf(err, errlen, "out of memory loading the tokenizer");
  return -1;
}

void llm_tokenizer_free(llm_tokenizer *t) {
  if (!t) return;
  free(t->system);
  if (t->bytes)
    for (int i = 0; i < t->n_vocab; ++i) free(t->bytes[i]);
  free(t->bytes);
  free(t->n_bytes);
  free(t->is_control);
  free(t->control_ids);
  free(t->tokens);
  strmap_free(&t->vocab);
  strmap_free(&t->merges);
  free(t);
}

int llm_tokenizer_vocab_size(const llm_tokenizer *t) { return t->n_vocab; }
int llm_tokenizer_bos(const llm_tokenizer *t) { return t->bos; }
int llm_tokenizer_eos(const llm_tokenizer *t) { return t->eos; }
int llm_tokenizer_find(const llm_tokenizer *t, const char *piece) {
  return strmap_get(&t->vocab, piece, strlen(piece));
}

size_t llm_token_bytes(const llm_tokenizer *t, int id, char *buf, size_t cap) {
  if (id < 0 || id >= t->n_vocab) return 0;
  const size_t n = t->n_bytes[id] < cap ? t->n_bytes[id] : cap;
  memcpy(buf, t->bytes[id], n);
  return n;
}

/* ---- encoding --------------------------------------------------------------------------- */
enum { CL_LETTER, CL_DIGIT, CL_SPACE, CL_OTHER };

static int classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return CL_LETTER;
    if (cp >= '0' && cp <= '9') return CL_DIGIT;
    if (cp == ' ' || (cp >= 9 && cp <= 13)) return CL_SPACE;
    return CL_OTHER;
  }
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
      cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return CL_SPACE;
  if ((cp >= 0xA1 && cp <= 0xBF && cp != 0xAA && cp != 0xB5 && cp != 0xBA) || cp == 0xD7 || cp == 0xF7 ||
      (cp >= 0x2010 && cp <= 0x2027) || (cp >= 0x2030 && cp <= 0x205E) || (cp >= 0x20A0 && cp <= 0x20CF) ||
      (cp >= 0x2100 && cp <= 0x214F) || (cp >= 0x2190 && cp <= 0x23FF) || (cp >= 0x2500 && cp <= 0x27BF) ||
      (cp >= 0x2E00 && cp <= 0x2E7F) || (cp >= 0x3001 && cp <= 0x303F) || (cp >= 0xFE30 && cp <= 0xFE4F) ||
      (cp >= 0xFF01 && cp <= 0xFF0F) || (cp >= 0x1F000 && cp <= 0x1FAFF) || cp == 0xFFFD)
    return CL_OTHER;
  return CL_LETTER;
}

static int push_id(int **ids, size_t *n, size_t *cap, int id) {
  if (*n == *cap) {
    const size_t nc = *cap ? 2 * *cap : 256;
    int *p = realloc(*ids, nc * sizeof *p);
    if (!p) return -1;
    *ids = p;
    *cap = nc;
  }
  (*ids)[(*n)++] = id;
  return 0;
}

/* BPE over one pre-token of n bytes. */
static int bpe_piece(const llm_tokenizer *t, const unsigned char *s, size_t n, int **ids, size_t *n_ids,
                     size_t *cap) {
  /* the piece in the byte alphabet; symbol i is mapped[off[i] .. off[i] + len[i]) */
  char stackbuf[512];
  size_t stackoff[256], stacklen[256];
  char *mapped = 2 * n <= sizeof stackbuf ? stackbuf : malloc(2 * n);
  size_t *off = n <= 256 ? stackoff : malloc(n * sizeof *off);
  size_t *len = n <= 256 ? stacklen : malloc(n * sizeof *len);
  char *key = malloc(4 * n + 2);
  int rc = -1;
  if (!mapped || !off || !len || !key) goto done;
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    off[i] = m;
    len[i] = utf8_put(t->byte_cp[s[i]], mapped + m);
    m += len[i];
  }
  size_t ns = n;
  while (ns > 1) {
    int best = -1;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < ns; ++i) { /* adjacent symbols are adjacent in `mapped` */
      memcpy(key, mapped + off[i], len[i]);
      key[len[i]] = ' ';
      memcpy(key + len[i] + 1, mapped + off[i + 1], len[i + 1]);
      const int r = strmap_get(&t->merges, key, len[i] + 1 + len[i + 1]);
      if (r >= 0 && (best < 0 || r < best)) {
        best = r;
        bi = i;
      }
    }
    if (best < 0) break;
    len[bi] += len[bi + 1];
    memmove(off + bi + 1, off + bi + 2, (ns - bi - 2) * sizeof *off);
    memmove(len + bi + 1, len + bi + 2, (ns - bi - 2) * sizeof *len);
    --ns;
  }
  for (size_t i = 0; i < ns; ++i) {
    int id = strmap_get(&t->vocab, mapped + off[i], len[i]);
    if (id < 0) { /* cannot happen with a complete byte alphabet; fall back per byte */
      for (size_t k = off[i]; k < off[i] + len[i];) {
        size_t l;
        const uint32_t cp = utf8_next((const unsigned char *)mapped + k, off[i] + len[i] - k, &l);
        char one[2];
        const size_t ol = utf8_put(cp, one);
        const int bid = strmap_get(&t->vocab, one, ol);
        if (push_id(ids, n_ids, cap, bid >= 0 ? bid : t->unk)) goto done;
        k += l;
      }
      continue;
    }
    if (push_id(ids, n_ids, cap, id)) goto done;
  }
  rc = 0;
done:
  if (mapped != stackbuf) free(mapped);
  if (off != stackoff) free(off);
  if (len != stacklen) free(len);
  free(key);
  return rc;
}

/* The end of the Qwen2 pre-token that starts at code point i of nc (classes cls, first bytes
 * CH): the first alternative of
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * that matches there, as the regex engine takes it. */
static size_t qwen2_piece(const unsigned char *s, const size_t *pos, const unsigned char *cls, size_t nc, size_t i) {
#define CH(k) (s[pos[k]])
#define LOW(k) (CH(k) | 0x20) /* ASCII letters to lower case (the contractions' letters) */
#define NL(k) (CH(k) == '\r' || CH(k) == '\n')
  if (CH(i) == '\'' && i + 1 < nc) {
    if (LOW(i + 1) == 's' || LOW(i + 1) == 't' || LOW(i + 1) == 'm' || LOW(i + 1) == 'd') return i + 2;
    if (i + 2 < nc && ((LOW(i + 1) == 'r' && LOW(i + 2) == 'e') || (LOW(i + 1) == 'v' && LOW(i + 2) == 'e') ||
                       (LOW(i + 1) == 'l' && LOW(i + 2) == 'l')))
      return i + 3;
  }
  size_t j = i;
  if (cls[i] == CL_LETTER || (cls[i] != CL_DIGIT && !NL(i) && i + 1 < nc && cls[i + 1] == CL_LETTER)) {
    j = cls[i] == CL_LETTER ? i : i + 1;
    while (j < nc && cls[j] == CL_LETTER) ++j;
    return j;
  }
  if (cls[i] == CL_DIGIT) return i + 1;
  if (cls[i] == CL_OTHER || (CH(i) == ' ' && i + 1 < nc && cls[i + 1] == CL_OTHER)) {
    j = cls[i] == CL_OTHER ? i : i + 1;
    while (j < nc && cls[j] == CL_OTHER) ++j;
    while (j < nc && NL(j)) ++j;
    return j;
  }
  /* whitespace: the run [i, e) */
  size_t e = i;
  while (e < nc && cls[e] == CL_SPACE) ++e;
  for (size_t k = e; k > i; --k) /* \s*[\r\n]+: up to the run's last line break */
    if (NL(k - 1)) return k;
  if (e == nc || e - i == 1) return e; /* \s+(?!\S) at the end, or \s+ */
  return e - 1;                        /* \s+(?!\S): the last one joins what follows */
#undef NL
#undef LOW
#undef CH
}

/* Pre-tokenizes a span without control tokens and runs BPE on each piece. */
static int encode_span(const llm_tokenizer *t, const unsigned char *s, size_t n, int **ids, size_t *n_ids,
                       size_t *cap) {
  /* code point boundaries and classes */
  size_t *pos = malloc((n + 1) * sizeof *pos);
  unsigned char *cls = malloc(n + 1);
  if (!pos || !cls) {
    free(pos);
    free(cls);
    return -1;
  }
  size_t nc = 0;
  for (size_t i = 0; i < n;) {
    size_t l;
    const uint32_t cp = utf8_next(s + i, n - i, &l);
    pos[nc] = i;
    cls[nc++] = (unsigned char)classify(cp);
    i += l;
  }
  pos[nc] = n;
  int rc = 0;
#define CH(i) (s[pos[i]])
  for (size_t i = 0; i < nc && !rc;) {
    if (t->qwen2) {
      const size_t j = qwen2_piece(s, pos, cls, nc, i);
      rc = bpe_piece(t, s + pos[i], pos[j] - pos[i], ids, n_ids, cap);
      i = j;
      continue;
    }
    size_t j = i + 1;
    const int c = cls[i];
    const int sp_next = CH(i) == ' ' && i + 1 < nc; /* " ?" prefix candidate */
    if (c == CL_DIGIT) {
      j = i + 1;
    } else if (CH(i) == '\'' && i + 1 < nc &&
               (((CH(i + 1) == 's' || CH(i + 1) == 't' || CH(i + 1) == 'm' || CH(i + 1) == 'd')) ||
                (i + 2 < nc && ((CH(i + 1) == 'r' && CH(i + 2) == 'e') || (CH(i + 1) == 'v' && CH(i + 2) == 'e') ||
                                (CH(i + 1) == 'l' && CH(i + 2) == 'l'))))) {
      j = i + (CH(i + 1) == 's' || CH(i + 1) == 't' || CH(i + 1) == 'm' || CH(i + 1) == 'd' ? 2 : 3);
    } else if (c == CL_LETTER || (sp_next && cls[i + 1] == CL_LETTER)) {
      j = i + (c == CL_SPACE ? 1 : 0);
      while (j < nc && cls[j] == CL_LETTER) ++j;
    } else if (c == CL_OTHER || (sp_next && cls[i + 1] == CL_OTHER)) {
      j = i + (c == CL_SPACE ? 1 : 0);
      while (j < nc && cls[j] == CL_OTHER) ++j;
    } else { /* whitespace run */
      j = i;
      while (j < nc && cls[j] == CL_SPACE) ++j;
      if (j < nc && cls[j] != CL_DIGIT) {
        /* \s+(?!\S): leave the last space for the next piece; a lone whitespace char that is
         * not a joinable space is a piece of its own (\s+) */
        if (j - i >= 2) j = j - 1;
        else if (CH(i) == ' ') j = i + 1; /* unreachable: handled by the " ?" branches */
      }
    }
    rc = bpe_piece(t, s + pos[i], pos[j] - pos[i], ids, n_ids, cap);
    i = j;
  }
#undef CH
  free(pos);
  free(cls);
  return rc;
}

int llm_tokenize(const llm_tokenizer *t, const char *text, size_t n, int special, int **ids, size_t *n_ids,
                 size_t *cap) {
  const unsigned char *s = (const unsigned char *)text;
  size_t start = 0;
  if (special) {
    for (size_t i = 0; i < n;) {
      int hit = -1;
      if (s[i] == '<')
        for (int c = 0; c < t->n_control && hit < 0; ++c) {
          const gguf_str *tk = &t->tokens[t->control_ids[c]];
          if (tk->n <= n - i && !memcmp(s + i, tk->p, tk->n)) hit = t->control_ids[c];
        }
      if (hit < 0) {
        ++i;
        continue;
      }
      if (i > start && encode_span(t, s + start, i - start, ids, n_ids, cap)) return -1;
      if (push_id(ids, n_ids, cap, hit)) return -1;
      i += t->tokens[hit].n;
      start = i;
    }
  }
  if (n > start && encode_span(t, s + start, n - start, ids, n_ids, cap)) return -1;
  return 0;
}

int llm_chat_prompt(const llm_tokenizer *t, const char *system, const char *user, int **ids, size_t *n_ids,
                    size_t *cap) {
  if (!system) system = t->system ? t->system : "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  const char *parts[] = {"<|im_start|>system\n", system, "<|im_end|>\n<|im_start|>user\n", user,
                         "<|im_end|>\n<|im_start|>assistant\n"};
  for (int i = 0; i < 5; ++i) /* only the template's own parts may produce control tokens */
    if (llm_tokenize(t, parts[i], strlen(parts[i]), !(i & 1), ids, n_ids, cap)) return -1;
  return 0;
}
