/* One pass over a batch of UTF-8 texts for NeMo Curator's heuristic filters (tokenmix/curate/heuristics/).

   profile() counts, per text, everything the word, character and line heuristics divide: words, characters of
   each class, the longest word, words that are symbols, stop words or hold a letter, non-blank lines that start with
   a bullet or end without an end mark or with an ellipsis, and characters inside URLs. lines_and_paragraphs() counts
   each text's lines and paragraphs and how many of them are distinct. What a character is (whitespace, a letter, a bracket...)
   comes from a table of classes per code point that scan.py fills from character_classes.py; letters outside ASCII
   are asked of Python once per code point and remembered in that table. plain_scan.py makes the same counts in plain
   Python, for an install where this module was not built. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum {
    C_SPACE = 1 << 0,     /* str.isspace: ends a word, a blank line holds only these */
    C_ALNUM = 1 << 1,     /* counted by non_alpha_numeric */
    C_DIGIT = 1 << 2,     /* counted by numbers */
    C_LAYOUT = 1 << 3,    /* counted by white_space */
    C_BRACKET = 1 << 4,   /* counted by parentheses */
    C_LETTER = 1 << 5,    /* alphabetic, for words_without_alphabets */
    C_KNOWN = 1 << 6,     /* C_LETTER has been decided for this code point */
    C_BULLET = 1 << 7,    /* a line that starts with one is a bullet line */
    C_END_MARK = 1 << 8,  /* a line that ends with one ends a sentence */
    C_URL = 1 << 9,       /* may follow "http(s)://" in a URL */
    C_HASH = 1 << 10,     /* '#': a word of more runs of it than half its length is a symbol */
};

enum {
    P_WORDS, P_CHARS, P_NONSPACE, P_ALNUM, P_DIGITS, P_LAYOUT, P_BRACKETS, P_LONGEST_WORD, P_LETTER_WORDS,
    P_SYMBOL_WORDS, P_COMMON_WORDS, P_LINES, P_LINES_WITHOUT_END_MARK, P_ELLIPSIS_LINES, P_BULLET_LINES, P_URL_CHARS,
    P_FIELDS
};

static const char *const PROFILE_FIELDS[P_FIELDS] = {
    "words", "chars", "nonspace_chars", "alphanumeric_chars", "digits", "layout_chars", "brackets", "longest_word",
    "words_with_letters", "symbol_words", "common_words", "lines", "lines_without_end_mark", "ellipsis_lines",
    "bullet_lines", "url_chars",
};

#define MAX_CODE 0x110000

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Of 8 bytes read as a little-endian (or big-endian) word: how many come before the first that is whitespace or
   outside ASCII, or may be (under 0x21); a mask of the first n; the high bit of each byte equal to 0; of each byte
   strictly between low and high (bytes under 0x80, bounds up to 0x80). */
static inline Py_ssize_t ascii_word_bytes(uint64_t x) {
    const uint64_t stops = ((x - ONES * 0x21) | x) & HIGHS;
    if (stops == 0) return 8;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return __builtin_clzll(stops) >> 3;
#else
    return __builtin_ctzll(stops) >> 3;
#endif
}

/* The first byte (in memory) of those whose high bit is set in hits, its bit cleared. */
static inline Py_ssize_t next_byte(uint64_t *hits) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    const int k = __builtin_clzll(*hits) >> 3;
    *hits &= ~(0x8000000000000000ULL >> (8 * k));
    return k;
#else
    const int k = __builtin_ctzll(*hits) >> 3;
    *hits &= *hits - 1;
    return k;
#endif
}

static inline uint64_t first_bytes(Py_ssize_t n) {
    if (n >= 8) return ~0ULL;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return n ? ~0ULL << (64 - 8 * n) : 0;
#else
    return (1ULL << (8 * n)) - 1;
#endif
}

static inline uint64_t zero_bytes(uint64_t v) {
    return ~(((v & ~HIGHS) + ~HIGHS) | v) & HIGHS;
}

static inline uint64_t bytes_between(uint64_t x, unsigned low, unsigned high) {
    return (ONES * (127 + high) - (x & ~HIGHS)) & ~x & ((x & ~HIGHS) + ONES * (127 - low)) & HIGHS;
}

#if defined(__SSE2__)
#include <emmintrin.h>
#define ASCII_BLOCK 64

/* Of the 64 bytes at p, a bit each (bit k for p[k]): ASCII whitespace (str.isspace), newlines, ASCII letters, '#',
   and bytes outside ASCII. */
typedef struct {
    uint64_t space, newline, letter, hash, wide;
} AsciiMasks;

static inline uint64_t mask_of(__m128i hits, int k) {
    return (uint64_t)(uint16_t)_mm_movemask_epi8(hits) << (16 * k);
}

/* Of 16 bytes, those that are ASCII whitespace (0x09-0x0D, 0x1C-0x20). */
static inline __m128i ascii_spaces(__m128i v) {
    const __m128i controls = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8(0x08)), _mm_cmplt_epi8(v, _mm_set1_epi8(0x0E)));
    const __m128i separators = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8(0x1B)), _mm_cmplt_epi8(v, _mm_set1_epi8(0x21)));
    return _mm_or_si128(controls, separators);
}

static inline AsciiMasks ascii_masks(const uint8_t *p) {
    AsciiMasks m = {0, 0, 0, 0, 0};
    for (int k = 0; k < 4; k++) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * k));
        const __m128i folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
        m.space |= mask_of(ascii_spaces(v), k);
        m.newline |= mask_of(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')), k);
        m.letter |= mask_of(_mm_and_si128(_mm_cmpgt_epi8(folded, _mm_set1_epi8('a' - 1)), _mm_cmplt_epi8(folded, _mm_set1_epi8('z' + 1))), k);
        m.hash |= mask_of(_mm_cmpeq_epi8(v, _mm_set1_epi8('#')), k);
        m.wide |= mask_of(v, k);
    }
    return m;
}

/* Where the line from i ends (its '\n', or end), and of its bytes whether one is outside ASCII (wide) and whether one
   is not ASCII whitespace (filled): 16 bytes at a time. */
static inline Py_ssize_t line_end(const uint8_t *data, Py_ssize_t i, Py_ssize_t end, int *wide, int *filled) {
    unsigned high = 0, other = 0;
    for (; end - i >= 16; i += 16) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(data + i));
        const unsigned newlines = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')));
        const unsigned before = newlines ? (1u << __builtin_ctz(newlines)) - 1 : 0xFFFFu;
        high |= (unsigned)_mm_movemask_epi8(v) & before;
        other |= ~(unsigned)_mm_movemask_epi8(ascii_spaces(v)) & before;
        if (newlines) {
            i += __builtin_ctz(newlines);
            break;
        }
    }
    for (; i < end && data[i] != '\n'; i++) {
        high |= data[i] & 0x80;
        other |= !((data[i] >= 0x09 && data[i] <= 0x0D) || (data[i] >= 0x1C && data[i] <= 0x20));
    }
    *wide = high != 0, *filled = other != 0;
    return i;
}
#endif

typedef struct {
    Py_ssize_t count;
    const char *bytes[16];
    Py_ssize_t lengths[16];
    Py_ssize_t longest;
    uint8_t first[256]; /* whether some string starts with this byte */
    uint8_t last[256];  /* whether some string ends with this byte, an ASCII letter in either case */
    uint64_t packed[16]; /* a string of at most 8 bytes, as a word read from memory holding it then zeros */
    int by_slot;         /* whether each string is of at most 8 bytes and has a packed_slot of its own: */
    uint64_t slot_packed[256];
    uint8_t slot_length[256]; /* the string there, where one is (0 where none is) */
} Strings;

/* Where the string x (packed) of n bytes is kept in a Strings' slots. */
static inline unsigned packed_slot(uint64_t x, Py_ssize_t n) {
    return (unsigned)(((x ^ (uint64_t)n) * 0x9E3779B97F4A7C15ULL) >> 56);
}

static int strings_from(PyObject *tuple, Strings *out, const char *what) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > 16) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple of at most 16 bytes objects", what);
        return -1;
    }
    out->count = PyTuple_GET_SIZE(tuple);
    out->longest = 0;
    memset(out->first, 0, sizeof out->first);
    memset(out->last, 0, sizeof out->last);
    memset(out->slot_length, 0, sizeof out->slot_length);
    out->by_slot = 1;
    for (Py_ssize_t i = 0; i < out->count; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s: item %zd is not bytes", what, i);
            return -1;
        }
        out->bytes[i] = PyBytes_AS_STRING(item);
        out->lengths[i] = PyBytes_GET_SIZE(item);
        if (out->lengths[i] == 0) {
            PyErr_Format(PyExc_ValueError, "%s: item %zd is empty", what, i);
            return -1;
        }
        out->first[(uint8_t)out->bytes[i][0]] = 1;
        const uint8_t end = (uint8_t)out->bytes[i][out->lengths[i] - 1];
        out->last[end] = 1;
        if ((end | 0x20) >= 'a' && (end | 0x20) <= 'z') out->last[end | 0x20] = out->last[end & ~0x20] = 1;
        out->packed[i] = 0;
        if (out->lengths[i] <= 8) memcpy(&out->packed[i], out->bytes[i], (size_t)out->lengths[i]);
        const unsigned slot = packed_slot(out->packed[i], out->lengths[i]);
        if (out->lengths[i] > 8 || out->slot_length[slot]) out->by_slot = 0;
        out->slot_packed[slot] = out->packed[i], out->slot_length[slot] = (uint8_t)out->lengths[i];
        if (out->lengths[i] > out->longest) out->longest = out->lengths[i];
    }
    return 0;
}

/* Whether the n bytes at p are one of the strings; bytes up to limit may be read. */
static inline int is_one_of(const Strings *s, const uint8_t *p, Py_ssize_t n, const uint8_t *limit) {
    if (s->by_slot && limit - p >= 8) {
        /* one lookup, without branches that depend on the word (whether a word is one of them is not predictable) */
        uint64_t x;
        memcpy(&x, p, 8);
        x &= first_bytes(n);
        const unsigned slot = packed_slot(x, n);
        return (s->slot_packed[slot] == x) & (s->slot_length[slot] == n);
    }
    if (n > s->longest || !s->first[p[0]]) return 0;
    if (n <= 8 && limit - p >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        x &= first_bytes(n);
        for (Py_ssize_t i = 0; i < s->count; i++)
            if (s->packed[i] == x && s->lengths[i] == n) return 1;
        return 0;
    }
    for (Py_ssize_t i = 0; i < s->count; i++)
        if (s->lengths[i] == n && memcmp(s->bytes[i], p, (size_t)n) == 0) return 1;
    return 0;
}

/* The profile's two sets of words, symbols and stop words, in one table where each of their strings has a
   packed_slot of its own: one lookup says of a word whether it is a symbol (bit 1) or a stop word (bit 2). */
typedef struct {
    int merged; /* whether the table holds both sets (else each is looked up on its own) */
    uint64_t packed[256];
    uint8_t length[256];
    uint8_t kind[256];
} WordKinds;

static void word_kinds_from(const Strings *symbols, const Strings *common, WordKinds *out) {
    const Strings *const sets[2] = {symbols, common};
    out->merged = symbols->by_slot && common->by_slot;
    memset(out->length, 0, sizeof out->length);
    memset(out->kind, 0, sizeof out->kind);
    for (int k = 0; k < 2 && out->merged; k++)
        for (Py_ssize_t i = 0; i < sets[k]->count; i++) {
            const uint64_t x = sets[k]->packed[i];
            const Py_ssize_t n = sets[k]->lengths[i];
            const unsigned slot = packed_slot(x, n);
            if (out->length[slot] && (out->packed[slot] != x || out->length[slot] != n)) {
                out->merged = 0;
                break;
            }
            out->packed[slot] = x, out->length[slot] = (uint8_t)n, out->kind[slot] |= (uint8_t)(1 << k);
        }
}

/* Whether the n bytes at p are a symbol (bit 1) or a stop word (bit 2); bytes up to limit may be read. */
static inline unsigned word_kind(const WordKinds *kinds, const Strings *symbols, const Strings *common, const uint8_t *p,
                                 Py_ssize_t n, const uint8_t *limit) {
    if (kinds->merged && limit - p >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        x &= first_bytes(n);
        const unsigned slot = packed_slot(x, n);
        return kinds->kind[slot] & -(unsigned)((kinds->packed[slot] == x) & (kinds->length[slot] == n));
    }
    return (unsigned)is_one_of(symbols, p, n, limit) | (unsigned)is_one_of(common, p, n, limit) << 1;
}

/* Whether the line [start, last] ends with one of the marks, ASCII letters of the line in either case. */
static int ends_with_one_of(const Strings *marks, const uint8_t *data, Py_ssize_t start, Py_ssize_t last) {
    if (!marks->last[data[last]]) return 0;
    for (Py_ssize_t m = 0; m < marks->count; m++) {
        Py_ssize_t n = marks->lengths[m];
        if (n > last - start + 1) continue;
        const uint8_t *mark = (const uint8_t *)marks->bytes[m];
        Py_ssize_t k = 0;
        for (; k < n; k++) {
            uint8_t want = mark[n - 1 - k], got = data[last - k];
            if (want >= 'a' && want <= 'z') got |= 0x20;
            if (got != want) break;
        }
        if (k == n) return 1;
    }
    return 0;
}

#define REPLACEMENT 0xFFFD

/* The code point at p, before end, and its width in bytes. Arrow does not check that a Parquet shard's strings are
   UTF-8; what is not valid UTF-8 reads as Python's errors="replace" reads it: the longest start of a valid sequence
   (a lone byte at least) is one character, U+FFFD. */
static inline uint32_t decode(const uint8_t *p, const uint8_t *end, int *width) {
    uint8_t b = p[0];
    *width = 1;
    if (b < 0x80) return b;
    int need;
    uint8_t low = 0x80, high = 0xBF; /* the second byte's range, which rules out overlong forms and surrogates */
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) need = 3, low = b == 0xE0 ? 0xA0 : 0x80, high = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) need = 4, low = b == 0xF0 ? 0x90 : 0x80, high = b == 0xF4 ? 0x8F : 0xBF;
    else return REPLACEMENT;
    uint32_t code = b & (0x7F >> need);
    for (int k = 1; k < need; k++) {
        if (p + k >= end || p[k] < (k == 1 ? low : 0x80) || p[k] > (k == 1 ? high : 0xBF)) {
            *width = k;
            return REPLACEMENT;
        }
        code = code << 6 | (p[k] & 0x3F);
    }
    *width = need;
    return code;
}

static int learn_letter(uint16_t *classes, uint32_t code, PyObject *is_letter) {
    PyObject *answer = PyObject_CallFunction(is_letter, "I", (unsigned int)code);
    if (answer == NULL) return -1;
    int truth = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    if (truth < 0) return -1;
    classes[code] |= C_KNOWN | (truth ? C_LETTER : 0);
    return 0;
}

/* The classes of the character at p outside ASCII, its letter class learnt first if need be; -1 on a Python error. */
static int wide_classes(const uint8_t *p, const uint8_t *end, uint16_t *classes, PyObject *is_letter, int *width) {
    uint32_t code = decode(p, end, width);
    if (!(classes[code] & C_KNOWN) && learn_letter(classes, code, is_letter) < 0) return -1;
    return classes[code];
}

/* Characters inside URLs (NeMo's https?://[!$-_a-z]+, the class in C_URL) in [start, end). Every match holds a "://"
   right after "http" or "https", so the matches are found from the colons, in order; a match's run of class characters
   takes in any "://" after it (':' and '/' are in the class), so a colon before the last match's end starts none. */
static Py_ssize_t url_chars(const uint8_t *data, Py_ssize_t start, Py_ssize_t end, const uint16_t *classes) {
    Py_ssize_t total = 0, taken = start;
    for (Py_ssize_t at = start + 4; at < end;) {
        const uint8_t *colon = memchr(data + at, ':', (size_t)(end - at));
        if (colon == NULL) break;
        Py_ssize_t q = colon - data;
        at = q + 1;
        if (q + 3 >= end || data[q + 1] != '/' || data[q + 2] != '/') continue;
        Py_ssize_t from = -1;
        if (q - 5 >= taken && memcmp(data + q - 5, "https", 5) == 0) from = q - 5;
        else if (q - 4 >= taken && memcmp(data + q - 4, "http", 4) == 0) from = q - 4;
        if (from < 0) continue;
        Py_ssize_t to = q + 3;
        while (to < end && data[to] < 0x80 && (classes[data[to]] & C_URL)) to++;
        if (to == q + 3) continue;
        total += to - from;
        taken = at = to;
    }
    return total;
}

/* Non-blank lines, and those of them that end without an end mark or with an ellipsis mark. */
typedef struct {
    int64_t lines, without_end_mark, ending_with_ellipsis;
} Lines;

/* Counts the non-blank line [start, last], last its last byte that is not whitespace. */
static inline void end_line(Lines *line, const uint8_t *data, const uint16_t *classes, const Strings *ellipsis, Py_ssize_t start,
                            Py_ssize_t last) {
    line->lines++;
    line->without_end_mark += !(data[last] < 0x80 && (classes[data[last]] & C_END_MARK));
    line->ending_with_ellipsis += ends_with_one_of(ellipsis, data, start, last);
}

typedef struct {
    Py_buffer data, bounds, classes, out;
} Buffers;

static void release(Buffers *b) {
    if (b->data.obj) PyBuffer_Release(&b->data);
    if (b->bounds.obj) PyBuffer_Release(&b->bounds);
    if (b->classes.obj) PyBuffer_Release(&b->classes);
    if (b->out.obj) PyBuffer_Release(&b->out);
}

static int check(Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t items, const char *what) {
    if (b->len != itemsize * items) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes, got %zd", what, itemsize * items, b->len);
        return -1;
    }
    return 0;
}

/* How many texts the bounds describe, after checking the class table and that out holds fields counts per text;
   -1, with an exception set, if not. */
static Py_ssize_t texts_in(Buffers *b, Py_ssize_t fields) {
    Py_ssize_t n = b->bounds.len / 8 - 1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "bounds: each text's start, and the last one's end (int64)");
        return -1;
    }
    if (check(&b->classes, 2, MAX_CODE, "classes") || check(&b->out, 8, n * fields, "out")) return -1;
    return n;
}

/* Whether [start, end) lies in the data, an exception set if not. */
static int inside(const Buffers *b, Py_ssize_t t, Py_ssize_t start, Py_ssize_t end) {
    if (start < 0 || end < start || end > b->data.len) {
        PyErr_Format(PyExc_ValueError, "text %zd: bounds [%zd, %zd) outside the data", t, start, end);
        return 0;
    }
    return 1;
}

typedef struct {
    uint64_t hash;
    Py_ssize_t start, length, chars;
} Piece;

/* A hash of the n bytes at p. Bytes up to limit may be read (a whole 8 bytes for the tail, where they lie before
   limit, rather than a copy byte by byte: words are short, and the copy stalled the load after it). */
static inline uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n, const uint8_t *limit) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, x;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, p + i, 8);
        h = (h ^ x) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    const Py_ssize_t tail = n - i;
    x = 0;
    if (tail > 0 && limit - (p + i) >= 8) {
        memcpy(&x, p + i, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        x &= ~0ULL << (64 - 8 * tail);
#else
        x &= ~0ULL >> (64 - 8 * tail);
#endif
    } else {
        memcpy(&x, p + i, (size_t)tail);
    }
    h = (h ^ x) * 0x94D049BB133111EBULL;
    return h ^ h >> 29;
}

/* Word n-grams (Gopher's repetition filters), exactly, level by level. Each text's words (as str.split) are hashed
   once and interned: a word's id is where it first occurs. An n-gram's id is where it first occurs too, interned by
   the pair (id of its first n - 1 words, id of its last word), so equal n-grams are found by comparing two integers,
   and a collision of hashes only costs a probe. An n-gram that occurs twice is made of (n - 1)-grams that occur twice,
   so each level looks only at the positions where the level below found two such in a row: on prose, a few percent
   of the words past the second level. */

typedef struct {
    int32_t prev, last; /* the key: the id of the first n - 1 words (the word's hash, for words), of the last word */
    int32_t first;      /* where the n-gram (or word) first occurs: its id; -1 for an empty slot */
    int32_t count;
} Slot;

typedef struct {
    Py_ssize_t capacity;   /* words the arrays below hold */
    Py_ssize_t *start;     /* each word's first byte */
    int32_t *length;       /* its bytes */
    int64_t *chars_before; /* characters in the words before it (one more entry, for all of them) */
    uint64_t *hash;        /* a hash of its bytes */
    int32_t *id;           /* where the first word equal to it is */
    int32_t *at;           /* per repeated n-gram of the level, where it is, in order (then the next level's candidates) */
    int32_t *gram;         /* its id */
    int32_t *slot;         /* its slot in the level's table */
    Py_ssize_t slots;      /* the size of table */
    Slot *table;
    Py_ssize_t pattern_size; /* the size of pattern */
    uint8_t *pattern;        /* the most frequent n-gram's words joined with single spaces */
} Words;

static void words_free(Words *w) {
    free(w->start), free(w->length), free(w->chars_before), free(w->hash), free(w->id), free(w->at), free(w->gram);
    free(w->slot), free(w->table), free(w->pattern);
}

static int grow(void **array, Py_ssize_t items, size_t item_size) {
    void *grown = realloc(*array, (size_t)items * item_size);
    if (grown == NULL) return -1;
    *array = grown;
    return 0;
}

/* Room for the words of a text of size bytes (at most one a byte and a separator); -1 with an exception set. */
static int words_room(Words *w, Py_ssize_t size) {
    const Py_ssize_t capacity = size / 2 + 2;
    if (capacity <= w->capacity) return 0;
    if (capacity > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a text of over 4 GiB");
        return -1;
    }
    if (grow((void **)&w->start, capacity, sizeof *w->start) || grow((void **)&w->length, capacity, sizeof *w->length) ||
        grow((void **)&w->chars_before, capacity, sizeof *w->chars_before) || grow((void **)&w->hash, capacity, sizeof *w->hash) ||
        grow((void **)&w->id, capacity, sizeof *w->id) || grow((void **)&w->at, capacity, sizeof *w->at) ||
        grow((void **)&w->gram, capacity, sizeof *w->gram) || grow((void **)&w->slot, capacity, sizeof *w->slot)) {
        PyErr_NoMemory();
        return -1;
    }
    w->capacity = capacity;
    return 0;
}

/* An empty table of at least twice items slots (a power of two); its mask, or -1 with MemoryError set. */
static Py_ssize_t empty_table(Words *w, Py_ssize_t items) {
    Py_ssize_t slots = 16;
    while (slots < 2 * items) slots *= 2;
    if (slots > w->slots) {
        if (grow((void **)&w->table, slots, sizeof(Slot))) {
            PyErr_NoMemory();
            return -1;
        }
        w->slots = slots;
    }
    memset(w->table, 0xFF, (size_t)slots * sizeof(Slot));
    return slots - 1;
}

static inline Py_ssize_t slot_of(uint64_t key, Py_ssize_t mask) {
    return (Py_ssize_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
}

/* Whether the code point just decoded at p is a replacement for bytes that are not UTF-8 (not a U+FFFD written out). */
static inline int replaced(uint32_t code, const uint8_t *p, int width) {
    return code == REPLACEMENT && !(width == 3 && p[0] == 0xEF && p[1] == 0xBF && p[2] == 0xBD);
}

/* Whether the n bytes at a and at b are the same; bytes up to limit may be read. */
static inline int same_bytes(const uint8_t *a, const uint8_t *b, Py_ssize_t n, const uint8_t *limit) {
    if (n <= 8 && limit - a >= 8 && limit - b >= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        return ((x ^ y) >> (64 - 8 * n)) == 0;
#else
        return ((x ^ y) << (64 - 8 * n)) == 0;
#endif
    }
    return memcmp(a, b, (size_t)n) == 0;
}

/* Interns the count words w holds (their starts, lengths and hashes): each word's id, and, in w->at and w->gram,
   those that occur twice or more; -1 with MemoryError set. */
static int intern_words(Words *w, Py_ssize_t count, const uint8_t *data, const uint8_t *limit, Py_ssize_t *repeated) {
    const Py_ssize_t mask = empty_table(w, count);
    if (mask < 0) return -1;
    const Py_ssize_t *const word_start = w->start;
    const int32_t *const length = w->length;
    const uint64_t *const hash = w->hash;
    int32_t *const id = w->id, *const at = w->at, *const gram = w->gram, *const slots = w->slot;
    Slot *const table = w->table;
    for (Py_ssize_t k = 0; k < count; k++) {
        const uint64_t h = hash[k];
        const int32_t prev = (int32_t)(h >> 32), last = (int32_t)h;
        Py_ssize_t slot = slot_of(h, mask);
        for (;; slot = (slot + 1) & mask) {
            Slot *s = &table[slot];
            if (s->first < 0) {
                *s = (Slot){prev, last, (int32_t)k, 1};
                break;
            }
            if (s->prev == prev && s->last == last && length[s->first] == length[k] &&
                same_bytes(data + word_start[s->first], data + word_start[k], length[k], limit)) {
                s->count++;
                break;
            }
        }
        id[k] = table[slot].first;
        slots[k] = (int32_t)slot;
    }
    Py_ssize_t listed = 0;
    for (Py_ssize_t k = 0; k < count; k++) /* without a branch: whether a word repeats is not predictable */
        at[listed] = (int32_t)k, gram[listed] = id[k], listed += table[slots[k]].count > 1;
    *repeated = listed;
    return 0;
}

/* Adds a word of the text to w: where it starts, its bytes and characters. */
static inline void add_word(Words *w, Py_ssize_t count, const uint8_t *data, Py_ssize_t from, Py_ssize_t to, int64_t chars,
                            const uint8_t *limit) {
    w->start[count] = from;
    w->length[count] = (int32_t)(to - from);
    w->chars_before[count + 1] = w->chars_before[count] + chars;
    w->hash[count] = hash_bytes(data + from, to - from, limit);
}

enum { B_WORD, B_SPACE, B_WIDE }; /* a byte: ASCII in a word, ASCII whitespace, the start of a character outside ASCII */

/* Splits [start, end) into words as str.split, counting its characters, and interns the words (intern_words). Returns how many words, -1 with an exception set, or -2 where the text
   is not valid UTF-8 (its words are then Python's replaced ones, which the bytes do not say). */
static Py_ssize_t split_words(Words *w, const uint8_t *data, Py_ssize_t start, Py_ssize_t end, const uint8_t *limit,
                              const uint16_t *classes, const uint8_t *kinds, int64_t *text_chars, Py_ssize_t *repeated) {
    if (words_room(w, end - start) < 0) return -1;
    w->chars_before[0] = 0;
    Py_ssize_t count = 0, i = start, extra = 0; /* extra: bytes past the first of each character outside ASCII */
    for (;;) {
        while (i < end) {
            const uint8_t kind = kinds[data[i]];
            if (kind == B_WORD) break;
            if (kind == B_SPACE) {
                i++;
                continue;
            }
            int width;
            const uint32_t code = decode(data + i, data + end, &width);
            if (replaced(code, data + i, width)) return -2;
            if (!(classes[code] & C_SPACE)) break;
            extra += width - 1;
            i += width;
        }
        if (i >= end) break;
        const Py_ssize_t from = i, extra_before = extra;
        while (i < end) {
            if (limit - (data + i) >= 8) {
                /* 8 bytes at a time to the first that is whitespace or outside ASCII, or may be (under 0x21) */
                uint64_t x;
                memcpy(&x, data + i, 8);
                const Py_ssize_t take = ascii_word_bytes(x);
                i += take;
                if (take == 8) continue;
                if (i >= end) break;
            }
            const uint8_t kind = kinds[data[i]];
            if (kind == B_WORD) {
                i++;
                continue;
            }
            if (kind == B_SPACE) break;
            int width;
            const uint32_t code = decode(data + i, data + end, &width);
            if (replaced(code, data + i, width)) return -2;
            if (classes[code] & C_SPACE) break;
            extra += width - 1;
            i += width;
        }
        if (i > end) i = end;
        add_word(w, count++, data, from, i, i - from - (extra - extra_before), limit);
    }
    *text_chars = end - start - extra;
    return intern_words(w, count, data, limit, repeated) < 0 ? -1 : count;
}

/* One level: the n-grams at the positions where the level below listed two repeated (n - 1)-grams in a row (the
   others occur once). Interns them and lists, in place of the level below, those that occur twice or more.
   duplicate_chars (where not NULL) gets the characters in the words that repeat an earlier n-gram, with the spaces
   between them, as NeMo counts them: each repeat adds the words it covers that the repeat before did not, and one
   space before each but its first. best (where not NULL) gets the most frequent n-gram's first position, the first
   of those tied (0 where all occur once). Returns how many are listed, or -1 with MemoryError set. */
static Py_ssize_t next_level(Words *w, Py_ssize_t listed, Py_ssize_t n, int64_t *duplicate_chars, Py_ssize_t *best) {
    Py_ssize_t candidates = 0;
    int32_t *const at = w->at, *const gram = w->gram;
    for (Py_ssize_t k = 0; k + 1 < listed; k++) /* without branches, as in split_words */
        at[candidates] = at[k], gram[candidates] = gram[k], candidates += at[k + 1] == at[k] + 1;
    Py_ssize_t mask = empty_table(w, candidates);
    if (mask < 0) return -1;
    int32_t best_first = 0, best_count = 1;
    int64_t chars = 0;
    Py_ssize_t covered_to = 0;
    for (Py_ssize_t k = 0; k < candidates; k++) {
        const int32_t i = at[k], prev = gram[k], last = w->id[i + n - 1];
        Py_ssize_t slot = slot_of((uint64_t)(uint32_t)prev << 32 | (uint32_t)last, mask);
        Slot *s;
        for (;; slot = (slot + 1) & mask) {
            s = &w->table[slot];
            if (s->first < 0) {
                *s = (Slot){prev, last, i, 0};
                break;
            }
            if (s->prev == prev && s->last == last) {
                Py_ssize_t first_new = i > covered_to ? i : covered_to;
                chars += w->chars_before[i + n] - w->chars_before[first_new] + (i + n - first_new < n - 1 ? i + n - first_new : n - 1);
                covered_to = i + n;
                break;
            }
        }
        s->count++;
        if (s->count > best_count || (s->count == best_count && s->first < best_first)) best_first = s->first, best_count = s->count;
        w->slot[k] = (int32_t)slot;
    }
    Py_ssize_t repeated = 0;
    for (Py_ssize_t k = 0; k < candidates; k++) {
        const Slot *s = &w->table[w->slot[k]];
        at[repeated] = at[k], gram[repeated] = s->first, repeated += s->count > 1;
    }
    if (duplicate_chars) *duplicate_chars = chars;
    if (best) *best = best_first;
    return repeated;
}

/* Characters in the occurrences of the n words from first joined with single spaces, found in [start, end) left to
   right, not overlapping, as str.replace finds them; -1 with MemoryError set. */
static int64_t occurrence_chars(Words *w, Py_ssize_t first, Py_ssize_t n, const uint8_t *data, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t size = n - 1;
    for (Py_ssize_t k = first; k < first + n; k++) size += w->length[k];
    if (size > w->pattern_size) {
        if (grow((void **)&w->pattern, size, 1)) {
            PyErr_NoMemory();
            return -1;
        }
        w->pattern_size = size;
    }
    uint8_t *p = w->pattern;
    for (Py_ssize_t k = first; k < first + n; k++) {
        if (k > first) *p++ = ' ';
        memcpy(p, data + w->start[k], (size_t)w->length[k]);
        p += w->length[k];
    }
    int64_t found = 0;
    for (const uint8_t *at = data + start, *stop = data + end; at + size <= stop; found++) {
        const uint8_t *hit = memmem(at, (size_t)(stop - at), w->pattern, (size_t)size);
        if (hit == NULL) break;
        at = hit + size;
    }
    return found * (w->chars_before[first + n] - w->chars_before[first] + n - 1);
}

/* occurrence_chars for n >= 3, from the words instead of the bytes. The n words from first joined with single spaces
   hold no other whitespace, so each occurrence lies on n consecutive words of the text: the first ends with the n-gram's
   first word, the last starts with its last, those between are its own, and one space (no other whitespace) parts each
   from the next. Only where the second word is the n-gram's own are the others compared, left to right, an occurrence
   that overlaps the one counted before left out. */
static int64_t occurrence_chars_by_words(const Words *w, Py_ssize_t count, Py_ssize_t first, Py_ssize_t n, const uint8_t *data) {
    const Py_ssize_t *start = w->start;
    const int32_t *length = w->length, *id = w->id, second = w->id[first + 1];
    const Py_ssize_t head = length[first], tail = length[first + n - 1];
    Py_ssize_t size = n - 1, free_from = 0;
    for (Py_ssize_t k = first; k < first + n; k++) size += length[k];
    int64_t found = 0;
    for (Py_ssize_t j = 0; j + n <= count; j++) {
        if (id[j + 1] != second) continue;
        Py_ssize_t k = 2;
        while (k < n - 1 && id[j + k] == id[first + k]) k++;
        if (k < n - 1) continue;
        const Py_ssize_t at = start[j] + length[j] - head;
        int joined = at >= free_from && length[j] >= head && length[j + n - 1] >= tail;
        for (k = 0; joined && k < n - 1; k++) {
            const Py_ssize_t gap = start[j + k] + length[j + k];
            joined = start[j + k + 1] == gap + 1 && data[gap] == ' ';
        }
        if (joined && memcmp(data + at, data + start[first], (size_t)head) == 0 &&
            memcmp(data + start[j + n - 1], data + start[first + n - 1], (size_t)tail) == 0) {
            found++;
            free_from = at + size;
        }
    }
    return found * (w->chars_before[first + n] - w->chars_before[first] + n - 1);
}

/* The n-gram sizes asked for: of top n-grams, of duplicate ones. */
typedef struct {
    Py_buffer top, duplicate;
    Py_ssize_t tops, duplicates, largest;
    int wants_words; /* whether a size is 1 */
} Sizes;

/* Checks the sizes (each at least 1); -1 with ValueError set. */
static int sizes_check(Sizes *sizes) {
    sizes->tops = sizes->top.len / 8, sizes->duplicates = sizes->duplicate.len / 8, sizes->largest = 1, sizes->wants_words = 0;
    for (Py_ssize_t k = 0; k < sizes->tops + sizes->duplicates; k++) {
        const int64_t size = k < sizes->tops ? ((const int64_t *)sizes->top.buf)[k] : ((const int64_t *)sizes->duplicate.buf)[k - sizes->tops];
        if (size < 1) {
            PyErr_Format(PyExc_ValueError, "n-gram sizes: at least 1, got %lld", (long long)size);
            return -1;
        }
        if (size > sizes->largest) sizes->largest = (Py_ssize_t)size;
        sizes->wants_words |= size == 1;
    }
    return 0;
}

static void sizes_release(Sizes *sizes) {
    if (sizes->top.obj) PyBuffer_Release(&sizes->top);
    if (sizes->duplicate.obj) PyBuffer_Release(&sizes->duplicate);
}

/* A text's row of n-gram counts from its count interned words (listed of them repeated) and its characters: words,
   characters, then, for each top size, the characters in the occurrences of its most frequent n-gram, and for each
   duplicate size, the characters of the words in repeated n-grams (0 for a size over the words); -1 with an
   exception set. */
static int ngram_row(Words *w, Py_ssize_t count, Py_ssize_t listed, int64_t chars, const Sizes *sizes, const uint8_t *data,
                     Py_ssize_t start, Py_ssize_t end, int64_t *row) {
    const int64_t *top_sizes = sizes->top.buf, *duplicate_sizes = sizes->duplicate.buf;
    memset(row, 0, (size_t)(2 + sizes->tops + sizes->duplicates) * sizeof *row);
    row[0] = count, row[1] = chars;
    for (Py_ssize_t size = 1; size <= sizes->largest && size <= count; size++) {
        int64_t duplicate_chars = 0;
        Py_ssize_t best = 0;
        if (size > 1 && (listed = next_level(w, listed, size, &duplicate_chars, &best)) < 0) return -1;
        if (size == 1 && sizes->wants_words) {
            /* words: the first of the most frequent, and the characters of words seen before */
            int32_t best_count = 1;
            for (Py_ssize_t k = 0; k < count; k++) {
                const Slot *s = &w->table[w->slot[k]];
                if (s->count > best_count) best = s->first, best_count = s->count;
                if (w->id[k] != k) duplicate_chars += w->chars_before[k + 1] - w->chars_before[k];
            }
        }
        for (Py_ssize_t k = 0; k < sizes->tops; k++)
            if (top_sizes[k] == size && (row[2 + k] = size >= 3 ? occurrence_chars_by_words(w, count, best, size, data)
                                                                 : occurrence_chars(w, best, size, data, start, end)) < 0)
                return -1;
        for (Py_ssize_t k = 0; k < sizes->duplicates; k++)
            if (duplicate_sizes[k] == size) row[2 + sizes->tops + k] = duplicate_chars;
    }
    return 0;
}

/* Whether the classes' ASCII whitespace and letters are those the SSE2 masks find (str.isspace's, a-z and A-Z). */
static int masks_hold(const uint16_t *classes) {
    int hold = 1;
    for (int byte = 0; byte < 0x80; byte++) {
        const int space = (byte >= 0x09 && byte <= 0x0D) || (byte >= 0x1C && byte <= 0x20);
        const int letter = (byte | 0x20) >= 'a' && (byte | 0x20) <= 'z';
        hold &= !(classes[byte] & C_SPACE) == !space && !(classes[byte] & C_LETTER) == !letter;
    }
    return hold;
}

static PyObject *profile(PyObject *self, PyObject *args) {
    PyObject *symbol_tuple, *common_tuple, *ellipsis_tuple, *is_letter;
    Buffers b = {0};
    Strings symbols, common, ellipsis;
    Sizes sizes = {0};
    Py_buffer ngram_buffer = {0};
    Words w = {0};
    if (!PyArg_ParseTuple(args, "y*y*w*OOOOw*|y*y*w*", &b.data, &b.bounds, &b.classes, &is_letter, &symbol_tuple, &common_tuple,
                          &ellipsis_tuple, &b.out, &sizes.top, &sizes.duplicate, &ngram_buffer))
        return NULL;
    const int collect = ngram_buffer.obj != NULL; /* the n-gram counts too, from the same words */
    Py_ssize_t n = texts_in(&b, P_FIELDS), fields = 0;
    if (n < 0 || strings_from(symbol_tuple, &symbols, "symbol words") || strings_from(common_tuple, &common, "common words") ||
        strings_from(ellipsis_tuple, &ellipsis, "ellipsis marks"))
        goto fail;
    WordKinds kinds;
    word_kinds_from(&symbols, &common, &kinds);
    if (collect) {
        if (sizes_check(&sizes) < 0) goto fail;
        fields = 2 + sizes.tops + sizes.duplicates;
        if (check(&ngram_buffer, 8, n * fields, "n-gram out")) goto fail;
    }
    int64_t *const ngram_out = ngram_buffer.buf;
    const uint8_t *data = b.data.buf, *limit = data + b.data.len;
    const int64_t *bounds = b.bounds.buf;
    uint16_t *classes = b.classes.buf;
    int64_t *out = b.out.buf;
    uint32_t histogram[4][256];
    uint16_t ascii[128]; /* a copy the compiler knows no call changes */
    memcpy(ascii, classes, sizeof ascii);
#if defined(__SSE2__)
    const int by_masks = masks_hold(classes);
#endif
    const unsigned ascii_class_of[5] = {C_ALNUM, C_DIGIT, C_LAYOUT, C_BRACKET, C_SPACE};
    for (Py_ssize_t t = 0; t < n; t++) {
        const Py_ssize_t start = bounds[t], end = bounds[t + 1];
        if (inside(&b, t, start, end) && end - start >= (Py_ssize_t)1 << 32) /* the histogram counts in 32 bits */
            PyErr_Format(PyExc_ValueError, "text %zd: %zd bytes, over 4 GiB", t, end - start);
        if (PyErr_Occurred()) goto fail;
        Py_ssize_t count = 0; /* words, where collected */
        int valid = 1;        /* whether the text is valid UTF-8, where collected */
        if (collect) {
            if (words_room(&w, end - start) < 0) goto fail;
            w.chars_before[0] = 0;
        }
        /* Characters of an ASCII class from the bytes' histogram; the classes' characters outside ASCII, and the
           characters of words, are counted as the words are read. */
        memset(histogram, 0, sizeof histogram);
        Py_ssize_t i = start;
        for (; i + 4 <= end; i += 4) {
            histogram[0][data[i]]++;
            histogram[1][data[i + 1]]++;
            histogram[2][data[i + 2]]++;
            histogram[3][data[i + 3]]++;
        }
        for (; i < end; i++) histogram[0][data[i]]++;
        int64_t by_class[5] = {0};
        for (int byte = 0; byte < 0x80; byte++) {
            int64_t seen = (int64_t)histogram[0][byte] + histogram[1][byte] + histogram[2][byte] + histogram[3][byte];
            for (int c = 0; c < 5; c++) by_class[c] += classes[byte] & ascii_class_of[c] ? seen : 0;
        }
        int64_t word_chars_total = 0, wide_brackets = 0, wide_spaces = 0;
        int64_t words = 0, longest = 0, letter_words = 0, symbol_words = 0, common_words = 0;
        Lines line = {0};
        int64_t bullet_lines = 0;
        Py_ssize_t line_start = start, line_last = -1;
        i = start;
        for (;;) {
#if defined(__SSE2__)
            if (by_masks && end - i >= ASCII_BLOCK) {
                /* The words, and the lines they end, of the next 64 bytes up to the first outside ASCII, from masks of
                   their classes; a word not ended in them is left for the next block (i is never inside a word). */
                const AsciiMasks m = ascii_masks(data + i);
                const uint64_t ascii_run = m.wide ? (1ULL << __builtin_ctzll(m.wide)) - 1 : ~0ULL;
                const uint64_t nonspace = ~m.space & ascii_run, ends = m.space & ascii_run & (nonspace << 1);
                uint64_t events = (nonspace & ~(nonspace << 1)) | (m.newline & ascii_run);
                Py_ssize_t next = m.wide ? i + __builtin_ctzll(m.wide) : i + ASCII_BLOCK;
                while (events) {
                    const int k = __builtin_ctzll(events);
                    events &= events - 1;
                    if (m.newline >> k & 1) {
                        if (line_last >= 0) end_line(&line, data, classes, &ellipsis, line_start, line_last);
                        line_start = i + k + 1;
                        line_last = -1;
                        continue;
                    }
                    const uint64_t after = ends & (~0ULL << k);
                    if (!after) {
                        next = i + k;
                        break;
                    }
                    const int e = __builtin_ctzll(after);
                    const uint64_t span = (after & -after) - (1ULL << k);
                    const uint64_t run_starts = m.hash & span & ~(m.hash << 1); /* popcount is a call without -mpopcnt */
                    const Py_ssize_t word_chars = e - k, hash_runs = run_starts ? __builtin_popcountll(run_starts) : 0;
                    words++;
                    word_chars_total += word_chars;
                    if (word_chars > longest) longest = word_chars;
                    letter_words += (m.letter & span) != 0;
                    const unsigned kind = word_kind(&kinds, &symbols, &common, data + i + k, word_chars, limit);
                    symbol_words += (2 * hash_runs > word_chars) | (kind & 1);
                    common_words += kind >> 1;
                    line_last = i + e - 1;
                    if (collect) add_word(&w, count++, data, i + k, i + e, word_chars, limit);
                }
                if (next > i) {
                    i = next;
                    continue;
                }
            }
#endif
            /* whitespace, and the lines it ends */
            while (i < end) {
                uint8_t byte = data[i];
                if (byte < 0x80) {
                    if (!(ascii[byte] & C_SPACE)) break;
                    if (byte == '\n') {
                        if (line_last >= 0) end_line(&line, data, classes, &ellipsis, line_start, line_last);
                        line_start = i + 1;
                        line_last = -1;
                    }
                    i++;
                } else {
                    int width;
                    const uint32_t code = decode(data + i, data + end, &width);
                    if (collect && replaced(code, data + i, width)) valid = 0;
                    if (!(classes[code] & C_SPACE)) break;
                    wide_spaces++;
                    i += width;
                }
            }
            if (i >= end) break;
            /* a word */
            Py_ssize_t word_start = i, word_chars = 0;
            unsigned seen = 0;
            while (i < end) {
                if (limit - (data + i) >= 8) {
                    /* the ASCII bytes of the word 8 at a time, to the first that is whitespace or outside ASCII (or
                       may be: under 0x21), which the loop below reads */
                    uint64_t x;
                    memcpy(&x, data + i, 8);
                    Py_ssize_t take = ascii_word_bytes(x);
                    if (take > end - i) take = end - i;
                    if (take > 0) {
                        const uint64_t taken = first_bytes(take);
                        seen |= (bytes_between(x | ONES * 0x20, 'a' - 1, 'z' + 1) & taken ? C_LETTER : 0) |
                                (zero_bytes(x ^ ONES * '#') & taken ? C_HASH : 0);
                        i += take;
                        word_chars += take;
                        if (take == 8) continue;
                        if (i >= end) break;
                    }
                }
                uint8_t byte = data[i];
                unsigned k;
                if (byte < 0x80) {
                    k = ascii[byte];
                    if (k & C_SPACE) break;
                    i++;
                } else {
                    int width, wide = wide_classes(data + i, data + end, classes, is_letter, &width);
                    if (wide < 0) goto fail;
                    if (collect && replaced(decode(data + i, data + end, &width), data + i, width)) valid = 0;
                    k = (unsigned)wide;
                    if (k & C_SPACE) break;
                    wide_brackets += (k & C_BRACKET) != 0;
                    if (word_chars == 0 && line_last < 0) bullet_lines += (k & C_BULLET) != 0;
                    i += width;
                }
                seen |= k;
                word_chars++;
            }
            words++;
            word_chars_total += word_chars;
            if (word_chars > longest) longest = word_chars;
            letter_words += (seen & C_LETTER) != 0;
            Py_ssize_t hash_runs = 0;
            if (seen & C_HASH)
                for (Py_ssize_t j = word_start; j < i; j++) hash_runs += data[j] == '#' && (j == word_start || data[j - 1] != '#');
            const unsigned kind = word_kind(&kinds, &symbols, &common, data + word_start, i - word_start, limit);
            symbol_words += (2 * hash_runs > word_chars) | (kind & 1);
            common_words += kind >> 1;
            line_last = i - 1;
            if (collect) add_word(&w, count++, data, word_start, i, word_chars, limit);
        }
        if (line_last >= 0) end_line(&line, data, classes, &ellipsis, line_start, line_last);
        int64_t spaces = by_class[4] + wide_spaces, chars = word_chars_total + spaces;
        int64_t *c = out + t * P_FIELDS;
        c[P_WORDS] = words, c[P_CHARS] = chars, c[P_NONSPACE] = word_chars_total, c[P_ALNUM] = by_class[0];
        c[P_DIGITS] = by_class[1], c[P_LAYOUT] = by_class[2], c[P_BRACKETS] = by_class[3] + wide_brackets;
        c[P_LONGEST_WORD] = longest, c[P_LETTER_WORDS] = letter_words, c[P_SYMBOL_WORDS] = symbol_words;
        c[P_COMMON_WORDS] = common_words, c[P_LINES] = line.lines, c[P_LINES_WITHOUT_END_MARK] = line.without_end_mark;
        c[P_ELLIPSIS_LINES] = line.ending_with_ellipsis, c[P_BULLET_LINES] = bullet_lines;
        c[P_URL_CHARS] = url_chars(data, start, end, classes);
        if (collect) {
            int64_t *row = ngram_out + t * fields;
            Py_ssize_t listed;
            if (!valid) {
                memset(row, 0, (size_t)fields * sizeof *row);
                row[0] = -1;
            } else if (intern_words(&w, count, data, limit, &listed) < 0 || ngram_row(&w, count, listed, chars, &sizes, data, start, end, row) < 0) {
                goto fail;
            }
        }
    }
    words_free(&w);
    sizes_release(&sizes);
    if (ngram_buffer.obj) PyBuffer_Release(&ngram_buffer);
    release(&b);
    Py_RETURN_NONE;
fail:
    words_free(&w);
    sizes_release(&sizes);
    if (ngram_buffer.obj) PyBuffer_Release(&ngram_buffer);
    release(&b);
    return NULL;
}

/* Into c: the count pieces of one text, the distinct ones (an open-addressing set of indices into found, at least
   twice as large as count, grown in *table as needed), the characters in all of them and in the distinct ones. */
static int count_distinct(const Piece *found, Py_ssize_t count, const uint8_t *data, Py_ssize_t **table,
                          Py_ssize_t *table_size, int64_t *c) {
    Py_ssize_t slots = 16;
    while (slots < 2 * count) slots *= 2;
    if (slots > *table_size) {
        Py_ssize_t *grown = realloc(*table, (size_t)slots * sizeof(Py_ssize_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *table = grown;
        *table_size = slots;
    }
    Py_ssize_t *set = *table;
    memset(set, 0xFF, (size_t)slots * sizeof(Py_ssize_t));
    int64_t total_chars = 0, distinct = 0, distinct_chars = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Piece *piece = &found[i];
        total_chars += piece->chars;
        Py_ssize_t slot = (Py_ssize_t)(piece->hash & (uint64_t)(slots - 1));
        for (;; slot = (slot + 1) & (slots - 1)) {
            Py_ssize_t other = set[slot];
            if (other < 0) {
                set[slot] = i;
                distinct++;
                distinct_chars += piece->chars;
                break;
            }
            if (found[other].hash == piece->hash && found[other].length == piece->length &&
                memcmp(data + found[other].start, data + piece->start, (size_t)piece->length) == 0)
                break;
        }
    }
    c[0] = count, c[1] = distinct, c[2] = total_chars, c[3] = distinct_chars;
    return 0;
}

/* Appends a piece to *found (of *capacity), grown as needed. */
static int add_piece(Piece **found, Py_ssize_t *count, Py_ssize_t *capacity, Piece piece) {
    if (*count == *capacity) {
        *capacity = *capacity ? 2 * *capacity : 256;
        Piece *grown = realloc(*found, (size_t)*capacity * sizeof(Piece));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *found = grown;
    }
    (*found)[(*count)++] = piece;
    return 0;
}

/* Counts each text's non-blank lines and its paragraphs (blank ones too; "\n\n"-separated, left to right, not
   overlapping, as str.split), the distinct ones of each and the characters in them, from one pass: a paragraph is a
   run of lines, cut
   where str.split("\n\n") cuts, at an empty line that neither starts the paragraph nor ends the text; its hash is made
   from its lines' (equal paragraphs have equal lines, and equal hashes are compared byte for byte). */
static PyObject *lines_and_paragraphs(PyObject *self, PyObject *args) {
    Buffers b = {0};
    Py_buffer paragraph_out = {0};
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*", &b.data, &b.bounds, &b.classes, &b.out, &paragraph_out)) return NULL;
    Py_ssize_t capacity = 0, paragraph_capacity = 0, table_size = 0;
    Piece *found = NULL, *paragraphs = NULL;
    Py_ssize_t *table = NULL;
    Py_ssize_t n = texts_in(&b, 4);
    if (n < 0 || check(&paragraph_out, 8, n * 4, "paragraph_out")) goto fail;
    const uint8_t *data = b.data.buf;
    const int64_t *bounds = b.bounds.buf;
    const uint16_t *classes = b.classes.buf;
#if defined(__SSE2__)
    const int by_masks = masks_hold(classes);
#else
    const int by_masks = 0;
#endif
    for (Py_ssize_t t = 0; t < n; t++) {
        const Py_ssize_t start = bounds[t], end = bounds[t + 1];
        if (!inside(&b, t, start, end)) goto fail;
        Py_ssize_t count = 0, paragraph_count = 0, paragraph_lines = 0;
        Piece paragraph = {0, start, 0, 0};
        for (Py_ssize_t from = start;;) {
            Py_ssize_t to;
            int wide, filled = 1; /* whether a byte of the line is outside ASCII; is not ASCII whitespace (by_masks) */
#if defined(__SSE2__)
            if (by_masks) {
                to = line_end(data, from, end, &wide, &filled);
            } else
#endif
            {
                const uint8_t *newline = memchr(data + from, '\n', (size_t)(end - from));
                to = newline ? newline - data : end;
                uint64_t high = 0;
                Py_ssize_t i = from;
                for (; i + 8 <= to; i += 8) {
                    uint64_t x;
                    memcpy(&x, data + i, 8);
                    high |= x & HIGHS;
                }
                for (; i < to; i++) high |= data[i] & 0x80;
                wide = high != 0;
            }
            if (to == from && paragraph_lines > 0 && to < end) {
                paragraph.length = from - 1 - paragraph.start;
                if (add_piece(&paragraphs, &paragraph_count, &paragraph_capacity, paragraph) < 0) goto fail;
                paragraph = (Piece){0, to + 1, 0, 0};
                paragraph_lines = 0;
                from = to + 1;
                continue;
            }
            Py_ssize_t chars = to - from;
            int blank = wide || !by_masks || !filled; /* else an ASCII line with a byte that is not whitespace */
            for (Py_ssize_t i = from; (wide || blank) && i < to;) {
                int width;
                if (blank) blank = (classes[decode(data + i, data + to, &width)] & C_SPACE) != 0;
                else decode(data + i, data + to, &width);
                chars -= width - 1;
                i += width;
            }
            const uint64_t hash = hash_bytes(data + from, to - from, data + b.data.len);
            if (!blank && add_piece(&found, &count, &capacity, (Piece){hash, from, to - from, chars}) < 0) goto fail;
            paragraph.hash = (paragraph.hash ^ hash) * 0xBF58476D1CE4E5B9ULL;
            paragraph.hash ^= paragraph.hash >> 31;
            paragraph.chars += chars + (paragraph_lines > 0);
            paragraph_lines++;
            if (to >= end) break;
            from = to + 1;
        }
        paragraph.length = end - paragraph.start;
        if (add_piece(&paragraphs, &paragraph_count, &paragraph_capacity, paragraph) < 0 ||
            count_distinct(found, count, data, &table, &table_size, (int64_t *)b.out.buf + t * 4) < 0 ||
            count_distinct(paragraphs, paragraph_count, data, &table, &table_size, (int64_t *)paragraph_out.buf + t * 4) < 0)
            goto fail;
    }
    free(found);
    free(paragraphs);
    free(table);
    PyBuffer_Release(&paragraph_out);
    release(&b);
    Py_RETURN_NONE;
fail:
    free(found);
    free(paragraphs);
    free(table);
    if (paragraph_out.obj) PyBuffer_Release(&paragraph_out);
    release(&b);
    return NULL;
}

/* Per text: its words and characters (-1 words where it is not valid UTF-8), then its n-gram counts (ngram_row). */
static PyObject *ngrams(PyObject *self, PyObject *args) {
    Buffers b = {0};
    Sizes sizes = {0};
    Words w = {0};
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*", &b.data, &b.bounds, &b.classes, &sizes.top, &sizes.duplicate, &b.out)) goto fail;
    if (sizes_check(&sizes) < 0) goto fail;
    const Py_ssize_t fields = 2 + sizes.tops + sizes.duplicates, n = texts_in(&b, fields);
    if (n < 0) goto fail;
    const uint8_t *data = b.data.buf, *limit = data + b.data.len;
    const int64_t *bounds = b.bounds.buf;
    const uint16_t *classes = b.classes.buf;
    int64_t *out = b.out.buf;
    uint8_t kinds[256];
    for (int byte = 0; byte < 256; byte++) kinds[byte] = byte >= 0x80 ? B_WIDE : classes[byte] & C_SPACE ? B_SPACE : B_WORD;
    for (Py_ssize_t t = 0; t < n; t++) {
        const Py_ssize_t start = bounds[t], end = bounds[t + 1];
        if (!inside(&b, t, start, end)) goto fail;
        int64_t chars = 0;
        Py_ssize_t listed, count = split_words(&w, data, start, end, limit, classes, kinds, &chars, &listed);
        if (count == -1) goto fail;
        if (count == -2) {
            memset(out + t * fields, 0, (size_t)fields * sizeof *out);
            out[t * fields] = -1;
        } else if (ngram_row(&w, count, listed, chars, &sizes, data, start, end, out + t * fields) < 0) {
            goto fail;
        }
    }
    words_free(&w);
    sizes_release(&sizes);
    release(&b);
    Py_RETURN_NONE;
fail:
    words_free(&w);
    sizes_release(&sizes);
    release(&b);
    return NULL;
}

/* Whether the n bytes at p are pattern, its ASCII letters (lowercase) matching either case. */
static inline int folded_equal(const uint8_t *p, const uint8_t *pattern, Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < n; j++) {
        const uint8_t want = pattern[j], got = want >= 'a' && want <= 'z' ? p[j] | 0x20 : p[j];
        if (got != want) return 0;
    }
    return 1;
}

/* Per text, whether it holds one of the folded patterns (lowercase ASCII, matched in either case), each found from
   its anchor: the index of two bytes rare in text, whose occurrences (either case) are looked for 8 positions at a
   time; or one of the raw byte strings. */
static PyObject *mentions(PyObject *self, PyObject *args) {
    Buffers b = {0};
    PyObject *folded_tuple, *anchor_tuple, *raw_tuple;
    Strings folded, raw;
    if (!PyArg_ParseTuple(args, "y*y*OOOw*", &b.data, &b.bounds, &folded_tuple, &anchor_tuple, &raw_tuple, &b.out)) return NULL;
    const Py_ssize_t n = b.bounds.len / 8 - 1;
    Py_ssize_t anchors[16];
    uint64_t firsts[16], seconds[16]; /* each pattern's two anchor bytes, as 8 copies, ASCII letters' case bit set */
    if (n < 0 || check(&b.out, 1, n, "out") || strings_from(folded_tuple, &folded, "patterns") || strings_from(raw_tuple, &raw, "raw patterns"))
        goto fail;
    if (!PyTuple_Check(anchor_tuple) || PyTuple_GET_SIZE(anchor_tuple) != folded.count) {
        PyErr_SetString(PyExc_TypeError, "anchors: a tuple of one index per pattern");
        goto fail;
    }
    for (Py_ssize_t m = 0; m < folded.count; m++) {
        anchors[m] = PyLong_AsSsize_t(PyTuple_GET_ITEM(anchor_tuple, m));
        if (anchors[m] == -1 && PyErr_Occurred()) goto fail;
        if (anchors[m] < 0 || anchors[m] + 1 >= folded.lengths[m]) {
            PyErr_Format(PyExc_ValueError, "anchors: %zd is not the index of two bytes of pattern %zd", anchors[m], m);
            goto fail;
        }
        firsts[m] = ONES * ((uint8_t)folded.bytes[m][anchors[m]] | 0x20);
        seconds[m] = ONES * ((uint8_t)folded.bytes[m][anchors[m] + 1] | 0x20);
    }
    const uint8_t *data = b.data.buf;
    const int64_t *bounds = b.bounds.buf;
    uint8_t *out = b.out.buf;
    for (Py_ssize_t t = 0; t < n; t++) {
        const Py_ssize_t start = bounds[t], end = bounds[t + 1];
        if (!inside(&b, t, start, end)) goto fail;
        int found = 0;
        for (Py_ssize_t i = start; i < end && !found;) {
            /* positions where some pattern's two anchor bytes may start (a superset: every byte's case bit set) */
            uint64_t x = 0, y = 0, hits = 0;
            const Py_ssize_t width = end - i >= 9 ? 8 : 1;
            if (width == 8) {
                memcpy(&x, data + i, 8);
                memcpy(&y, data + i + 1, 8);
            } else {
                uint8_t tail[9] = {0}; /* the bytes left, then zeros, so that the first is first in memory */
                memcpy(tail, data + i, (size_t)(end - i));
                memcpy(&x, tail, 8);
                memcpy(&y, tail + 1, 8);
            }
            x |= ONES * 0x20, y |= ONES * 0x20;
            for (Py_ssize_t m = 0; m < folded.count; m++) hits |= zero_bytes(x ^ firsts[m]) & zero_bytes(y ^ seconds[m]);
            if (width == 1) hits &= first_bytes(1);
            while (hits && !found) {
                const Py_ssize_t at = i + next_byte(&hits);
                for (Py_ssize_t m = 0; m < folded.count && !found; m++) {
                    const Py_ssize_t from = at - anchors[m];
                    found = from >= start && from + folded.lengths[m] <= end &&
                            folded_equal(data + from, (const uint8_t *)folded.bytes[m], folded.lengths[m]);
                }
            }
            i += width;
        }
        for (Py_ssize_t m = 0; m < raw.count && !found; m++)
            found = memmem(data + start, (size_t)(end - start), raw.bytes[m], (size_t)raw.lengths[m]) != NULL;
        out[t] = (uint8_t)found;
    }
    release(&b);
    Py_RETURN_NONE;
fail:
    release(&b);
    return NULL;
}

static PyMethodDef methods[] = {
    {"profile", profile, METH_VARARGS,
     "profile(data, bounds, classes, is_letter, symbol_words, common_words, ellipsis_marks, out[, top_sizes, "
     "duplicate_sizes, ngram_out]): per-text counts, PROFILE_FIELDS of them, into out (int64, texts x fields); with "
     "ngram_out, the counts of ngrams() too, from the same words."},
    {"lines_and_paragraphs", lines_and_paragraphs, METH_VARARGS,
     "lines_and_paragraphs(data, bounds, classes, line_out, paragraph_out): per text, its non-blank lines, the "
     "distinct ones, their characters and the distinct ones' characters into line_out (int64, texts x 4); the same of "
     "its paragraphs, blank ones too, into paragraph_out."},
    {"mentions", mentions, METH_VARARGS,
     "mentions(data, bounds, patterns, anchors, raw_patterns, out): per text, whether it holds one of the patterns "
     "(lowercase ASCII bytes, matched in either case, each found from its two bytes at its anchor index) or one of "
     "the raw byte strings, into out (uint8, one per text)."},
    {"ngrams", ngrams, METH_VARARGS,
     "ngrams(data, bounds, classes, top_sizes, duplicate_sizes, out): per text, words and characters (-1 words where "
     "it is not valid UTF-8), the characters of its most frequent n-grams' occurrences for each n of top_sizes, and of "
     "its repeated n-grams' words for each n of duplicate_sizes (int64 sizes), into out (int64, texts x (2 + sizes))."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_text_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__text_scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *fields = PyTuple_New(P_FIELDS);
    if (fields == NULL) goto fail;
    for (int i = 0; i < P_FIELDS; i++) {
        PyObject *name = PyUnicode_FromString(PROFILE_FIELDS[i]);
        if (name == NULL) {
            Py_DECREF(fields);
            goto fail;
        }
        PyTuple_SET_ITEM(fields, i, name);
    }
    if (PyModule_AddObject(m, "PROFILE_FIELDS", fields) < 0) {
        Py_DECREF(fields);
        goto fail;
    }
    struct { const char *name; long value; } constants[] = {
        {"SPACE", C_SPACE}, {"ALNUM", C_ALNUM}, {"DIGIT", C_DIGIT}, {"LAYOUT", C_LAYOUT}, {"BRACKET", C_BRACKET},
        {"LETTER", C_LETTER}, {"KNOWN", C_KNOWN}, {"BULLET", C_BULLET}, {"END_MARK", C_END_MARK}, {"URL", C_URL}, {"HASH", C_HASH},
        {"MAX_CODE", MAX_CODE},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
