/*
 * weightcheck._onepass: the tap's one read pass over a tensor's bytes, fused.
 *
 * One call yields what `weightcheck.tap.digesting._hash_and_reduce` yields in Python: the XXH3-128 digest of
 * the bytes (bit-identical to python-xxhash's `xxh3_128_hexdigest`, the reference the checkpoint side uses),
 * the OR of the bytes read as 64-bit little-endian words (zero exactly when every byte is), and whether some
 * element's sign-cleared bits reach the NaN/Inf pattern.
 *
 * Why compiled code: XXH3 runs at the speed of a memory read on current x86 cores, so any separate reduction
 * (numpy's OR per cache-sized slice, or a C loop beside the hash) adds 20-40 % of a read pass. Here the OR is
 * folded into XXH3's own stripe loop: the 64 bytes each accumulate step loads are ORed into one more vector
 * register, so the statistics cost a few instructions per stripe and no memory traffic. Elements are tested
 * for NaN/Inf only in the 1 KiB blocks whose OR has the top exponent bit in some lane (values of magnitude >= 2,
 * rare in weights), while the block is in L1.
 *
 * The hash loop is XXH3's `XXH3_hashLong_128b_internal` with the default secret (what `XXH3_128bits` runs for
 * inputs over 240 bytes), unrolled here so the OR can ride along; shorter inputs take `XXH3_128bits` itself.
 * It needs x86-64 with AVX2 (checked at run time): elsewhere `level()` is "unavailable", `onepass` refuses,
 * and weightcheck keeps the numpy loop over python-xxhash, whose own dispatch (AVX2, NEON) hashes faster than
 * this file's portable build would (a separate OR pass beside an SSE2 or scalar hash measured 2.3x a read pass,
 * the numpy loop 1.3x). Built by setup.py as an optional extension: without a compiler, weightcheck uses the
 * numpy loop; `weightcheck.tap.digesting.native_level()` says which loop runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WC_X86 1
#include <immintrin.h>
#define XXH_X86DISPATCH
#define XXH_DISPATCH_AVX2 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#else
#define WC_X86 0
#endif
#define XXH_INLINE_ALL
#include "xxhash.h"

#if WC_X86
/* Some element of `p[0:n)` (n a multiple of itemsize) has sign-cleared bits >= pattern: a NaN or an Inf. */
static int scan_nonfinite(const uint8_t *p, size_t n, int itemsize, uint64_t pattern) {
    size_t k;
    switch (itemsize) {
    case 2: {
        uint16_t v;
        for (k = 0; k + 2 <= n; k += 2) {
            memcpy(&v, p + k, 2);
            if ((uint64_t)(v & 0x7FFFu) >= pattern) return 1;
        }
        break;
    }
    case 4: {
        uint32_t v;
        for (k = 0; k + 4 <= n; k += 4) {
            memcpy(&v, p + k, 4);
            if ((uint64_t)(v & 0x7FFFFFFFu) >= pattern) return 1;
        }
        break;
    }
    case 8: {
        uint64_t v;
        for (k = 0; k + 8 <= n; k += 8) {
            memcpy(&v, p + k, 8);
            if ((v & 0x7FFFFFFFFFFFFFFFull) >= pattern) return 1;
        }
        break;
    }
    default:
        break;
    }
    return 0;
}

/* OR of bytes [start, end) of data as 64-bit little-endian words counted from data (byte i in lane i mod 8). */
static uint64_t or_range(const uint8_t *data, size_t start, size_t end) {
    uint8_t lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t acc = 0, word;
    size_t i = start;
    while (i < end && (i & 7)) {
        lanes[i & 7] |= data[i];
        i++;
    }
    for (; i + 8 <= end; i += 8) {
        memcpy(&word, data + i, 8);
        acc |= word;
    }
    for (; i < end; i++) lanes[i & 7] |= data[i];
    memcpy(&word, lanes, 8);
    return acc | word; /* lanes as a little-endian word: this extension is built for little-endian hosts */
}

typedef struct {
    uint64_t ored;
    int nonfinite;
} wc_stats;

XXH_TARGET_AVX2 static inline uint64_t fold256(__m256i v) {
    __m128i q = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint64_t)_mm_cvtsi128_si64(q) | (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(q, q));
}

/* XXH3_hashLong_128b_internal(input, len, XXH3_kSecret, sizeof XXH3_kSecret, accumulate_avx2,
 * scrambleAcc_avx2) with each stripe ORed into `orv`; len > XXH3_MIDSIZE_MAX. */
XXH_TARGET_AVX2 static XXH128_hash_t fused_avx2(const uint8_t *input, size_t len, int itemsize, uint64_t top,
                                                uint64_t pattern, wc_stats *st) {
    XXH_ALIGN(XXH_ACC_ALIGN) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC;
    const xxh_u8 *const secret = XXH3_kSecret;
    size_t const secret_size = sizeof(XXH3_kSecret);
    size_t const stripes_per_block = (secret_size - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
    size_t const block_len = XXH_STRIPE_LEN * stripes_per_block;
    size_t const nb_blocks = (len - 1) / block_len;
    size_t n, s, tail_start, nb_stripes;
    uint64_t ored = 0, b;
    int found = 0;
    for (n = 0; n < nb_blocks; n++) {
        const xxh_u8 *const block = input + n * block_len;
        __m256i orv = _mm256_setzero_si256();
        for (s = 0; s < stripes_per_block; s++) {
            const xxh_u8 *const in = block + s * XXH_STRIPE_LEN;
            XXH_PREFETCH(in + XXH_PREFETCH_DIST);
            XXH3_accumulate_512_avx2(acc, in, secret + s * XXH_SECRET_CONSUME_RATE);
            /* the same two loads the accumulate step made: the compiler reuses them */
            orv = _mm256_or_si256(orv, _mm256_or_si256(_mm256_loadu_si256((const __m256i *)in),
                                                       _mm256_loadu_si256((const __m256i *)in + 1)));
        }
        XXH3_scrambleAcc_avx2(acc, secret + secret_size - XXH_STRIPE_LEN);
        b = fold256(orv);
        ored |= b;
        if ((b & top) && !found) found = scan_nonfinite(block, block_len, itemsize, pattern);
    }
    /* the last partial block, then the last stripe (which may overlap it), as XXH3 does */
    tail_start = nb_blocks * block_len;
    nb_stripes = ((len - 1) - tail_start) / XXH_STRIPE_LEN;
    for (s = 0; s < nb_stripes; s++)
        XXH3_accumulate_512_avx2(acc, input + tail_start + s * XXH_STRIPE_LEN, secret + s * XXH_SECRET_CONSUME_RATE);
    XXH3_accumulate_512_avx2(acc, input + len - XXH_STRIPE_LEN,
                             secret + secret_size - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
    b = or_range(input, tail_start, len); /* < 1 KiB + 64 bytes, just read */
    ored |= b;
    if ((b & top) && !found) found = scan_nonfinite(input + tail_start, len - tail_start, itemsize, pattern);
    st->ored = ored;
    st->nonfinite = found;
    return XXH3_finalizeLong_128b(acc, secret, secret_size, (xxh_u64)len);
}
#endif

static int level = -1; /* 1: the fused AVX2 loop runs here; 0: unavailable */

static int pick_level(void) {
    if (level < 0) {
#if WC_X86
        __builtin_cpu_init();
        level = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
        level = 0;
#endif
    }
    return level;
}

static PyObject *onepass(PyObject *self, PyObject *args) {
    Py_buffer view;
    int itemsize;
    unsigned long long top, pattern;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iKK", &view, &itemsize, &top, &pattern)) return NULL;
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "itemsize must be 1, 2, 4 or 8");
        return NULL;
    }
    if (!pick_level()) { /* never run AVX2 code on a CPU without it */
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "the fused one pass needs x86-64 with AVX2");
        return NULL;
    }
#if WC_X86
    {
        wc_stats st = {0, 0};
        XXH128_hash_t h;
        XXH128_canonical_t canonical;
        char hex[33];
        static const char digits[] = "0123456789abcdef";
        int i;
        Py_BEGIN_ALLOW_THREADS
        {
            const uint8_t *data = (const uint8_t *)view.buf;
            size_t len = (size_t)view.len;
            if (len <= XXH3_MIDSIZE_MAX) {
                h = XXH3_128bits(data, len);
                st.ored = or_range(data, 0, len);
                if (st.ored & top) st.nonfinite = scan_nonfinite(data, len, itemsize, pattern);
            } else {
                h = fused_avx2(data, len, itemsize, top, pattern, &st);
            }
        }
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
        XXH128_canonicalFromHash(&canonical, h);
        for (i = 0; i < 16; i++) {
            hex[2 * i] = digits[canonical.digest[i] >> 4];
            hex[2 * i + 1] = digits[canonical.digest[i] & 15];
        }
        hex[32] = 0;
        return Py_BuildValue("sKO", hex, (unsigned long long)st.ored, st.nonfinite ? Py_True : Py_False);
    }
#else
    PyBuffer_Release(&view); /* not reached: pick_level() is 0 off x86-64 */
    Py_RETURN_NONE;
#endif
}

static PyObject *native_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(pick_level() ? "avx2-fused" : "unavailable");
}

static PyMethodDef methods[] = {
    {"onepass", onepass, METH_VARARGS,
     "onepass(buffer, itemsize, top, pattern) -> (xxh3_128 hex digest, OR of the 64-bit LE words, "
     "NaN/Inf present); RuntimeError where level() is 'unavailable'"},
    {"level", native_level, METH_NOARGS, "'avx2-fused' where this CPU runs the fused loop, else 'unavailable'"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_onepass", "The tap's fused one read pass.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__onepass(void) { return PyModule_Create(&module); }
