/* float_repr.c: Python's repr() of a double (the shortest digits that read back as the
 * same double) without bignum arithmetic, after Ulf Adams' Ryu (PLDI 2018). */
#include "float_repr.h"

#include <string.h>

#include "float_repr_table.h"

/* Number of bits of 5^e (e >= 1; 1 for e = 0), floor(e * log10(2)), floor(e * log10(5)):
 * exact over the exponent ranges of a double. */
static int pow5_bits(int e) { return (int)(((uint32_t)e * 1217359u) >> 19) + 1; }
static uint32_t log10_pow2(int e) { return ((uint32_t)e * 78913u) >> 18; }
static uint32_t log10_pow5(int e) { return ((uint32_t)e * 732923u) >> 20; }

static int pow5_factor(uint64_t v)
{
    int n = 0;
    while (v % 5 == 0) {
        v /= 5;
        n++;
    }
    return n;
}

static int multiple_of_pow5(uint64_t v, uint32_t p) { return pow5_factor(v) >= (int)p; }
static int multiple_of_pow2(uint64_t v, uint32_t p) { return (v & ((1ull << p) - 1)) == 0; }

/* (m * mul) >> j for a 125-bit mul (low, high halves) and 64 <= j < 192. */
static uint64_t mul_shift(uint64_t m, const uint64_t *mul, int j)
{
    unsigned __int128 low = (unsigned __int128)m * mul[0];
    unsigned __int128 high = (unsigned __int128)m * mul[1];
    return (uint64_t)(((low >> 64) + high) >> (j - 64));
}

/* Divides the value and its bounds by 10; returns the digit the value lost. */
static int drop_digit(uint64_t *vr, uint64_t *vp, uint64_t *vm)
{
    int digit = (int)(*vr % 10);
    *vr /= 10;
    *vp /= 10;
    *vm /= 10;
    return digit;
}

/* The shortest decimal d * 10^e that rounds to the double with binary mantissa m2 and
 * exponent e2 (value m2 * 2^e2, m2 with its implicit bit), correctly rounded among the
 * shortest. */
static void shortest(uint64_t m2, int e2, int mm_shift, uint64_t *digits, int *exponent)
{
    int accept_bounds = (m2 & 1) == 0; /* an even mantissa owns the halfway points */
    e2 -= 2;                           /* the bounds are quarter units apart */
    uint64_t mv = 4 * m2;
    uint64_t vr, vp, vm;
    int e10;
    int vm_trailing_zeros = 0, vr_trailing_zeros = 0;
    if (e2 >= 0) {
        uint32_t q = log10_pow2(e2) - (e2 > 3);
        e10 = (int)q;
        int k = FI_POW5_BITS + pow5_bits((int)q) - 1;
        int i = -e2 + (int)q + k;
        vr = mul_shift(mv, fi_pow5_inv[q], i);
        vp = mul_shift(mv + 2, fi_pow5_inv[q], i);
        vm = mul_shift(mv - 1 - (uint64_t)mm_shift, fi_pow5_inv[q], i);
        if (q <= 21) { /* only then can one of them be a multiple of 10^q */
            if (mv % 5 == 0)
                vr_trailing_zeros = multiple_of_pow5(mv, q);
            else if (accept_bounds)
                vm_trailing_zeros = multiple_of_pow5(mv - 1 - (uint64_t)mm_shift, q);
            else
                vp -= (uint64_t)multiple_of_pow5(mv + 2, q);
        }
    } else {
        uint32_t q = log10_pow5(-e2) - (-e2 > 1);
        e10 = (int)q + e2;
        int i = -e2 - (int)q;
        int k = pow5_bits(i) - FI_POW5_BITS;
        int j = (int)q - k;
        vr = mul_shift(mv, fi_pow5[i], j);
        vp = mul_shift(mv + 2, fi_pow5[i], j);
        vm = mul_shift(mv - 1 - (uint64_t)mm_shift, fi_pow5[i], j);
        if (q <= 1) {
            vr_trailing_zeros = 1; /* mv = 4 * m2 has two trailing zero bits */
            if (accept_bounds)
                vm_trailing_zeros = mm_shift == 1;
            else
                vp--;
        } else if (q < 63) {
            vr_trailing_zeros = multiple_of_pow2(mv, q);
        }
    }
    /* Drop digits while the interval (vm, vp) still holds a shorter number. */
    int removed = 0;
    uint64_t out;
    if (vm_trailing_zeros || vr_trailing_zeros) {
        /* rare: a bound or the value itself ends in zeros, so exact ties are possible */
        int last = 0;
        while (vp / 10 > vm / 10) {
            vm_trailing_zeros &= vm % 10 == 0;
            vr_trailing_zeros &= last == 0;
            last = drop_digit(&vr, &vp, &vm);
            removed++;
        }
        while (vm_trailing_zeros && vm % 10 == 0) {
            vr_trailing_zeros &= last == 0;
            last = drop_digit(&vr, &vp, &vm);
            removed++;
        }
        if (vr_trailing_zeros && last == 5 && vr % 2 == 0)
            last = 4; /* exactly halfway: round to even */
        out = vr + ((vr == vm && (!accept_bounds || !vm_trailing_zeros)) || last >= 5);
    } else {
        int round_up = 0;
        while (vp / 10 > vm / 10) {
            round_up = drop_digit(&vr, &vp, &vm) >= 5;
            removed++;
        }
        out = vr + (vr == vm || round_up);
    }
    *digits = out;
    *exponent = e10 + removed;
}

size_t fi_float_repr(double v, char *buf)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    int negative = (int)(bits >> 63);
    uint64_t mantissa = bits & ((1ull << 52) - 1);
    int biased = (int)((bits >> 52) & 0x7ff);
    char *p = buf;
    if (biased == 0x7ff) {
        const char *s = mantissa ? "nan" : negative ? "-inf" : "inf";
        size_t n = strlen(s);
        memcpy(buf, s, n + 1);
        return n;
    }
    if (negative)
        *p++ = '-';
    if (biased == 0 && mantissa == 0) {
        memcpy(p, "0.0", 4);
        return (size_t)(p - buf) + 3;
    }
    uint64_t m2 = biased ? mantissa | (1ull << 52) : mantissa;
    int e2 = (biased ? biased : 1) - 1075;
    uint64_t digits;
    int exponent;
    shortest(m2, e2, mantissa != 0 || biased <= 1, &digits, &exponent);

    char d[20];
    int n = 0;
    for (uint64_t x = digits; x; x /= 10)
        d[n++] = (char)('0' + x % 10); /* reversed */
    /* Python's rule (float_repr_style 'short'): value = 0.d1d2... * 10^point, written in
     * scientific notation when point < -3 or point > 16. */
    int point = exponent + n;
    if (point < -3 || point > 16) {
        *p++ = d[n - 1];
        if (n > 1) {
            *p++ = '.';
            for (int i = n - 2; i >= 0; i--)
                *p++ = d[i];
        }
        int e = point - 1;
        *p++ = 'e';
        *p++ = e < 0 ? '-' : '+';
        if (e < 0)
            e = -e;
        if (e >= 100)
            *p++ = (char)('0' + e / 100);
        *p++ = (char)('0' + e / 10 % 10);
        *p++ = (char)('0' + e % 10);
    } else if (point <= 0) {
        *p++ = '0';
        *p++ = '.';
        for (int i = 0; i < -point; i++)
            *p++ = '0';
        for (int i = n - 1; i >= 0; i--)
            *p++ = d[i];
    } else {
        for (int i = 0; i < point; i++)
            *p++ = i < n ? d[n - 1 - i] : '0';
        *p++ = '.';
        if (point >= n)
            *p++ = '0';
        for (int i = point; i < n; i++)
            *p++ = d[n - 1 - i];
    }
    *p = '\0';
    return (size_t)(p - buf);
}
