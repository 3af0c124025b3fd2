/* Unit tests of src/common/json.c: the strict reader and the canonical writer. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "test.h"

static kvp__json_parser_t g_p;

static const kvp__json_t *parse(const char *s)
{
    const kvp__json_t *root = NULL;
    return kvp__json_parse(&g_p, s, strlen(s), &root) == KVP_OK ? root : NULL;
}

static int type_of(const char *s)
{
    const kvp__json_t *v = parse(s);
    return v ? (int)v->type : -1;
}

TEST(test_json_numbers_are_classified_as_python_does)
{
    kvp__json_parser_init(&g_p);
    ASSERT_EQ(type_of("1"), KVP__JSON_INT);
    ASSERT_EQ(type_of(" -0 "), KVP__JSON_INT);
    ASSERT_EQ(parse("-9223372036854775808")->u.i, INT64_MIN);
    ASSERT_EQ(parse("9223372036854775807")->u.i, INT64_MAX);
    ASSERT_EQ(type_of("9223372036854775808"), KVP__JSON_BIGINT);
    ASSERT_EQ(type_of("-9223372036854775809"), KVP__JSON_BIGINT);
    ASSERT_EQ(type_of("1.0"), KVP__JSON_FLOAT);
    ASSERT_EQ(type_of("1e5"), KVP__JSON_FLOAT);
    ASSERT_EQ(type_of("-2.5E-3"), KVP__JSON_FLOAT);
    ASSERT_EQ(type_of("NaN"), KVP__JSON_FLOAT);
    ASSERT_EQ(type_of("-Infinity"), KVP__JSON_FLOAT);
    ASSERT_EQ(type_of("true"), KVP__JSON_TRUE); /* never an int */
    ASSERT_EQ(type_of("null"), KVP__JSON_NULL);
    const char *bad[] = {"01", "1.", "-", "+1", ".5", "1e", "[1,]", "{\"a\":1,}", "{a:1}", "'x'", "tru", "", "1 2",
                         "[1", "{\"a\"}", "nan", "infinity"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ASSERT_MSG(parse(bad[i]) == NULL, "accepted %s", bad[i]);
    kvp__json_parser_cleanup(&g_p);
}

TEST(test_json_strings_are_strict_utf8_and_decoded)
{
    kvp__json_parser_init(&g_p);
    const kvp__json_t *v = parse("\"a\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"");
    ASSERT(v && v->type == KVP__JSON_STRING);
    ASSERT_EQ(v->n, 15);
    ASSERT_MEM_EQ(v->u.s, "a\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80", 16);
    v = parse("\"\\ud800x\""); /* a lone surrogate: its 3-byte (WTF-8) form */
    ASSERT(v && v->n == 4);
    ASSERT_MEM_EQ(v->u.s, "\xed\xa0\x80x", 4);
    v = parse("\"nul\\u0000in\"");
    ASSERT(v && v->n == 6 && v->u.s[3] == 0);
    ASSERT(parse("\"caf\xc3\xa9 \x7f\"") != NULL);   /* raw UTF-8 and DEL are fine */
    ASSERT(parse("\"caf\xc3\"") == NULL);            /* truncated sequence */
    ASSERT(parse("\"\xed\xa0\x80\"") == NULL);       /* a raw surrogate */
    ASSERT(parse("\"a\\u00e9\xff\"") == NULL);       /* bad byte after an escape */
    ASSERT(parse("\"tab\there\"") == NULL);          /* raw control character */
    ASSERT(parse("\"\\x41\"") == NULL);
    ASSERT(parse("\"\\u12\"") == NULL);
    kvp__json_parser_cleanup(&g_p);
}

TEST(test_json_objects_keep_members_and_get_finds_the_last)
{
    kvp__json_parser_init(&g_p);
    const kvp__json_t *v = parse("{\"a\": 1, \"b\": [true, false, null], \"a\": 2}");
    ASSERT(v && v->type == KVP__JSON_OBJECT);
    ASSERT_EQ(v->n, 3);
    ASSERT_EQ(kvp__json_get(v, "a")->u.i, 2);
    const kvp__json_t *b = kvp__json_get(v, "b");
    ASSERT(b && b->type == KVP__JSON_ARRAY && b->n == 3);
    ASSERT_EQ(b->u.items[1].type, KVP__JSON_FALSE);
    ASSERT(kvp__json_get(v, "c") == NULL);
    ASSERT(kvp__json_get(b, "a") == NULL); /* not an object */
    kvp__json_parser_cleanup(&g_p);
}

TEST(test_json_depth_is_bounded)
{
    kvp__json_parser_init(&g_p);
    g_p.max_depth = 2;
    ASSERT(parse("[[1]]") != NULL);
    ASSERT(parse("[[[]]]") != NULL); /* the innermost, empty, is inside 2 */
    ASSERT(parse("[[[1]]]") == NULL);
    ASSERT(parse("{\"a\":{\"b\":{\"c\":1}}}") == NULL);
    g_p.max_depth = 128;
    char deep[600];
    memset(deep, '[', 300);
    memset(deep + 300, ']', 300);
    ASSERT(kvp__json_parse(&g_p, deep, 600, &(const kvp__json_t *){NULL}) == KVP_ERR_DECODE);
    kvp__json_parser_cleanup(&g_p);
}

static void check_str(const char *in, size_t n, const char *want)
{
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_str(&b, in, n);
    ASSERT(!b.oom);
    ASSERT_EQ(b.len, strlen(want));
    ASSERT_MEM_EQ(b.p, want, b.len);
    kvp__jw_cleanup(&b);
}

/* Byte for byte Python's json.dumps(s) (ensure_ascii=True). */
TEST(test_json_writer_escapes_as_python_ensure_ascii)
{
    check_str("plain", 5, "\"plain\"");
    check_str("q\"b\\n\nr\rt\tb\bf\f", 14, "\"q\\\"b\\\\n\\nr\\rt\\tb\\bf\\f\"");
    check_str("\x01\x1f\x7f", 3, "\"\\u0001\\u001f\\u007f\"");
    check_str("\0", 1, "\"\\u0000\"");
    check_str("caf\xc3\xa9 \xe6\xbc\xa2", 9, "\"caf\\u00e9 \\u6f22\"");
    check_str("\xf0\x9f\x98\x80", 4, "\"\\ud83d\\ude00\"");
    check_str("\xed\xa0\x80", 3, "\"\\ud800\""); /* WTF-8 lone surrogate */
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_int(&b, INT64_MIN);
    kvp__jw_put(&b, ",", 1);
    kvp__jw_bool(&b, true);
    kvp__jw_puts(&b, ",");
    kvp__jw_bool(&b, false);
    ASSERT_EQ(b.len, strlen("-9223372036854775808,true,false"));
    ASSERT_MEM_EQ(b.p, "-9223372036854775808,true,false", b.len);
    kvp__jw_cleanup(&b);
}

TEST(test_json_written_strings_read_back_the_same)
{
    kvp__json_parser_init(&g_p);
    uint32_t x = 12345;
    for (int round = 0; round < 2000; round++) {
        char s[16];
        size_t n = 0;
        while (n < sizeof s - 4) {
            x = x * 1103515245u + 12345u;
            unsigned pick = (x >> 16) % 6;
            static const char *atoms[] = {"a", "\"", "\\", "\x01", "\xc3\xa9", "\xf0\x9f\x98\x80"};
            size_t l = strlen(atoms[pick]);
            if (n + l > sizeof s)
                break;
            memcpy(s + n, atoms[pick], l);
            n += l;
            if ((x >> 8) % 5 == 0)
                break;
        }
        kvp__jw_t b;
        kvp__jw_init(&b);
        kvp__jw_str(&b, s, n);
        const kvp__json_t *v;
        ASSERT_OK(kvp__json_parse(&g_p, b.p, b.len, &v));
        ASSERT_EQ(v->type, KVP__JSON_STRING);
        ASSERT_EQ(v->n, n);
        ASSERT_MEM_EQ(v->u.s, s, n);
        kvp__jw_cleanup(&b);
    }
    kvp__json_parser_cleanup(&g_p);
}

/* Integers as printf writes them, both signs and both ends. */
static void written_is(kvp__jw_t *b, const char *want)
{
    ASSERT_MSG(b->len == strlen(want) && memcmp(b->p, want, b->len) == 0, "%s: %.*s", want, (int)b->len, b->p);
    b->len = 0;
}

TEST(test_json_writer_integers_as_printf_writes_them)
{
    static const int64_t ints[] = {0, 1, -1, 9, 10, -10, 99, 100, 12345678901234, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    static const uint64_t uints[] = {0, 1, 9, 10, 18446744073709551615u, 10000000000000000000u, 9999999999u};
    char want[32];
    kvp__jw_t b;
    kvp__jw_init(&b);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        kvp__jw_int(&b, ints[i]);
        snprintf(want, sizeof want, "%" PRId64, ints[i]);
        written_is(&b, want);
    }
    for (size_t i = 0; i < sizeof uints / sizeof uints[0]; i++) {
        kvp__jw_uint(&b, uints[i]);
        snprintf(want, sizeof want, "%" PRIu64, uints[i]);
        written_is(&b, want);
    }
    kvp__jw_cleanup(&b);
}

/* The string scan takes eight bytes a step: every byte value at every
 * offset of strings around and across those steps, read and written, gets
 * what a byte-at-a-time scan gives. */
TEST(test_json_string_scan_every_byte_at_every_offset)
{
    kvp__json_parser_init(&g_p);
    char text[64], raw[64];
    for (size_t n = 1; n <= 40; n++) {
        for (size_t at = 0; at < n; at++) {
            for (unsigned c = 1; c < 256; c++) {
                memset(raw, 'a', n);
                raw[at] = (char)c;
                /* read: "aa<c>aa" */
                text[0] = '"';
                memcpy(text + 1, raw, n);
                text[n + 1] = '"';
                const kvp__json_t *v;
                kvp_status_t st = kvp__json_parse(&g_p, text, n + 2, &v);
                bool legal = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
                ASSERT_MSG(legal ? st == KVP_OK : st != KVP_OK, "n %zu at %zu byte 0x%02x: %s", n, at, c,
                           kvp_status_str(st));
                if (legal) {
                    ASSERT_EQ(v->type, KVP__JSON_STRING);
                    ASSERT_EQ(v->n, n);
                    ASSERT_MEM_EQ(v->u.s, raw, n);
                }
                if (c >= 0x80)
                    continue; /* (a lone byte beyond ASCII: the writer's WTF-8 cases above) */
                /* write: plain bytes go as they are, the others escaped */
                char esc[8];
                static const char *named = "\"\\\n\r\t\b\f", *names = "\"\\nrtbf";
                const char *k = c ? strchr(named, (int)c) : NULL;
                if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
                    snprintf(esc, sizeof esc, "%c", (int)c);
                else if (k)
                    snprintf(esc, sizeof esc, "\\%c", names[k - named]);
                else
                    snprintf(esc, sizeof esc, "\\u%04x", c);
                char want[80];
                snprintf(want, sizeof want, "\"%.*s%s%.*s\"", (int)at, raw, esc, (int)(n - at - 1), raw + at + 1);
                kvp__jw_t b;
                kvp__jw_init(&b);
                kvp__jw_str(&b, raw, n);
                ASSERT_MSG(b.len == strlen(want) && memcmp(b.p, want, b.len) == 0, "n %zu at %zu byte 0x%02x: %.*s", n,
                           at, c, (int)b.len, b.p);
                kvp__jw_cleanup(&b);
            }
            /* a two-byte character at the offset reads back; its lead alone does not */
            if (at + 2 <= n) {
                memset(raw, 'a', n);
                memcpy(raw + at, "\xc3\xa9", 2);
                text[0] = '"';
                memcpy(text + 1, raw, n);
                text[n + 1] = '"';
                const kvp__json_t *v;
                ASSERT_OK(kvp__json_parse(&g_p, text, n + 2, &v));
                ASSERT_MEM_EQ(v->u.s, raw, n);
                text[at + 2] = 'a';
                ASSERT(kvp__json_parse(&g_p, text, n + 2, &v) != KVP_OK);
            }
        }
    }
    kvp__json_parser_cleanup(&g_p);
}

TEST_LIST(T(test_json_numbers_are_classified_as_python_does), T(test_json_strings_are_strict_utf8_and_decoded),
          T(test_json_objects_keep_members_and_get_finds_the_last), T(test_json_depth_is_bounded),
          T(test_json_writer_escapes_as_python_ensure_ascii), T(test_json_written_strings_read_back_the_same),
          T(test_json_string_scan_every_byte_at_every_offset), T(test_json_writer_integers_as_printf_writes_them))
