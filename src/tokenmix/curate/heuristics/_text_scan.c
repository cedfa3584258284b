/* One pass over a batch of UTF-8 texts for NeMo Curator's heuristic filters (tokenmix/curate/heuristics/).

   profile() counts, per text, everything the word, character and line heuristics divide: words, characters of
   each class, the longest word, words that are symbols, stop words or hold a letter, non-blank lines that start with
   a bullet or end without an end mark or with an ellipsis, and characters inside URLs. pieces() counts each text's
   lines or paragraphs and how many of them are distinct. What a character is (whitespace, a letter, a bracket...)
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

typedef struct {
    Py_ssize_t count;
    const char *bytes[16];
    Py_ssize_t lengths[16];
    Py_ssize_t longest;
    uint8_t first[256]; /* whether some string starts with this byte */
} Strings;

static int strings_from(PyObject *tuple, Strings *out, const char *what) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > 16) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple of at most 16 bytes objects", what);
        return -1;
    }
    out->count = PyTuple_GET_SIZE(tuple);
    out->longest = 0;
    memset(out->first, 0, sizeof out->first);
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
        if (out->lengths[i] > out->longest) out->longest = out->lengths[i];
    }
    return 0;
}

static int is_one_of(const Strings *s, const uint8_t *p, Py_ssize_t n) {
    if (n > s->longest || !s->first[p[0]]) return 0;
    for (Py_ssize_t i = 0; i < s->count; i++)
        if (s->lengths[i] == n && memcmp(s->bytes[i], p, (size_t)n) == 0) return 1;
    return 0;
}

/* Whether the line [start, last] ends with one of the marks, ASCII letters of the line in either case. */
static int ends_with_one_of(const Strings *marks, const uint8_t *data, Py_ssize_t start, Py_ssize_t last) {
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

static PyObject *profile(PyObject *self, PyObject *args) {
    PyObject *symbol_tuple, *common_tuple, *ellipsis_tuple, *is_letter;
    Buffers b = {0};
    Strings symbols, common, ellipsis;
    if (!PyArg_ParseTuple(args, "y*y*w*OOOOw*", &b.data, &b.bounds, &b.classes, &is_letter, &symbol_tuple, &common_tuple,
                          &ellipsis_tuple, &b.out))
        return NULL;
    Py_ssize_t n = texts_in(&b, P_FIELDS);
    if (n < 0 || strings_from(symbol_tuple, &symbols, "symbol words") || strings_from(common_tuple, &common, "common words") ||
        strings_from(ellipsis_tuple, &ellipsis, "ellipsis marks")) {
        release(&b);
        return NULL;
    }
    const uint8_t *data = b.data.buf;
    const int64_t *bounds = b.bounds.buf;
    uint16_t *classes = b.classes.buf;
    int64_t *out = b.out.buf;
    uint32_t histogram[4][256];
    uint16_t ascii[128]; /* a copy the compiler knows no call changes */
    memcpy(ascii, classes, sizeof ascii);
    const unsigned ascii_class_of[5] = {C_ALNUM, C_DIGIT, C_LAYOUT, C_BRACKET, C_SPACE};
    for (Py_ssize_t t = 0; t < n; t++) {
        const Py_ssize_t start = bounds[t], end = bounds[t + 1];
        if (inside(&b, t, start, end) && end - start >= (Py_ssize_t)1 << 32) /* the histogram counts in 32 bits */
            PyErr_Format(PyExc_ValueError, "text %zd: %zd bytes, over 4 GiB", t, end - start);
        if (PyErr_Occurred()) {
            release(&b);
            return NULL;
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
                    if (!(classes[decode(data + i, data + end, &width)] & C_SPACE)) break;
                    wide_spaces++;
                    i += width;
                }
            }
            if (i >= end) break;
            /* a word */
            Py_ssize_t word_start = i, word_chars = 0;
            unsigned seen = 0;
            while (i < end) {
                uint8_t byte = data[i];
                unsigned k;
                if (byte < 0x80) {
                    k = ascii[byte];
                    if (k & C_SPACE) break;
                    i++;
                } else {
                    int width, wide = wide_classes(data + i, data + end, classes, is_letter, &width);
                    if (wide < 0) {
                        release(&b);
                        return NULL;
                    }
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
            symbol_words += 2 * hash_runs > word_chars || is_one_of(&symbols, data + word_start, i - word_start);
            common_words += is_one_of(&common, data + word_start, i - word_start);
            line_last = i - 1;
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
    }
    release(&b);
    Py_RETURN_NONE;
}

typedef struct {
    uint64_t hash;
    Py_ssize_t start, length, chars;
} Piece;

static uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, x;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, p + i, 8);
        h = (h ^ x) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    x = 0;
    memcpy(&x, p + i, (size_t)(n - i));
    h = (h ^ x) * 0x94D049BB133111EBULL;
    return h ^ h >> 29;
}

/* Counts each text's pieces between separators ("\n" or "\n\n", left to right, not overlapping, as str.split): all of
   them, the distinct ones, and the characters in each; with skip_blank, pieces of only whitespace are left out. */
static PyObject *pieces(PyObject *self, PyObject *args) {
    Buffers b = {0};
    Py_ssize_t separator;
    int skip_blank;
    if (!PyArg_ParseTuple(args, "y*y*y*npw*", &b.data, &b.bounds, &b.classes, &separator, &skip_blank, &b.out)) return NULL;
    Py_ssize_t n = texts_in(&b, 4);
    if (n < 0) {
        release(&b);
        return NULL;
    }
    if (separator != 1 && separator != 2) {
        release(&b);
        PyErr_SetString(PyExc_ValueError, "separator: 1 (lines) or 2 (paragraphs) newlines");
        return NULL;
    }
    const uint8_t *data = b.data.buf;
    const int64_t *bounds = b.bounds.buf;
    const uint16_t *classes = b.classes.buf;
    int64_t *out = b.out.buf;
    Py_ssize_t capacity = 0, table_size = 0;
    Piece *found = NULL;
    Py_ssize_t *table = NULL;
    for (Py_ssize_t t = 0; t < n; t++) {
        const Py_ssize_t start = bounds[t], end = bounds[t + 1];
        if (!inside(&b, t, start, end)) goto fail;
        Py_ssize_t count = 0;
        for (Py_ssize_t from = start;;) {
            Py_ssize_t to = from;
            for (;;) {
                const uint8_t *newline = memchr(data + to, '\n', (size_t)(end - to));
                to = newline ? newline - data : end;
                if (to == end || separator == 1 || (to + 1 < end && data[to + 1] == '\n')) break;
                to++;
            }
            Py_ssize_t chars = to - from, wide = 0;
            for (Py_ssize_t i = from; i < to; i++) wide += data[i] >= 0x80;
            int blank = 1;
            for (Py_ssize_t i = from; (wide || blank) && i < to;) {
                int width;
                if (blank) blank = (classes[decode(data + i, data + to, &width)] & C_SPACE) != 0;
                else decode(data + i, data + to, &width);
                chars -= width - 1;
                i += width;
            }
            if (!(skip_blank && blank)) {
                if (count == capacity) {
                    capacity = capacity ? 2 * capacity : 256;
                    Piece *grown = realloc(found, (size_t)capacity * sizeof(Piece));
                    if (grown == NULL) {
                        PyErr_NoMemory();
                        goto fail;
                    }
                    found = grown;
                }
                found[count++] = (Piece){hash_bytes(data + from, to - from), from, to - from, chars};
            }
            if (to >= end) break;
            from = to + separator;
        }
        /* the distinct pieces: an open-addressing set of indices into found, at least twice as large as count */
        Py_ssize_t slots = 16;
        while (slots < 2 * count) slots *= 2;
        if (slots > table_size) {
            Py_ssize_t *grown = realloc(table, (size_t)slots * sizeof(Py_ssize_t));
            if (grown == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            table = grown;
            table_size = slots;
        }
        memset(table, 0xFF, (size_t)slots * sizeof(Py_ssize_t));
        int64_t total_chars = 0, distinct = 0, distinct_chars = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            const Piece *piece = &found[i];
            total_chars += piece->chars;
            Py_ssize_t slot = (Py_ssize_t)(piece->hash & (uint64_t)(slots - 1));
            for (;; slot = (slot + 1) & (slots - 1)) {
                Py_ssize_t other = table[slot];
                if (other < 0) {
                    table[slot] = i;
                    distinct++;
                    distinct_chars += piece->chars;
                    break;
                }
                if (found[other].hash == piece->hash && found[other].length == piece->length &&
                    memcmp(data + found[other].start, data + piece->start, (size_t)piece->length) == 0)
                    break;
            }
        }
        int64_t *c = out + t * 4;
        c[0] = count, c[1] = distinct, c[2] = total_chars, c[3] = distinct_chars;
    }
    free(found);
    free(table);
    release(&b);
    Py_RETURN_NONE;
fail:
    free(found);
    free(table);
    release(&b);
    return NULL;
}

static PyMethodDef methods[] = {
    {"profile", profile, METH_VARARGS,
     "profile(data, bounds, classes, is_letter, symbol_words, common_words, ellipsis_marks, out): per-text counts, "
     "PROFILE_FIELDS of them, into out (int64, texts x fields)."},
    {"pieces", pieces, METH_VARARGS,
     "pieces(data, bounds, classes, separator_newlines, skip_blank, out): per text, pieces, distinct pieces, their "
     "characters and the distinct ones' characters into out (int64, texts x 4)."},
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
