/* Byte-level BPE tokenizer (GPT-2 style, `tokenizer.ggml.model = gpt2`) built from a GGUF file's
 * vocabulary and merges.
 *
 * Encoding: the text is split at control tokens (when asked), then pre-tokenized as the file's
 * `tokenizer.ggml.pre` says — "smollm", "default", "gpt2" or none: every digit alone, then the
 * GPT-2 pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+; "qwen2":
 * Qwen2's pattern (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
 * |\s*[\r\n]+|\s+(?!\S)|\s+; any other value is refused by name — and each piece is mapped
 * byte by byte to the GPT-2 byte alphabet and merged pair by pair, lowest merge rank first.
 * Letters, spaces and punctuation are classified exactly for ASCII; for other code points a
 * table of the common whitespace, punctuation and symbol blocks is used and the rest count as
 * letters (an approximation of Unicode's \p{L} that matters only for unusual non-ASCII text).
 * Decoding maps a token back to its bytes; decode(encode(text)) == text for any byte string. */
#ifndef KIVI_EXAMPLES_TOKENIZER_H
#define KIVI_EXAMPLES_TOKENIZER_H

#include <stddef.h>

#include "gguf.h"

typedef struct llm_tokenizer llm_tokenizer;

/* 0 on success; otherwise -1 and a message in err. */
int llm_tokenizer_load(const gguf_file *f, llm_tokenizer **tok, char *err, size_t errlen);
void llm_tokenizer_free(llm_tokenizer *tok);

int llm_tokenizer_vocab_size(const llm_tokenizer *tok);
int llm_tokenizer_bos(const llm_tokenizer *tok); /* -1 if none */
int llm_tokenizer_eos(const llm_tokenizer *tok);
/* The id of a token string (vocabulary form), or -1. */
int llm_tokenizer_find(const llm_tokenizer *tok, const char *piece);

/* Encodes n bytes of text, appending to *ids (grown with realloc; *n_ids tokens so far, *cap
 * its capacity).  special != 0: occurrences of control tokens such as <|im_start|> become their
 * ids; otherwise they are plain text.  0 on success, -1 if out of memory. */
int llm_tokenize(const llm_tokenizer *tok, const char *text, size_t n, int special, int **ids,
                 size_t *n_ids, size_t *cap);

/* The bytes of token `id` (its text), written to buf (at most cap bytes); returns the byte
 * count, or 0 for an id out of range.  Control tokens give their literal text. */
size_t llm_token_bytes(const llm_tokenizer *tok, int id, char *buf, size_t cap);

/* The ChatML prompt of the SmolLM2 and Qwen2 instruct templates (the file's
 * tokenizer.chat_template): an optional system message (NULL: the template's default — the
 * literal text between "<|im_start|>system" and "<|im_end|>" in the template, or none), one user
 * message, then the
 * assistant header.  0 on success, -1 if out of memory. */
int llm_chat_prompt(const llm_tokenizer *tok, const char *system, const char *user, int **ids,
                    size_t *n_ids, size_t *cap);

#endif
