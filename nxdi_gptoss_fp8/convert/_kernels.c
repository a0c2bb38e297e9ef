/* One pass per source kind for the converter (optional: built at install where a C compiler
 * exists, loaded through ctypes by convert/kernels.py; without it the torch path runs, which is
 * also the test oracle these functions must match byte for byte).
 *
 * Every table that decides a value or a statistic is built by the torch path and passed in, so
 * this file holds loops and layout only: decode, channel exponent or amax, scale, round to E4M3,
 * transpose into NxDI's [in', out'] layout and the exactness statistics, in cache-sized tiles.
 * Plain C99, no intrinsics, no Python API (the GIL is released for the whole call by ctypes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE_ROWS 128
#define SEGMENT 8192

#ifdef __SSE2__
#include <emmintrin.h>

/* 16 rows of 16 bytes (rows[j] + k) → 16 columns: out[i * ld + j] for i, j < 16. */
static inline void transpose16(const uint8_t *const rows[16], int64_t k, uint8_t *out, int64_t ld) {
    __m128i a[16], b[16];
    for (int j = 0; j < 16; j++) a[j] = _mm_loadu_si128((const __m128i *)(rows[j] + k));
    for (int j = 0; j < 8; j++) {
        b[2 * j] = _mm_unpacklo_epi8(a[2 * j], a[2 * j + 1]);
        b[2 * j + 1] = _mm_unpackhi_epi8(a[2 * j], a[2 * j + 1]);
    }
    for (int j = 0; j < 4; j++) {
        a[4 * j] = _mm_unpacklo_epi16(b[4 * j], b[4 * j + 2]);
        a[4 * j + 1] = _mm_unpackhi_epi16(b[4 * j], b[4 * j + 2]);
        a[4 * j + 2] = _mm_unpacklo_epi16(b[4 * j + 1], b[4 * j + 3]);
        a[4 * j + 3] = _mm_unpackhi_epi16(b[4 * j + 1], b[4 * j + 3]);
    }
    for (int j = 0; j < 2; j++) {
        for (int m = 0; m < 4; m++) {
            b[8 * j + 2 * m] = _mm_unpacklo_epi32(a[8 * j + m], a[8 * j + m + 4]);
            b[8 * j + 2 * m + 1] = _mm_unpackhi_epi32(a[8 * j + m], a[8 * j + m + 4]);
        }
    }
    for (int m = 0; m < 8; m++) {
        a[2 * m] = _mm_unpacklo_epi64(b[m], b[m + 8]);
        a[2 * m + 1] = _mm_unpackhi_epi64(b[m], b[m + 8]);
    }
    /* a[x]: column k + x of the 16 rows */
    for (int x = 0; x < 16; x++) _mm_storeu_si128((__m128i *)(out + x * ld), a[x]);
}
#endif

/* A tile of encoded rows [n, cols] into out[k * ld + dest[r]]: column dest[r] of the output per
 * row. The rows are sorted by destination; runs of 64 whose destinations run on by one go 16
 * columns at a time through four 16 × 16 byte transposes into whole 64-byte output lines, written
 * with streaming stores where aligned (the buffer is far larger than the cache: no line is read
 * before it is overwritten); runs of 16 through one transpose; the rest byte by byte. */
static void place_rows(const uint8_t *tile, int64_t n, int64_t cols, uint8_t *out, int64_t ld,
                       const int64_t *dest) {
    int64_t order[TILE_ROWS];
    for (int64_t r = 0; r < n; r++) {  /* insertion sort of the rows by destination */
        int64_t j = r;
        while (j > 0 && dest[order[j - 1]] > dest[r]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = r;
    }
    int64_t r = 0;
#ifdef __SSE2__
    const int64_t whole = cols - cols % 16;
    while (r + 16 <= n) {
        int run = 1;
        while (r + run < n && run < 64 && dest[order[r + run]] == dest[order[r]] + run) run++;
        if (run < 16) break;
        run = run >= 64 ? 64 : 16;
        const uint8_t *rows[64];
        for (int j = 0; j < run; j++) rows[j] = tile + order[r + j] * cols;
        uint8_t *o = out + dest[order[r]];
        if (run == 64) {
            uint8_t lines[16 * 64] __attribute__((aligned(16)));
            const int stream = ((uintptr_t)o % 16 == 0) && (ld % 16 == 0);
            for (int64_t k = 0; k < whole; k += 16) {
                for (int q = 0; q < 4; q++) transpose16(rows + 16 * q, k, lines + 16 * q, 64);
                for (int x = 0; x < 16; x++) {
                    uint8_t *line = o + (k + x) * ld;
                    for (int q = 0; q < 4; q++) {
                        __m128i v = _mm_load_si128((const __m128i *)(lines + x * 64 + 16 * q));
                        if (stream)
                            _mm_stream_si128((__m128i *)(line + 16 * q), v);
                        else
                            _mm_storeu_si128((__m128i *)(line + 16 * q), v);
                    }
                }
            }
        } else {
            for (int64_t k = 0; k < whole; k += 16) transpose16(rows, k, o + k * ld, ld);
        }
        for (int64_t k = whole; k < cols; k++)
            for (int j = 0; j < run; j++) o[k * ld + j] = rows[j][k];
        r += run;
    }
    _mm_sfence();
#endif
    for (int64_t k = 0; k < cols && r < n; k++) {
        uint8_t *o = out + k * ld;
        for (int64_t j = r; j < n; j++) o[dest[order[j]]] = tile[order[j] * cols + k];
    }
}

#if defined(__SSE2__) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <tmmintrin.h>
#define NXG_SSSE3 1

/* The largest magnitude code (0..7) of one block of 16 packed bytes. */
static inline int block_top_code(const uint8_t *blk) {
    const __m128i seven = _mm_set1_epi8(7);
    __m128i b = _mm_loadu_si128((const __m128i *)blk);
    __m128i m = _mm_max_epu8(_mm_and_si128(b, seven), _mm_and_si128(_mm_srli_epi16(b, 4), seven));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
    m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
    return _mm_cvtsi128_si32(m) & 0xFF;
}

/* One block: 16 packed bytes → 32 E4M3 bytes, each nibble through its 16-entry table (the low
 * nibble's, the even element, first). */
__attribute__((target("ssse3"))) static inline void encode_block_ssse3(const uint8_t *blk, const uint8_t *low_table,
                                                                       const uint8_t *high_table, uint8_t *o) {
    const __m128i nibble = _mm_set1_epi8(0x0F);
    __m128i b = _mm_loadu_si128((const __m128i *)blk);
    __m128i low = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)low_table), _mm_and_si128(b, nibble));
    __m128i high = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)high_table),
                                    _mm_and_si128(_mm_srli_epi16(b, 4), nibble));
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi8(low, high));
    _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi8(low, high));
}
#endif

/* One MXFP4 expert: blocks [rows, groups, 16], scales [rows, groups] (every byte at most 252,
 * checked by the caller) → t_out[rows], the channel exponents, and the E4M3 bytes into
 * out[k * ld + dest[r]]; counts[0] += inexact, counts[1] += flushed, *max_rel = the worst.
 * byte_table: int16 [(offset_max - offset_min + 1) * 256]; stat_codes / stat_rel: per (d, byte)
 * for d in [stat_dmin, stat_dmax], (inexact | flushed << 2) and the worst relative error of the
 * byte's rounded values; code_exp[8]: the exponent of each magnitude code (code 0: none). */
int64_t nxg_mxfp4_expert(const uint8_t *blocks, const uint8_t *scales, int64_t rows, int64_t groups,
                         const int16_t *byte_table, int32_t offset_min, int32_t offset_max,
                         int32_t exact_min, int32_t exact_max, const uint8_t *stat_codes, const double *stat_rel,
                         int32_t stat_dmin, int32_t stat_dmax, const int32_t *code_exp, int32_t top_exponent,
                         int32_t t_min, int32_t t_max, uint8_t *out, int64_t ld, const int64_t *dest,
                         int32_t *t_out, int64_t *counts, double *max_rel) {
    static const int no_value = -(1 << 12);
    uint8_t top_mag[256];
    for (int b = 0; b < 256; b++) {
        int lo = b & 7, hi = (b >> 4) & 7;
        top_mag[b] = (uint8_t)(lo > hi ? lo : hi);
    }
    const int64_t cols = groups * 32;
    int64_t inexact = 0, flushed = 0;
    double worst = *max_rel;
#ifdef NXG_SSSE3
    /* the byte table split by nibble, per offset: [d][low nibble c] = the even element's byte of
     * packed byte c, [d][16 + high nibble c] = the odd element's byte of packed byte c << 4 */
    uint8_t nibbles[64 * 32];
    const int ssse3 = offset_max - offset_min < 64 && __builtin_cpu_supports("ssse3");
    if (ssse3)
        for (int32_t dd = 0; dd <= offset_max - offset_min; dd++)
            for (int c = 0; c < 16; c++) {
                const uint8_t *low = (const uint8_t *)(byte_table + dd * 256 + c);
                const uint8_t *high = (const uint8_t *)(byte_table + dd * 256 + (c << 4));
                nibbles[dd * 32 + c] = low[0];
                nibbles[dd * 32 + 16 + c] = high[1];
            }
#endif
    /* one tile buffer per thread, kept for the next call (the lanes call from their own threads) */
    static __thread uint8_t *buffer = NULL;
    static __thread int64_t buffer_size = 0;
    if (buffer_size < TILE_ROWS * cols) {
        if (buffer) free(buffer);
        buffer = (uint8_t *)malloc((size_t)(TILE_ROWS * cols));
        if (!buffer) { buffer_size = 0; return -1; }
        buffer_size = TILE_ROWS * cols;
    }
    for (int64_t start = 0; start < rows; start += TILE_ROWS) {
        int64_t n = rows - start < TILE_ROWS ? rows - start : TILE_ROWS;
        for (int64_t r = 0; r < n; r++) {
            const uint8_t *row_blocks = blocks + (start + r) * groups * 16;
            const uint8_t *row_scales = scales + (start + r) * groups;
            int32_t largest = no_value;
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t *blk = row_blocks + g * 16;
#ifdef NXG_SSSE3
                int top = block_top_code(blk);
                (void)top_mag;
#else
                uint8_t top = 0;
                for (int j = 0; j < 16; j++) top = top_mag[blk[j]] > top ? top_mag[blk[j]] : top;
#endif
                if (top) {
                    int32_t e = (int32_t)row_scales[g] - 127 + code_exp[top];
                    if (e > largest) largest = e;
                }
            }
            int32_t t = largest > no_value ? largest - top_exponent : 0;
            t = t < t_min ? t_min : (t > t_max ? t_max : t);
            t_out[start + r] = t;
            int16_t *pairs = (int16_t *)(buffer + r * cols);
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t *blk = row_blocks + g * 16;
                int32_t d = (int32_t)row_scales[g] - 127 - t;
                int32_t dc = d < offset_min ? offset_min : (d > offset_max ? offset_max : d);
                const int16_t *table = byte_table + (int64_t)(dc - offset_min) * 256;
                int16_t *o = pairs + g * 16;
#ifdef NXG_SSSE3
                if (ssse3)
                    encode_block_ssse3(blk, nibbles + (dc - offset_min) * 32, nibbles + (dc - offset_min) * 32 + 16,
                                       (uint8_t *)o);
                else
#endif
                    for (int j = 0; j < 16; j++) o[j] = table[blk[j]];
                if (d < exact_min || d > exact_max) {
                    int32_t ds = d < stat_dmin ? stat_dmin : (d > stat_dmax ? stat_dmax : d);
                    const uint8_t *sc = stat_codes + (int64_t)(ds - stat_dmin) * 256;
                    const double *sr = stat_rel + (int64_t)(ds - stat_dmin) * 256;
                    for (int j = 0; j < 16; j++) {
                        uint8_t c = sc[blk[j]];
                        if (c) {
                            inexact += c & 3;
                            flushed += c >> 2;
                            if (sr[blk[j]] > worst) worst = sr[blk[j]];
                        }
                    }
                }
            }
        }
        place_rows(buffer, n, cols, out, ld, dest + start);
    }
    counts[0] += inexact;
    counts[1] += flushed;
    *max_rel = worst;
    return 0;
}

/* ---------------------------------------------------------------- compressed-tensors */

/* OCP E4M3 rows q [rows, cols] → within ±240: a row whose largest magnitude byte is above
 * neuron_max is halved byte by byte (integer ops: vectorized); its largest magnitude byte into row_max;
 * hist[m] += the bytes of odd magnitude m < 16 in halved rows (the ones halving rounds). */
void nxg_ct_rows(const uint8_t *q, int64_t rows, int64_t cols, int32_t neuron_max,
                 uint8_t *out, int64_t ld, const int64_t *dest, uint8_t *row_max, int64_t *hist) {
    static __thread uint8_t *buffer = NULL;
    static __thread int64_t buffer_size = 0;
    if (buffer_size < TILE_ROWS * cols) {
        if (buffer) free(buffer);
        buffer = (uint8_t *)malloc((size_t)(TILE_ROWS * cols));
        buffer_size = buffer ? TILE_ROWS * cols : 0;
        if (!buffer) return;
    }
    for (int64_t start = 0; start < rows; start += TILE_ROWS) {
        int64_t n = rows - start < TILE_ROWS ? rows - start : TILE_ROWS;
        int all_kept = 1;
        for (int64_t r = 0; r < n; r++) {
            const uint8_t *row = q + (start + r) * cols;
            uint8_t m = 0;
            for (int64_t k = 0; k < cols; k++) {
                uint8_t v = row[k] & 0x7F;
                m = v > m ? v : m;
            }
            row_max[start + r] = m;
            if (m > neuron_max) all_kept = 0;
        }
        const uint8_t *tile = q + start * cols;
        if (!all_kept) {
            for (int64_t r = 0; r < n; r++) {
                const uint8_t *row = q + (start + r) * cols;
                uint8_t *b = buffer + r * cols;
                if (row_max[start + r] > neuron_max) {
                    uint8_t rounded = 0;  /* any odd magnitude below 16: halving rounds it */
                    for (int64_t k = 0; k < cols; k++) {
                        /* from exponent field 2 up the field minus one; below, m/2 to nearest even */
                        uint8_t v = row[k], m = v & 0x7F;
                        uint8_t low = (uint8_t)((v & 0x80) | ((m >> 1) + (m & (m >> 1) & 1)));
                        b[k] = m >= 16 ? (uint8_t)(v - 8) : low;
                    }
                    for (int64_t k = 0; k < cols; k++) rounded |= (uint8_t)((row[k] & 0x71) == 0x01);
                    if (rounded)
                        for (int64_t k = 0; k < cols; k++)
                            if ((row[k] & 0x71) == 0x01) hist[row[k] & 0x0F]++;
                } else {
                    memcpy(b, row, (size_t)cols);
                }
            }
            tile = buffer;
        }
        place_rows(tile, n, cols, out, ld, dest + start);
    }
}

/* ---------------------------------------------------------------- BF16 */

/* Each column's largest magnitude of BF16 w [rows, cols], as bits (0x7F80 and up: inf or NaN). */
void nxg_bf16_amax(const uint16_t *w, int64_t rows, int64_t cols, uint16_t *amax) {
    memset(amax, 0, (size_t)cols * sizeof(uint16_t));
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = w + r * cols;
        for (int64_t c = 0; c < cols; c++) {
            uint16_t v = row[c] & 0x7FFF;
            amax[c] = v > amax[c] ? v : amax[c];
        }
    }
}

static inline float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* BF16 w [rows, cols] (input dim first) / scale[cols], clamped to ±fp8_max, rounded to E4M3
 * through e4m3_of[2^17] (keyed by a float32's top 16 bits and whether its low 16 are non-zero),
 * into out [rows', ld]: column c at dest_col[c]. Statistics of the round trip q × scale against
 * w: counts[0] += non-zero round trips, counts[1] += inexact, counts[2] += non-zero sources;
 * the relative error |q × scale − w| / |w| of every value kept non-zero: its worst into
 * *max_rel, its sum into *rel_sum (a flushed value's, 1 by definition, is left out). */
void nxg_bf16_encode(const uint16_t *w, int64_t rows, int64_t cols, const float *scale, float fp8_max,
                     const uint8_t *e4m3_of, const float *e4m3_value, uint8_t *out, int64_t ld,
                     const int64_t *dest_col, int64_t *counts, float *max_rel, double *rel_sum) {
    float x[SEGMENT];
    uint8_t qb[SEGMENT];
    int64_t nonzero_q = 0, inexact = 0, nonzero = 0;
    float worst = *max_rel;
    double sum = *rel_sum;
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *row = w + r * cols;
        uint8_t *o = out + r * ld;
        for (int64_t c0 = 0; c0 < cols; c0 += SEGMENT) {
            int64_t n = cols - c0 < SEGMENT ? cols - c0 : SEGMENT;
            for (int64_t c = 0; c < n; c++) {
                float v = bits_to_float((uint32_t)row[c0 + c] << 16) / scale[c0 + c];
                v = v < -fp8_max ? -fp8_max : (v > fp8_max ? fp8_max : v);
                x[c] = v;
            }
            for (int64_t c = 0; c < n; c++) {
                uint32_t u = float_to_bits(x[c]);
                qb[c] = e4m3_of[(u >> 16) | ((uint32_t)((u & 0xFFFF) != 0) << 16)];
            }
            for (int64_t c = 0; c < n; c++) {
                float wv = bits_to_float((uint32_t)row[c0 + c] << 16);
                float back = e4m3_value[qb[c]] * scale[c0 + c];
                float diff = fabsf(back - wv);
                float aw = fabsf(wv);
                nonzero_q += back != 0.0f;
                nonzero += aw != 0.0f;
                inexact += diff != 0.0f;
                if (back != 0.0f) {
                    float rel = diff / aw;
                    worst = rel > worst ? rel : worst;
                    sum += (double)rel;
                }
                o[dest_col[c0 + c]] = qb[c];
            }
        }
    }
    counts[0] += nonzero_q;
    counts[1] += inexact;
    counts[2] += nonzero;
    *max_rel = worst;
    *rel_sum = sum;
}
