#include "common/json.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/arena.h"
#include "common/utf8.h"

void kvp__json_parser_init(kvp__json_parser_t *p)
{
    memset(p, 0, sizeof *p);
    kvp__arena_init(&p->arena);
    p->max_depth = 128;
}

void kvp__json_parser_cleanup(kvp__json_parser_t *p)
{
    kvp__arena_cleanup(&p->arena);
    if (p->stack)
        kvp__free(p->stack, p->stack_cap * sizeof *p->stack);
    if (p->sbuf)
        kvp__free(p->sbuf, p->sbuf_cap);
    memset(p, 0, sizeof *p);
}

static void *arena_alloc(kvp__json_parser_t *p, size_t n) { return kvp__arena_alloc(&p->arena, n); }

typedef struct {
    kvp__json_parser_t *p;
    const char *s, *end;
    int oom;
} cur_t;

/* The high bit of each of the eight bytes of x that a JSON string cannot
 * carry as it is: >= 0x80, < 0x20, '"', '\\' or DEL.  A borrow can mark a
 * byte above (at a higher address than) one of those, never below, so the
 * lowest mark is exact. */
static inline uint64_t special_bytes(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t q = x ^ (ones * '"'), bs = x ^ (ones * '\\'), del = x ^ (ones * 0x7f);
    return (x | ((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((bs - ones) & ~bs) | ((del - ones) & ~del)) & highs;
}

/* Where the first special byte of s[i..n) is, given its word's marks m. */
static inline size_t first_special(const char *s, size_t i, size_t n, uint64_t m)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    (void)s;
    (void)n;
    return i + (size_t)__builtin_ctzll(m) / 8; /* the lowest address is the lowest byte */
#else
    (void)m;
    while (i < n && (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f && s[i] != '"' && s[i] != '\\')
        i++;
    return i;
#endif
}

/* The length of the run at the start of s[0..n) of bytes a JSON string
 * carries as they are: printable ASCII (0x20..0x7e) but '"' and '\\'.  The
 * reader and the writer both scan strings with it, eight bytes a step (a
 * tail shorter than that padded with plain bytes). */
static size_t plain_run(const char *s, size_t n)
{
    size_t i = 0;
    uint64_t x, m;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, s + i, 8);
        if ((m = special_bytes(x)))
            return first_special(s, i, n, m);
    }
    if (i == n)
        return n;
    x = 0x6161616161616161u; /* "aaaaaaaa" */
    memcpy(&x, s + i, n - i);
    return (m = special_bytes(x)) ? first_special(s, i, n, m) : n;
}

static inline void skip_ws(cur_t *c)
{
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r'))
        c->s++;
}

static int push(cur_t *c, const kvp__json_t *v)
{
    kvp__json_parser_t *p = c->p;
    if (p->nstack == p->stack_cap) {
        size_t nc = p->stack_cap ? p->stack_cap * 2 : 256;
        void *np = kvp__realloc(p->stack, p->stack_cap * sizeof *p->stack, nc * sizeof *p->stack);
        if (!np) {
            c->oom = 1;
            return -1;
        }
        p->stack = np;
        p->stack_cap = nc;
    }
    p->stack[p->nstack++] = *v;
    return 0;
}

static int sbuf_reserve(cur_t *c, size_t need)
{
    kvp__json_parser_t *p = c->p;
    if (need <= p->sbuf_cap)
        return 0;
    size_t nc = p->sbuf_cap ? p->sbuf_cap : 256;
    while (nc < need)
        nc *= 2;
    char *nb = kvp__realloc(p->sbuf, p->sbuf_cap, nc);
    if (!nb) {
        c->oom = 1;
        return -1;
    }
    p->sbuf = nb;
    p->sbuf_cap = nc;
    return 0;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static int read_hex4(cur_t *c, unsigned *v)
{
    if (c->end - c->s < 4)
        return -1;
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(c->s[i]);
        if (h < 0)
            return -1;
        x = x * 16 + (unsigned)h;
    }
    c->s += 4;
    *v = x;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* At the opening quote.  Result in arena, NUL-terminated. */
static int parse_string(cur_t *c, const char **out, size_t *out_len)
{
    c->s++;
    const char *start = c->s;
    /* fast path: no escapes; a run of plain ASCII needs no UTF-8 check */
    const char *q = start + plain_run(start, (size_t)(c->end - start));
    bool ascii = true;
    if (q < c->end && (unsigned char)*q >= 0x7f) { /* text beyond ASCII: find its end, then check it */
        ascii = false;
        while (q < c->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
            q++;
    }
    if (q < c->end && *q == '"' && (ascii || kvp__utf8_valid(start, (size_t)(q - start)))) {
        size_t n = (size_t)(q - start);
        char *d = arena_alloc(c->p, n + 1);
        if (!d) {
            c->oom = 1;
            return -1;
        }
        memcpy(d, start, n);
        d[n] = 0;
        c->s = q + 1;
        *out = d;
        *out_len = n;
        return 0;
    }
    size_t o = 0;
    for (;;) {
        if (c->s >= c->end)
            return -1;
        unsigned char ch = (unsigned char)*c->s;
        if (sbuf_reserve(c, o + 8))
            return -1;
        if (ch == '"') {
            c->s++;
            break;
        }
        if (ch < 0x20)
            return -1; /* strict: control characters are not allowed */
        if (ch != '\\') {
            size_t l = kvp__utf8_seq_len(c->s, (size_t)(c->end - c->s));
            if (!l)
                return -1; /* strict: well-formed UTF-8 only */
            memcpy(c->p->sbuf + o, c->s, l);
            o += l;
            c->s += l;
            continue;
        }
        c->s++;
        if (c->s >= c->end)
            return -1;
        char e = *c->s++;
        unsigned cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (read_hex4(c, &cp))
                return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF && c->end - c->s >= 6 && c->s[0] == '\\' &&
                c->s[1] == 'u') {
                const char *save = c->s;
                unsigned lo;
                c->s += 2;
                if (read_hex4(c, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    c->s = save;
            }
            break;
        default: return -1;
        }
        o += put_utf8(c->p->sbuf + o, cp);
    }
    char *d = arena_alloc(c->p, o + 1);
    if (!d) {
        c->oom = 1;
        return -1;
    }
    memcpy(d, c->p->sbuf, o);
    d[o] = 0;
    *out = d;
    *out_len = o;
    return 0;
}

static int match_lit(cur_t *c, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(c->end - c->s) < n || memcmp(c->s, lit, n) != 0)
        return 0;
    c->s += n;
    return 1;
}

static int parse_number(cur_t *c, kvp__json_t *v)
{
    const char *s = c->s;
    bool neg = false;
    if (s < c->end && *s == '-') {
        neg = true;
        s++;
        if (c->end - s >= 8 && memcmp(s, "Infinity", 8) == 0) {
            c->s = s + 8;
            v->type = KVP__JSON_FLOAT;
            return 0;
        }
    }
    if (s >= c->end || *s < '0' || *s > '9')
        return -1;
    const char *ds = s;
    if (*s == '0')
        s++;
    else
        while (s < c->end && *s >= '0' && *s <= '9')
            s++;
    const char *de = s;
    bool is_float = false;
    if (s < c->end && *s == '.' && s + 1 < c->end && s[1] >= '0' && s[1] <= '9') {
        is_float = true;
        s++;
        while (s < c->end && *s >= '0' && *s <= '9')
            s++;
    }
    if (s < c->end && (*s == 'e' || *s == 'E')) {
        const char *t = s + 1;
        if (t < c->end && (*t == '+' || *t == '-'))
            t++;
        if (t < c->end && *t >= '0' && *t <= '9') {
            is_float = true;
            while (t < c->end && *t >= '0' && *t <= '9')
                t++;
            s = t;
        }
    }
    c->s = s;
    if (is_float) {
        v->type = KVP__JSON_FLOAT;
        return 0;
    }
    /* integer: accumulate as negative to reach INT64_MIN */
    int64_t acc = 0;
    for (const char *d = ds; d < de; d++) {
        int dig = *d - '0';
        if (acc < (INT64_MIN + dig) / 10) {
            v->type = KVP__JSON_BIGINT;
            return 0;
        }
        acc = acc * 10 - dig;
    }
    if (!neg) {
        if (acc == INT64_MIN) {
            v->type = KVP__JSON_BIGINT;
            return 0;
        }
        acc = -acc;
    }
    v->type = KVP__JSON_INT;
    v->u.i = acc;
    return 0;
}

static int parse_value(cur_t *c, kvp__json_t *v, unsigned depth);

/* depth: how many containers hold this one. */
static int parse_container(cur_t *c, kvp__json_t *v, bool obj, unsigned depth)
{
    c->s++;
    size_t base = c->p->nstack;
    skip_ws(c);
    char close = obj ? '}' : ']';
    if (c->s < c->end && *c->s == close) {
        c->s++;
    } else {
        for (;;) {
            kvp__json_t item;
            memset(&item, 0, sizeof item);
            if (obj) {
                skip_ws(c);
                if (c->s >= c->end || *c->s != '"')
                    return -1;
                const char *k;
                size_t kl;
                if (parse_string(c, &k, &kl) || kl > UINT32_MAX)
                    return -1;
                skip_ws(c);
                if (c->s >= c->end || *c->s != ':')
                    return -1;
                c->s++;
                if (parse_value(c, &item, depth + 1))
                    return -1;
                item.key = k;
                item.key_len = (uint32_t)kl;
            } else if (parse_value(c, &item, depth + 1)) {
                return -1;
            }
            if (push(c, &item))
                return -1;
            skip_ws(c);
            if (c->s >= c->end)
                return -1;
            if (*c->s == ',') {
                c->s++;
                continue;
            }
            if (*c->s == close) {
                c->s++;
                break;
            }
            return -1;
        }
    }
    size_t n = c->p->nstack - base;
    v->type = obj ? KVP__JSON_OBJECT : KVP__JSON_ARRAY;
    v->n = n;
    v->u.items = NULL;
    if (n) {
        v->u.items = arena_alloc(c->p, n * sizeof(kvp__json_t));
        if (!v->u.items) {
            c->oom = 1;
            return -1;
        }
        memcpy(v->u.items, c->p->stack + base, n * sizeof(kvp__json_t));
    }
    c->p->nstack = base;
    return 0;
}

static int parse_value(cur_t *c, kvp__json_t *v, unsigned depth)
{
    if (depth > c->p->max_depth)
        return -1;
    skip_ws(c);
    if (c->s >= c->end)
        return -1;
    switch (*c->s) {
    case '{': return parse_container(c, v, true, depth);
    case '[': return parse_container(c, v, false, depth);
    case '"': {
        const char *s;
        size_t n;
        if (parse_string(c, &s, &n))
            return -1;
        v->type = KVP__JSON_STRING;
        v->u.s = s;
        v->n = n;
        return 0;
    }
    case 't':
        if (!match_lit(c, "true"))
            return -1;
        v->type = KVP__JSON_TRUE;
        return 0;
    case 'f':
        if (!match_lit(c, "false"))
            return -1;
        v->type = KVP__JSON_FALSE;
        return 0;
    case 'n':
        if (!match_lit(c, "null"))
            return -1;
        v->type = KVP__JSON_NULL;
        return 0;
    case 'N':
        if (!match_lit(c, "NaN"))
            return -1;
        v->type = KVP__JSON_FLOAT;
        return 0;
    case 'I':
        if (!match_lit(c, "Infinity"))
            return -1;
        v->type = KVP__JSON_FLOAT;
        return 0;
    default: return parse_number(c, v);
    }
}

kvp_status_t kvp__json_parse(kvp__json_parser_t *p, const char *text, size_t len,
                             const kvp__json_t **root_p)
{
    kvp__arena_reset(&p->arena);
    p->nstack = 0;
    cur_t c = {p, text, text + len, 0};
    kvp__json_t *root = arena_alloc(p, sizeof *root);
    if (!root)
        return KVP_ERR_NO_MEMORY;
    memset(root, 0, sizeof *root);
    if (parse_value(&c, root, 0))
        return c.oom ? KVP_ERR_NO_MEMORY : KVP_ERR_DECODE;
    skip_ws(&c);
    if (c.s != c.end)
        return KVP_ERR_DECODE;
    *root_p = root;
    return KVP_OK;
}

const kvp__json_t *kvp__json_get(const kvp__json_t *obj, const char *key)
{
    if (!obj || obj->type != KVP__JSON_OBJECT)
        return NULL;
    size_t kl = strlen(key);
    for (size_t i = obj->n; i-- > 0;) {
        const kvp__json_t *m = &obj->u.items[i];
        if (m->key_len == kl && memcmp(m->key, key, kl) == 0)
            return m;
    }
    return NULL;
}

/* ---- writer ---------------------------------------------------------------- */

void kvp__jw_init(kvp__jw_t *b)
{
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

void kvp__jw_cleanup(kvp__jw_t *b)
{
    if (b->p)
        kvp__free(b->p, b->cap);
    kvp__jw_init(b);
}

void kvp__jw_put(kvp__jw_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n)
            ncap *= 2;
        char *np = kvp__realloc(b->p, b->cap, ncap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

void kvp__jw_puts(kvp__jw_t *b, const char *s) { kvp__jw_put(b, s, strlen(s)); }

/* v in decimal, without printf's format parsing (a reply carries several) */
static void put_digits(kvp__jw_t *b, bool minus, uint64_t v)
{
    char tmp[24], *e = tmp + sizeof tmp, *d = e;
    do
        *--d = (char)('0' + v % 10);
    while (v /= 10);
    if (minus)
        *--d = '-';
    kvp__jw_put(b, d, (size_t)(e - d));
}

void kvp__jw_uint(kvp__jw_t *b, uint64_t v) { put_digits(b, false, v); }

void kvp__jw_int(kvp__jw_t *b, int64_t v) { put_digits(b, v < 0, v < 0 ? 0u - (uint64_t)v : (uint64_t)v); }

void kvp__jw_bool(kvp__jw_t *b, bool v) { kvp__jw_puts(b, v ? "true" : "false"); }

static void put_u4(kvp__jw_t *b, unsigned v)
{
    static const char hx[] = "0123456789abcdef";
    char t[6] = {'\\', 'u', hx[(v >> 12) & 15], hx[(v >> 8) & 15], hx[(v >> 4) & 15], hx[v & 15]};
    kvp__jw_put(b, t, 6);
}

void kvp__jw_str(kvp__jw_t *b, const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str, *end = s + n;
    kvp__jw_put(b, "\"", 1);
    while (s < end) {
        const unsigned char *q = s + plain_run((const char *)s, (size_t)(end - s)); /* goes as it is */
        kvp__jw_put(b, (const char *)s, (size_t)(q - s));
        if ((s = q) == end)
            break;
        unsigned c = *s++;
        switch (c) {
        case '"': kvp__jw_put(b, "\\\"", 2); continue;
        case '\\': kvp__jw_put(b, "\\\\", 2); continue;
        case '\n': kvp__jw_put(b, "\\n", 2); continue;
        case '\r': kvp__jw_put(b, "\\r", 2); continue;
        case '\t': kvp__jw_put(b, "\\t", 2); continue;
        case '\b': kvp__jw_put(b, "\\b", 2); continue;
        case '\f': kvp__jw_put(b, "\\f", 2); continue;
        default: break;
        }
        /* A (WTF-8) sequence, decoded by its lead byte; a byte that leads
         * none is written as the code point of its value. */
        unsigned cp = c;
        int more = c >= 0xf0 && c < 0xf8 ? 3 : c >= 0xe0 && c < 0xf0 ? 2 : c >= 0xc0 && c < 0xe0 ? 1 : 0;
        if (more)
            cp = c & (0x3fu >> more);
        for (int i = 0; i < more && s < end && (*s & 0xc0) == 0x80; i++)
            cp = (cp << 6) | (*s++ & 0x3f);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            put_u4(b, 0xd800 + (cp >> 10));
            put_u4(b, 0xdc00 + (cp & 0x3ff));
        } else {
            put_u4(b, cp);
        }
    }
    kvp__jw_put(b, "\"", 1);
}
