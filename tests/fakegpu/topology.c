/* Topology loader: a small strict JSON parser (RFC 8259) and the schema of README.md.
 * A malformed file yields one stderr line "fakegpu: <path>: <problem>". */
#include "topology.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FG_DEFAULT_PATH "/etc/fakegpu/topology.json"
#define FG_MAX_FILE (4u << 20)
#define FG_MAX_DEPTH 64

/* ---------------------------------------------------------------- JSON ---- */

enum jt { JT_NULL, JT_BOOL, JT_NUM, JT_STR, JT_ARR, JT_OBJ };

struct jv {
    enum jt t;
    int b;         /* JT_BOOL */
    char *s;       /* JT_STR: value; JT_NUM: the literal text */
    size_t n;      /* JT_ARR / JT_OBJ: number of items */
    struct jv *items;
    char **keys;   /* JT_OBJ */
};

struct jparser {
    const char *start, *p, *end;
    int depth;
    char err[200];
};

static void jfree(struct jv *v)
{
    size_t i;
    free(v->s);
    for (i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof(*v));
}

static int jfail(struct jparser *jp, const char *what)
{
    if (jp->err[0] == '\0') {
        int line = 1, col = 1;
        const char *q;
        for (q = jp->start; q < jp->p; q++) {
            if (*q == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        snprintf(jp->err, sizeof(jp->err), "invalid JSON at line %d column %d: %s", line, col, what);
    }
    return -1;
}

static void jskip_ws(struct jparser *jp)
{
    while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r'))
        jp->p++;
}

static int jhex4(struct jparser *jp, unsigned *out)
{
    unsigned v = 0;
    int i;
    if (jp->end - jp->p < 4)
        return jfail(jp, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        char c = *jp->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return jfail(jp, "bad \\u escape");
    }
    *out = v;
    return 0;
}

/* Parses a string at jp->p (on the opening quote) into a malloc'd UTF-8 buffer. */
static int jstring(struct jparser *jp, char **out)
{
    size_t cap = 32, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return jfail(jp, "out of memory");
    jp->p++; /* opening quote */
    for (;;) {
        unsigned cp;
        unsigned char c;
        if (len + 5 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return jfail(jp, "out of memory");
            }
            buf = nb;
            cap *= 2;
        }
        if (jp->p >= jp->end) {
            free(buf);
            return jfail(jp, "unterminated string");
        }
        c = (unsigned char)*jp->p;
        if (c == '"') {
            jp->p++;
            break;
        }
        if (c < 0x20) {
            free(buf);
            return jfail(jp, "control character in string");
        }
        if (c != '\\') {
            buf[len++] = (char)c;
            jp->p++;
            continue;
        }
        jp->p++;
        if (jp->p >= jp->end) {
            free(buf);
            return jfail(jp, "unterminated string");
        }
        c = (unsigned char)*jp->p++;
        switch (c) {
        case '"': buf[len++] = '"'; continue;
        case '\\': buf[len++] = '\\'; continue;
        case '/': buf[len++] = '/'; continue;
        case 'b': buf[len++] = '\b'; continue;
        case 'f': buf[len++] = '\f'; continue;
        case 'n': buf[len++] = '\n'; continue;
        case 'r': buf[len++] = '\r'; continue;
        case 't': buf[len++] = '\t'; continue;
        case 'u': break;
        default:
            free(buf);
            jp->p--;
            return jfail(jp, "bad escape");
        }
        if (jhex4(jp, &cp) < 0) {
            free(buf);
            return -1;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (jp->end - jp->p < 6 || jp->p[0] != '\\' || jp->p[1] != 'u') {
                free(buf);
                return jfail(jp, "lone surrogate");
            }
            jp->p += 2;
            if (jhex4(jp, &lo) < 0) {
                free(buf);
                return -1;
            }
            if (lo < 0xDC00 || lo > 0xDFFF) {
                free(buf);
                return jfail(jp, "lone surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            free(buf);
            return jfail(jp, "lone surrogate");
        }
        if (cp == 0) {
            free(buf);
            return jfail(jp, "\\u0000 in string");
        }
        if (cp < 0x80) {
            buf[len++] = (char)cp;
        } else if (cp < 0x800) {
            buf[len++] = (char)(0xC0 | (cp >> 6));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[len++] = (char)(0xE0 | (cp >> 12));
            buf[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[len++] = (char)(0xF0 | (cp >> 18));
            buf[len++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[len++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[len++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

static int jdigits(struct jparser *jp)
{
    const char *s = jp->p;
    while (jp->p < jp->end && *jp->p >= '0' && *jp->p <= '9')
        jp->p++;
    return jp->p > s ? 0 : jfail(jp, "digit expected");
}

static int jnumber(struct jparser *jp, struct jv *v)
{
    const char *s = jp->p;
    size_t len;
    if (*jp->p == '-')
        jp->p++;
    if (jp->p < jp->end && *jp->p == '0')
        jp->p++;
    else if (jdigits(jp) < 0)
        return -1;
    if (jp->p < jp->end && *jp->p == '.') {
        jp->p++;
        if (jdigits(jp) < 0)
            return -1;
    }
    if (jp->p < jp->end && (*jp->p == 'e' || *jp->p == 'E')) {
        jp->p++;
        if (jp->p < jp->end && (*jp->p == '+' || *jp->p == '-'))
            jp->p++;
        if (jdigits(jp) < 0)
            return -1;
    }
    len = (size_t)(jp->p - s);
    v->t = JT_NUM;
    v->s = malloc(len + 1);
    if (!v->s)
        return jfail(jp, "out of memory");
    memcpy(v->s, s, len);
    v->s[len] = '\0';
    return 0;
}

static int jliteral(struct jparser *jp, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(jp->end - jp->p) < n || memcmp(jp->p, word, n) != 0)
        return jfail(jp, "unexpected character");
    jp->p += n;
    return 0;
}

static int jvalue(struct jparser *jp, struct jv *v);

static int jpush(struct jparser *jp, struct jv *v, size_t *cap)
{
    if (v->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        struct jv *ni = realloc(v->items, nc * sizeof(*ni));
        if (!ni)
            return jfail(jp, "out of memory");
        v->items = ni;
        if (v->t == JT_OBJ) {
            char **nk = realloc(v->keys, nc * sizeof(*nk));
            if (!nk)
                return jfail(jp, "out of memory");
            v->keys = nk;
        }
        *cap = nc;
    }
    memset(&v->items[v->n], 0, sizeof(v->items[0]));
    if (v->t == JT_OBJ)
        v->keys[v->n] = NULL;
    v->n++;
    return 0;
}

static int jcontainer(struct jparser *jp, struct jv *v, char close)
{
    size_t cap = 0;
    if (++jp->depth > FG_MAX_DEPTH)
        return jfail(jp, "nested too deeply");
    jp->p++; /* opening bracket */
    jskip_ws(jp);
    if (jp->p < jp->end && *jp->p == close) {
        jp->p++;
        jp->depth--;
        return 0;
    }
    for (;;) {
        if (jpush(jp, v, &cap) < 0)
            return -1;
        if (v->t == JT_OBJ) {
            jskip_ws(jp);
            if (jp->p >= jp->end || *jp->p != '"')
                return jfail(jp, "object key expected");
            if (jstring(jp, &v->keys[v->n - 1]) < 0)
                return -1;
            jskip_ws(jp);
            if (jp->p >= jp->end || *jp->p != ':')
                return jfail(jp, "':' expected");
            jp->p++;
        }
        if (jvalue(jp, &v->items[v->n - 1]) < 0)
            return -1;
        jskip_ws(jp);
        if (jp->p < jp->end && *jp->p == ',') {
            jp->p++;
            continue;
        }
        if (jp->p < jp->end && *jp->p == close) {
            jp->p++;
            jp->depth--;
            return 0;
        }
        return jfail(jp, close == '}' ? "',' or '}' expected" : "',' or ']' expected");
    }
}

static int jvalue(struct jparser *jp, struct jv *v)
{
    jskip_ws(jp);
    if (jp->p >= jp->end)
        return jfail(jp, "value expected");
    switch (*jp->p) {
    case '{':
        v->t = JT_OBJ;
        return jcontainer(jp, v, '}');
    case '[':
        v->t = JT_ARR;
        return jcontainer(jp, v, ']');
    case '"':
        v->t = JT_STR;
        return jstring(jp, &v->s);
    case 't':
        v->t = JT_BOOL;
        v->b = 1;
        return jliteral(jp, "true");
    case 'f':
        v->t = JT_BOOL;
        return jliteral(jp, "false");
    case 'n':
        v->t = JT_NULL;
        return jliteral(jp, "null");
    default:
        if (*jp->p == '-' || (*jp->p >= '0' && *jp->p <= '9'))
            return jnumber(jp, v);
        return jfail(jp, "value expected");
    }
}

static int jparse(const char *text, size_t len, struct jv *root, char *err, size_t errlen)
{
    struct jparser jp;
    memset(&jp, 0, sizeof(jp));
    jp.start = jp.p = text;
    jp.end = text + len;
    memset(root, 0, sizeof(*root));
    if (jvalue(&jp, root) == 0) {
        jskip_ws(&jp);
        if (jp.p == jp.end)
            return 0;
        jfail(&jp, "trailing characters after the top-level value");
    }
    jfree(root);
    snprintf(err, errlen, "%s", jp.err);
    return -1;
}

/* Last duplicate wins, as with Python's json module (which the hook uses). */
static const struct jv *jget(const struct jv *obj, const char *key)
{
    size_t i;
    if (obj->t != JT_OBJ)
        return NULL;
    for (i = obj->n; i-- > 0;)
        if (strcmp(obj->keys[i], key) == 0)
            return &obj->items[i];
    return NULL;
}

/* -------------------------------------------------------------- schema ---- */

struct schema {
    char err[400];
};

static int sfail(struct schema *sc, const char *where, const char *what)
{
    if (sc->err[0] == '\0')
        snprintf(sc->err, sizeof(sc->err), "%s: %s", where, what);
    return -1;
}

/* An integer field: a JSON number without fraction or exponent, 0..max. */
static int get_uint(struct schema *sc, const struct jv *obj, const char *key, const char *where,
                    unsigned long long max, unsigned long long dflt, unsigned long long *out)
{
    const struct jv *v = jget(obj, key);
    char w[160], *endp;
    unsigned long long x;
    snprintf(w, sizeof(w), "%s.%s", where, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (v->t != JT_NUM || v->s[0] == '-' || strpbrk(v->s, ".eE"))
        return sfail(sc, w, "must be a non-negative integer");
    errno = 0;
    x = strtoull(v->s, &endp, 10);
    if (errno || *endp || x > max)
        return sfail(sc, w, "integer out of range");
    *out = x;
    return 0;
}

/* An optional reading: absent or null -> FG_UNSUPPORTED (the card has no such sensor), else an integer <= max. */
static int get_reading(struct schema *sc, const struct jv *obj, const char *key, const char *where,
                       unsigned long long max, long long *out)
{
    const struct jv *v = jget(obj, key);
    unsigned long long x;
    if (!v || v->t == JT_NULL) {
        *out = FG_UNSUPPORTED;
        return 0;
    }
    if (get_uint(sc, obj, key, where, max, 0, &x) < 0)
        return -1;
    *out = (long long)x;
    return 0;
}

/* A string field copied into buf; absent -> dflt (NULL dflt means required). */
static int get_str(struct schema *sc, const struct jv *obj, const char *key, const char *where,
                   const char *dflt, char *buf, size_t buflen)
{
    const struct jv *v = jget(obj, key);
    char w[160];
    snprintf(w, sizeof(w), "%s.%s", where, key);
    if (!v) {
        if (!dflt)
            return sfail(sc, w, "missing");
        snprintf(buf, buflen, "%s", dflt);
        return 0;
    }
    if (v->t != JT_STR)
        return sfail(sc, w, "must be a string");
    if (strlen(v->s) >= buflen)
        return sfail(sc, w, "too long");
    memcpy(buf, v->s, strlen(v->s) + 1);
    return 0;
}

static int get_bool(struct schema *sc, const struct jv *obj, const char *key, const char *where, int *out)
{
    const struct jv *v = jget(obj, key);
    char w[160];
    snprintf(w, sizeof(w), "%s.%s", where, key);
    *out = 0;
    if (!v || v->t == JT_NULL)
        return 0;
    if (v->t != JT_BOOL)
        return sfail(sc, w, "must be true or false");
    *out = v->b;
    return 0;
}

/* pci_device_id / pci_subsystem_id: an integer or a "0x..." string (JSON has no hex). */
static int get_hex32(struct schema *sc, const struct jv *obj, const char *key, const char *where,
                     unsigned dflt, unsigned *out)
{
    const struct jv *v = jget(obj, key);
    char w[160], *endp;
    unsigned long long x;
    snprintf(w, sizeof(w), "%s.%s", where, key);
    if (v && v->t == JT_STR) {
        const char *s = v->s;
        if (s[0] != '0' || (s[1] != 'x' && s[1] != 'X') || s[2] == '\0')
            return sfail(sc, w, "must be an integer or a \"0x...\" string");
        errno = 0;
        x = strtoull(s + 2, &endp, 16);
        if (errno || *endp || x > 0xFFFFFFFFull)
            return sfail(sc, w, "must be an integer or a \"0x...\" string");
        *out = (unsigned)x;
        return 0;
    }
    if (get_uint(sc, obj, key, where, 0xFFFFFFFFull, dflt, &x) < 0)
        return -1;
    *out = (unsigned)x;
    return 0;
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* "<prefix>xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
static int valid_uuid(const char *s, const char *prefix)
{
    static const int groups[] = {8, 4, 4, 4, 12};
    size_t g;
    int i;
    if (strncmp(s, prefix, 4) != 0)
        return 0;
    s += 4;
    for (g = 0; g < 5; g++) {
        for (i = 0; i < groups[g]; i++)
            if (!is_hex(*s++))
                return 0;
        if (g < 4 && *s++ != '-')
            return 0;
    }
    return *s == '\0';
}

int fg_uuid_bytes(const char *uuid, unsigned char out[16])
{
    int n = 0;
    const char *s;
    if (strlen(uuid) < 4)
        return -1;
    for (s = uuid + 4; *s && n < 32; s++) {
        unsigned d;
        if (*s == '-')
            continue;
        if (!is_hex(*s))
            return -1;
        d = (unsigned)(*s <= '9' ? *s - '0' : (*s | 0x20) - 'a' + 10);
        if (n % 2 == 0)
            out[n / 2] = (unsigned char)(d << 4);
        else
            out[n / 2] |= (unsigned char)d;
        n++;
    }
    return n == 32 && *s == '\0' ? 0 : -1;
}

/* One field of a bus id, as sscanf's %x reads it: blanks, an optional '+', an optional 0x,
 * at least one hex digit. */
static const char *hex_field(const char *s, unsigned *out)
{
    unsigned long long v = 0;
    const char *start;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\v' || *s == '\f' || *s == '\r')
        s++;
    if (*s == '+')
        s++;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X') && is_hex(s[2]))
        s += 2;
    start = s;
    while (is_hex(*s)) {
        v = v * 16 + (unsigned long long)(*s <= '9' ? *s - '0' : (*s | 0x20) - 'a' + 10);
        if (v > 0xFFFFFFFFull)
            return NULL;
        s++;
    }
    if (s == start)
        return NULL;
    *out = (unsigned)v;
    return s;
}

int fg_parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *device, unsigned *function)
{
    unsigned f[4];
    int nf = 0;
    char seps[3];
    const char *p = s;
    if (!s)
        return -1;
    /* Read up to four fields and remember the separators between them; nothing may follow. */
    for (;;) {
        p = hex_field(p, &f[nf]);
        if (!p)
            return -1;
        nf++;
        if (*p == '\0')
            break;
        if ((*p != ':' && *p != '.') || nf == 4)
            return -1;
        seps[nf - 1] = *p++;
    }
    if (nf == 4 && seps[0] == ':' && seps[1] == ':' && seps[2] == '.') {
        *domain = f[0], *bus = f[1], *device = f[2], *function = f[3];
    } else if (nf == 3 && seps[0] == ':' && seps[1] == ':') {
        *domain = f[0], *bus = f[1], *device = f[2], *function = 0;
    } else if (nf == 3 && seps[0] == ':' && seps[1] == '.') {
        *domain = 0, *bus = f[0], *device = f[1], *function = f[2];
    } else {
        return -1;
    }
    return 0;
}

int fg_bus_cmp(const struct fg_gpu *a, const struct fg_gpu *b)
{
    if (a->domain != b->domain)
        return a->domain < b->domain ? -1 : 1;
    if (a->bus != b->bus)
        return a->bus < b->bus ? -1 : 1;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    if (a->function != b->function)
        return a->function < b->function ? -1 : 1;
    return 0;
}

static int bus_cmp_q(const void *a, const void *b)
{
    return fg_bus_cmp(a, b);
}

/* PCI device ids of the models the scenarios use; others get "pci_device_id" or 0x000010DE. */
static unsigned default_pci_device_id(const char *name)
{
    static const struct { const char *name; unsigned id; } known[] = {
        {"NVIDIA A800-SXM4-80GB", 0x20F310DE},  {"NVIDIA A100-SXM4-40GB", 0x20B010DE},
        {"NVIDIA A100-SXM4-80GB", 0x20B210DE},  {"NVIDIA GeForce RTX 4090", 0x268410DE},
        {"NVIDIA H100 80GB HBM3", 0x233010DE},  {"NVIDIA H200", 0x233510DE},
    };
    size_t i;
    for (i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(known[i].name, name) == 0)
            return known[i].id;
    return 0x000010DE;
}

static int default_sm_count(int major, int minor)
{
    if (major == 9)
        return 132;
    if (major == 8 && minor == 9)
        return 128;
    if (major == 8)
        return 108;
    return 80;
}

/* A flag read over its current value: absent or null keeps it. */
static int get_flag(struct schema *sc, const struct jv *obj, const char *key, const char *where, int *out)
{
    const struct jv *v = jget(obj, key);
    if (!v || v->t == JT_NULL)
        return 0;
    return get_bool(sc, obj, key, where, out);
}

/* An unsigned read over its current value. */
static int get_count(struct schema *sc, const struct jv *obj, const char *key, const char *where,
                     unsigned long long max, unsigned long long *inout)
{
    return get_uint(sc, obj, key, where, max, *inout, inout);
}

static int get_count32(struct schema *sc, const struct jv *obj, const char *key, const char *where, unsigned *inout)
{
    unsigned long long x = *inout;
    if (get_count(sc, obj, key, where, 0xFFFFFFFFull, &x) < 0)
        return -1;
    *inout = (unsigned)x;
    return 0;
}

/* The health keys of a card ("lost", "ecc", "row_remapping", "remap", "retired_pages_pending", "xid"), the same in
 * the topology and the fault file: each key present replaces its value in *h, each absent one keeps it. */
static int load_health(struct schema *sc, const struct jv *o, const char *where, struct fg_health *h)
{
    static const char *const ecc_keys[2][2] = {{"volatile_corrected", "aggregate_corrected"},
                                               {"volatile_uncorrected", "aggregate_uncorrected"}};
    const struct jv *v;
    char w[160];
    int i, j, flag;
    if (get_flag(sc, o, "lost", where, &h->lost) < 0 ||
        get_flag(sc, o, "row_remapping", where, &h->row_remapping) < 0 ||
        get_flag(sc, o, "retired_pages_pending", where, &h->retired_pages_pending) < 0)
        return -1;
    if (get_count32(sc, o, "memory_query_error", where, &h->memory_query_error) < 0)
        return -1;
    if (h->memory_query_error > 999)
        return sfail(sc, where, "memory_query_error is an nvmlReturn_t (0..999)");
    v = jget(o, "ecc");
    snprintf(w, sizeof(w), "%.100s.ecc", where);
    if (v && v->t == JT_NULL) {
        h->ecc_supported = 0;
    } else if (v) {
        if (v->t != JT_OBJ)
            return sfail(sc, w, "must be an object or null");
        h->ecc_supported = 1;
        if (get_count32(sc, v, "mode", w, &h->ecc_mode) < 0)
            return -1;
        h->ecc_pending_mode = h->ecc_mode;
        if (get_count32(sc, v, "pending_mode", w, &h->ecc_pending_mode) < 0)
            return -1;
        if (h->ecc_mode > 1 || h->ecc_pending_mode > 1)
            return sfail(sc, w, "mode and pending_mode must be 0 or 1");
        for (i = 0; i < 2; i++)
            for (j = 0; j < 2; j++)
                if (get_count(sc, v, ecc_keys[i][j], w, 1ull << 48, &h->ecc[i][j]) < 0)
                    return -1;
    }
    v = jget(o, "remap");
    snprintf(w, sizeof(w), "%.100s.remap", where);
    if (v && v->t != JT_NULL) {
        if (v->t != JT_OBJ)
            return sfail(sc, w, "must be an object");
        if (get_count32(sc, v, "corrected", w, &h->remap_corrected) < 0 ||
            get_count32(sc, v, "uncorrected", w, &h->remap_uncorrected) < 0)
            return -1;
        flag = (int)h->remap_pending;
        if (get_flag(sc, v, "pending", w, &flag) < 0)
            return -1;
        h->remap_pending = (unsigned)flag;
        flag = (int)h->remap_failure;
        if (get_flag(sc, v, "failure", w, &flag) < 0)
            return -1;
        h->remap_failure = (unsigned)flag;
    }
    v = jget(o, "xid");
    snprintf(w, sizeof(w), "%.100s.xid", where);
    if (v && v->t != JT_NULL) {
        size_t k;
        if (v->t != JT_ARR)
            return sfail(sc, w, "must be an array of XID numbers");
        if (v->n > FG_MAX_XID)
            return sfail(sc, w, "too many XIDs");
        for (k = 0; k < v->n; k++) {
            char *endp;
            unsigned long long x;
            const struct jv *e = &v->items[k];
            if (e->t != JT_NUM || e->s[0] == '-' || strpbrk(e->s, ".eE"))
                return sfail(sc, w, "must be an array of XID numbers");
            x = strtoull(e->s, &endp, 10);
            if (*endp || x == 0 || x > 0xFFFFu)
                return sfail(sc, w, "an XID is 1..65535");
            h->xid[k] = (unsigned)x;
        }
        h->nxid = (int)v->n;
    }
    /* NVML's aggregate counters include the volatile ones. */
    for (i = 0; i < 2; i++)
        if (h->ecc[i][1] < h->ecc[i][0])
            h->ecc[i][1] = h->ecc[i][0];
    if (!h->row_remapping && (h->remap_corrected || h->remap_uncorrected || h->remap_pending || h->remap_failure))
        return sfail(sc, where, "remap needs a card that remaps rows (\"row_remapping\": true)");
    if (h->row_remapping && h->retired_pages_pending)
        return sfail(sc, where, "retired_pages_pending needs a card that retires pages (\"row_remapping\": false)");
    return 0;
}

static int load_mig(struct schema *sc, const struct jv *m, const char *where, struct fg_gpu *g)
{
    const struct jv *devs;
    unsigned long long x;
    char w[160];
    size_t i;
    if (m->t != JT_OBJ)
        return sfail(sc, where, "must be an object");
    if (get_uint(sc, m, "mode", where, 1, 0, &x) < 0)
        return -1;
    g->mig_mode = (unsigned)x;
    if (get_uint(sc, m, "pending_mode", where, 1, g->mig_mode, &x) < 0)
        return -1;
    g->mig_pending_mode = (unsigned)x;
    devs = jget(m, "devices");
    if (!devs || devs->t == JT_NULL)
        return 0;
    snprintf(w, sizeof(w), "%.100s.devices", where);
    if (devs->t != JT_ARR)
        return sfail(sc, w, "must be an array");
    if (devs->n && g->mig_mode != 1)
        return sfail(sc, w, "MIG devices need \"mode\": 1");
    if (devs->n > FG_MAX_MIG)
        return sfail(sc, w, "too many MIG devices");
    for (i = 0; i < devs->n; i++) {
        const struct jv *d = &devs->items[i];
        struct fg_mig *mg = &g->mig[i];
        char dflt_name[FG_NAME_LEN + 8];
        snprintf(w, sizeof(w), "%.100s.devices[%zu]", where, i);
        if (d->t != JT_OBJ)
            return sfail(sc, w, "must be an object");
        if (get_str(sc, d, "uuid", w, NULL, mg->uuid, sizeof(mg->uuid)) < 0)
            return -1;
        if (!valid_uuid(mg->uuid, "MIG-"))
            return sfail(sc, w, "uuid must look like MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx");
        snprintf(dflt_name, sizeof(dflt_name), "%.80s MIG", g->name);
        if (get_str(sc, d, "name", w, dflt_name, mg->name, sizeof(mg->name)) < 0)
            return -1;
        if (get_uint(sc, d, "gpu_instance_id", w, 0xFFFFFFFEull, i + 1, &x) < 0)
            return -1;
        mg->gpu_instance_id = (unsigned)x;
        if (get_uint(sc, d, "compute_instance_id", w, 0xFFFFFFFEull, 0, &x) < 0)
            return -1;
        mg->compute_instance_id = (unsigned)x;
        if (get_uint(sc, d, "memory_total_mib", w, g->memory_total_mib, g->memory_total_mib / devs->n,
                     &mg->memory_total_mib) < 0)
            return -1;
        if (get_uint(sc, d, "memory_used_mib", w, mg->memory_total_mib, 0, &mg->memory_used_mib) < 0)
            return -1;
        x = g->memory_total_mib ? (unsigned long long)g->multiprocessor_count * mg->memory_total_mib /
                                       g->memory_total_mib : 1;
        if (get_uint(sc, d, "multiprocessor_count", w, 100000, x ? x : 1, &x) < 0)
            return -1;
        mg->multiprocessor_count = (int)x;
        g->nmig++;
    }
    return 0;
}

/* One process entry (the topology's "processes" and the processes file share it). */
static int load_proc(struct schema *sc, const struct jv *p, const char *w, unsigned long long memory_total_mib,
                     struct fg_proc *fp)
{
    const struct jv *v;
    unsigned long long x;
    if (p->t != JT_OBJ)
        return sfail(sc, w, "must be an object");
    if (!jget(p, "pid"))
        return sfail(sc, w, "pid missing");
    if (get_uint(sc, p, "pid", w, 0xFFFFFFFFull, 0, &x) < 0)
        return -1;
    fp->pid = (unsigned)x;
    v = jget(p, "used_memory_mib");
    fp->used_unknown = v && v->t == JT_NULL;
    if (!fp->used_unknown && get_uint(sc, p, "used_memory_mib", w, memory_total_mib, 0, &fp->used_mib) < 0)
        return -1;
    if (get_uint(sc, p, "gpu_instance_id", w, FG_NO_INSTANCE, FG_NO_INSTANCE, &x) < 0)
        return -1;
    fp->gpu_instance_id = (unsigned)x;
    if (get_uint(sc, p, "compute_instance_id", w, FG_NO_INSTANCE, FG_NO_INSTANCE, &x) < 0)
        return -1;
    fp->compute_instance_id = (unsigned)x;
    v = jget(p, "kind");
    if (v && !(v->t == JT_STR && (strcmp(v->s, "compute") == 0 || strcmp(v->s, "graphics") == 0)))
        return sfail(sc, w, "kind must be \"compute\" or \"graphics\"");
    fp->graphics = v && strcmp(v->s, "graphics") == 0;
    return 0;
}

static int load_gpu(struct schema *sc, const struct jv *o, size_t idx, struct fg_gpu *g)
{
    char where[64], cc[16], bus[64], w[160];
    const struct jv *procs, *mig;
    unsigned long long x;
    size_t i;
    int maj, min, used;

    snprintf(where, sizeof(where), "gpus[%zu]", idx);
    if (o->t != JT_OBJ)
        return sfail(sc, where, "must be an object");
    if (get_str(sc, o, "uuid", where, NULL, g->uuid, sizeof(g->uuid)) < 0)
        return -1;
    if (!valid_uuid(g->uuid, "GPU-"))
        return sfail(sc, where, "uuid must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx");
    if (get_str(sc, o, "bus_id", where, NULL, bus, sizeof(bus)) < 0)
        return -1;
    if (fg_parse_bus_id(bus, &g->domain, &g->bus, &g->device, &g->function) < 0 || g->bus > 0xFF ||
        g->device > 0x1F || g->function != 0) {
        snprintf(w, sizeof(w), "%s.bus_id", where);
        return sfail(sc, w, "not a PCI bus id of a GPU (domain:bus:device.0, hex)");
    }
    /* "NVIDIA Graphics Device" is what NVML reports for a card it has no name for. */
    if (get_str(sc, o, "name", where, "NVIDIA Graphics Device", g->name, sizeof(g->name)) < 0)
        return -1;
    if (get_str(sc, o, "compute_capability", where, "8.0", cc, sizeof(cc)) < 0)
        return -1;
    if (sscanf(cc, "%d.%d%n", &maj, &min, &used) != 2 || cc[used] != '\0' || maj < 1 || maj > 99 ||
        min < 0 || min > 9) {
        snprintf(w, sizeof(w), "%s.compute_capability", where);
        return sfail(sc, w, "must be a string like \"8.0\"");
    }
    g->cc_major = maj;
    g->cc_minor = min;
    if (get_uint(sc, o, "memory_total_mib", where, 1ull << 30, 81920, &g->memory_total_mib) < 0 ||
        get_uint(sc, o, "memory_used_mib", where, g->memory_total_mib, 0, &g->memory_used_mib) < 0)
        return -1;
    if (get_uint(sc, o, "utilization_gpu", where, 100, 0, &x) < 0)
        return -1;
    g->utilization_gpu = (unsigned)x;
    if (get_uint(sc, o, "utilization_memory", where, 100, 0, &x) < 0)
        return -1;
    g->utilization_memory = (unsigned)x;
    if (get_reading(sc, o, "temperature_gpu", where, 200, &g->temperature_c) < 0 ||
        get_reading(sc, o, "power_draw_mw", where, 10000000, &g->power_draw_mw) < 0 ||
        get_reading(sc, o, "power_limit_mw", where, 10000000, &g->power_limit_mw) < 0 ||
        get_reading(sc, o, "persistence_mode", where, 1, &g->persistence_mode) < 0)
        return -1;
    if (g->persistence_mode == FG_UNSUPPORTED)
        g->persistence_mode = 1;
    if (get_uint(sc, o, "minor_number", where, 0xFFFFFFFFull, idx, &x) < 0)
        return -1;
    g->minor_number = (unsigned)x;
    if (get_hex32(sc, o, "pci_device_id", where, default_pci_device_id(g->name), &g->pci_device_id) < 0 ||
        get_hex32(sc, o, "pci_subsystem_id", where, 0x16A110DE, &g->pci_subsystem_id) < 0)
        return -1;
    if (get_uint(sc, o, "multiprocessor_count", where, 100000, (unsigned long long)default_sm_count(maj, min),
                 &x) < 0)
        return -1;
    g->multiprocessor_count = (int)x;
    /* Measured on H200: ECC on and clean, rows remapped (Ampere and later), page retirement not supported. */
    g->health.ecc_supported = 1;
    g->health.ecc_mode = g->health.ecc_pending_mode = 1;
    g->health.row_remapping = maj >= 8;
    if (load_health(sc, o, where, &g->health) < 0)
        return -1;

    procs = jget(o, "processes");
    if (procs && procs->t != JT_NULL) {
        snprintf(w, sizeof(w), "%s.processes", where);
        if (procs->t != JT_ARR)
            return sfail(sc, w, "must be an array");
        if (procs->n > FG_MAX_PROCS)
            return sfail(sc, w, "too many processes");
        for (i = 0; i < procs->n; i++) {
            snprintf(w, sizeof(w), "%s.processes[%zu]", where, i);
            if (load_proc(sc, &procs->items[i], w, g->memory_total_mib, &g->procs[i]) < 0)
                return -1;
            g->nprocs++;
        }
    }
    mig = jget(o, "mig");
    if (mig && mig->t != JT_NULL) {
        snprintf(w, sizeof(w), "%s.mig", where);
        if (load_mig(sc, mig, w, g) < 0)
            return -1;
    }
    return 0;
}

/* "nvml_init": a name below or an nvmlReturn_t int: what nvmlInit* returns. */
static int get_nvml_error(struct schema *sc, const struct jv *obj, const char *where, int *out)
{
    static const struct { const char *name; int code; } nvml_faults[] = {
        {"unknown_error", 999}, {"driver_not_loaded", 9}, {"no_permission", 4},
        {"lib_rm_version_mismatch", 18},
    };
    const struct jv *v = jget(obj, "nvml_init");
    unsigned long long x;
    char w[160];
    size_t i;
    snprintf(w, sizeof(w), "%s.nvml_init", where);
    if (v && v->t == JT_STR) {
        for (i = 0; i < sizeof(nvml_faults) / sizeof(nvml_faults[0]); i++)
            if (strcmp(v->s, nvml_faults[i].name) == 0)
                *out = nvml_faults[i].code;
        if (!*out)
            return sfail(sc, w,
                         "must be unknown_error, driver_not_loaded, no_permission, "
                         "lib_rm_version_mismatch or an nvmlReturn_t number");
    } else if (v && v->t != JT_NULL) {
        if (get_uint(sc, obj, "nvml_init", where, 999, 0, &x) < 0)
            return -1;
        *out = (int)x;
    }
    return 0;
}

static int load_faults(struct schema *sc, const struct jv *f, struct fg_topology *t)
{
    const struct jv *v;
    unsigned long long x;
    if (f->t != JT_OBJ)
        return sfail(sc, "faults", "must be an object");
    if (get_nvml_error(sc, f, "faults", &t->nvml_init_fault) < 0)
        return -1;
    v = jget(f, "cuda_init");
    if (v && v->t != JT_NULL) {
        if (get_uint(sc, f, "cuda_init", "faults", 999, 0, &x) < 0)
            return -1;
        t->cuda_init_fault = (int)x;
    }
    v = jget(f, "cuda_init_delay_ms");
    if (v && v->t != JT_NULL) {
        if (get_uint(sc, f, "cuda_init_delay_ms", "faults", 3600000, 0, &x) < 0)
            return -1;
        t->cuda_init_delay_ms = (int)x;
    }
    return 0; /* hook_expose / hook_expose_all belong to the hook */
}

static int load_topology(struct schema *sc, const struct jv *root, struct fg_topology *t)
{
    const struct jv *gpus, *faults;
    unsigned long long x;
    int i, j, k, l;
    if (root->t != JT_OBJ)
        return sfail(sc, "top level", "must be an object");
    if (get_str(sc, root, "driver_version", "top level", FG_DEFAULT_DRIVER_VERSION, t->driver_version,
                sizeof(t->driver_version) - 8) < 0)
        return -1;
    if (get_uint(sc, root, "cuda_driver_version", "top level", 1000000, FG_DEFAULT_CUDA_VERSION, &x) < 0)
        return -1;
    t->cuda_driver_version = (int)x;
    faults = jget(root, "faults");
    if (faults && faults->t != JT_NULL && load_faults(sc, faults, t) < 0)
        return -1;
    gpus = jget(root, "gpus");
    if (!gpus)
        return sfail(sc, "gpus", "missing");
    if (gpus->t != JT_ARR)
        return sfail(sc, "gpus", "must be an array");
    if (gpus->n > FG_MAX_GPUS)
        return sfail(sc, "gpus", "too many GPUs");
    for (i = 0; i < (int)gpus->n; i++) {
        if (load_gpu(sc, &gpus->items[i], (size_t)i, &t->gpus[i]) < 0)
            return -1;
        t->ngpus++;
    }
    qsort(t->gpus, (size_t)t->ngpus, sizeof(t->gpus[0]), bus_cmp_q);
    for (i = 0; i < t->ngpus; i++) {
        struct fg_gpu *g = &t->gpus[i];
        if (i > 0 && fg_bus_cmp(&t->gpus[i - 1], g) == 0)
            return sfail(sc, "gpus", "two GPUs have the same bus_id");
        for (j = 0; j < g->nmig; j++)
            g->mig[j].parent = g;
        /* UUIDs are unique across GPUs and MIG devices. */
        for (k = 0; k <= i; k++) {
            const struct fg_gpu *h = &t->gpus[k];
            if (k < i && strcmp(h->uuid, g->uuid) == 0)
                return sfail(sc, "gpus", "two GPUs have the same uuid");
            for (j = 0; j < g->nmig; j++)
                for (l = 0; l < (k < i ? h->nmig : j); l++)
                    if (strcmp(h->mig[l].uuid, g->mig[j].uuid) == 0)
                        return sfail(sc, "gpus", "two MIG devices have the same uuid");
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- load ---- */

/* Reads the whole file at path into a malloc'd buffer (not NUL-terminated). */
static enum fg_load_status read_text(const char *path, char **out, size_t *outlen)
{
    char *text;
    size_t len = 0, cap = 65536;
    FILE *f;
    int rc;
    f = fopen(path, "re");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR)
            return FG_LOAD_MISSING;
        fprintf(stderr, "fakegpu: %s: cannot read: %s\n", path, strerror(errno));
        return FG_LOAD_MALFORMED;
    }
    text = malloc(cap);
    while (text) {
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0 || len > FG_MAX_FILE)
            break;
        if (len == cap) {
            char *nt = realloc(text, cap * 2);
            if (!nt) {
                free(text);
                text = NULL;
                break;
            }
            text = nt;
            cap *= 2;
        }
    }
    rc = ferror(f);
    fclose(f);
    if (!text || rc || len > FG_MAX_FILE) {
        fprintf(stderr, "fakegpu: %s: cannot read: %s\n", path,
                !text ? "out of memory" : rc ? "read error" : "file too large");
        free(text);
        return FG_LOAD_MALFORMED;
    }
    *out = text;
    *outlen = len;
    return FG_LOAD_OK;
}

enum fg_load_status fg_topology_load(struct fg_topology *t)
{
    const char *path = getenv("FAKEGPU_TOPOLOGY");
    char err[400], *text = NULL;
    size_t len = 0;
    struct jv root;
    struct schema sc;
    enum fg_load_status st;
    int rc;

    memset(t, 0, sizeof(*t));
    if (!path || !*path)
        path = FG_DEFAULT_PATH;
    snprintf(t->path, sizeof(t->path), "%s", path);
    st = read_text(path, &text, &len);
    if (st != FG_LOAD_OK)
        return st;
    rc = jparse(text, len, &root, err, sizeof(err));
    free(text);
    if (rc < 0) {
        fprintf(stderr, "fakegpu: %s: %s\n", path, err);
        return FG_LOAD_MALFORMED;
    }
    memset(&sc, 0, sizeof(sc));
    rc = load_topology(&sc, &root, t);
    jfree(&root);
    if (rc < 0) {
        fprintf(stderr, "fakegpu: %s: %s\n", path, sc.err);
        memset(t->gpus, 0, sizeof(t->gpus));
        t->ngpus = 0;
        return FG_LOAD_MALFORMED;
    }
    return FG_LOAD_OK;
}

/* ------------------------------------------------------------- faults ---- */

/* The card a fault file's key names: its exact UUID, or its NVML index in decimal. -1: none of t's. */
static int card_of_key(const struct fg_topology *t, const char *key)
{
    char *endp;
    unsigned long x;
    int i;
    for (i = 0; i < t->ngpus; i++)
        if (strcmp(t->gpus[i].uuid, key) == 0)
            return i;
    if (key[0] < '0' || key[0] > '9')
        return -1;
    errno = 0;
    x = strtoul(key, &endp, 10);
    return errno || *endp || x >= (unsigned long)t->ngpus ? -1 : (int)x;
}

static int load_fault_file(struct schema *sc, const struct jv *root, const struct fg_topology *t,
                           struct fg_health live[FG_MAX_GPUS], int *nvml_init)
{
    const struct jv *cards;
    size_t k;
    if (root->t != JT_OBJ)
        return sfail(sc, "top level", "must be an object");
    if (get_nvml_error(sc, root, "top level", nvml_init) < 0)
        return -1;
    cards = jget(root, "cards");
    if (!cards || cards->t == JT_NULL)
        return 0;
    if (cards->t != JT_OBJ)
        return sfail(sc, "cards", "must be an object keyed by UUID or NVML index");
    for (k = 0; k < cards->n; k++) {
        char where[160];
        /* A card this topology lacks is skipped, so one file serves a host and its containers. */
        int i = card_of_key(t, cards->keys[k]);
        snprintf(where, sizeof(where), "cards.%.100s", cards->keys[k]);
        if (cards->items[k].t != JT_OBJ)
            return sfail(sc, where, "must be an object");
        if (i >= 0 && load_health(sc, &cards->items[k], where, &live[i]) < 0)
            return -1;
    }
    return 0;
}

enum fg_load_status fg_faults_load(const struct fg_topology *t, struct fg_health live[FG_MAX_GPUS], int *nvml_init)
{
    static int reported; /* one stderr line per process, not one per call */
    const char *path = getenv("FAKEGPU_FAULTS");
    char err[400], *text = NULL;
    size_t len = 0;
    struct jv root;
    struct schema sc;
    enum fg_load_status st;
    int i, rc;

    for (i = 0; i < t->ngpus; i++)
        live[i] = t->gpus[i].health;
    *nvml_init = 0;
    if (!path || !*path)
        return FG_LOAD_OK;
    st = read_text(path, &text, &len);
    if (st == FG_LOAD_MISSING)
        return FG_LOAD_OK;
    if (st != FG_LOAD_OK)
        return st;
    rc = jparse(text, len, &root, err, sizeof(err));
    free(text);
    memset(&sc, 0, sizeof(sc));
    if (rc == 0) {
        rc = load_fault_file(&sc, &root, t, live, nvml_init);
        jfree(&root);
        snprintf(err, sizeof(err), "%s", sc.err);
    }
    if (rc < 0) {
        if (!__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "fakegpu: %s: %s\n", path, err);
        for (i = 0; i < t->ngpus; i++)
            live[i] = t->gpus[i].health;
        *nvml_init = 0;
        return FG_LOAD_MALFORMED;
    }
    return FG_LOAD_OK;
}

/* ------------------------------------------------------ processes file ---- */

/* The processes file (README.md, "Processes that come and go"): each key a card or MIG UUID, each value its
 * processes (as in the topology) or an error that the process queries on that handle answer (the card's own, or
 * the MIG device's: a MIG card lists every instance's processes to root only). Re-read on each call, so that a
 * test can start and end real processes while a client runs. */
int fg_file_processes(const struct fg_gpu *g, const struct fg_mig *asked, struct fg_proc *out, int max)
{
    static const struct { const char *name; int code; } errors[] = {
        {"not_supported", 3}, {"no_permission", 4}, {"unknown_error", 999},
    };
    const char *path = getenv("FAKEGPU_PROCESSES");
    char err[400], w[160], *text;
    struct schema sc;
    struct jv root;
    size_t len, i, k;
    int n = 0, j, mig, rc = 0, code = 0;

    if (!path || !*path)
        return 0;
    switch (read_text(path, &text, &len)) {
    case FG_LOAD_OK:
        break;
    case FG_LOAD_MISSING:
        return 0; /* no file: no process */
    default:
        return -999; /* read_text said why on stderr */
    }
    rc = jparse(text, len, &root, err, sizeof(err));
    free(text);
    if (rc < 0) {
        fprintf(stderr, "fakegpu: %s: %s\n", path, err);
        return -999;
    }
    memset(&sc, 0, sizeof(sc));
    if (root.t != JT_OBJ)
        rc = sfail(&sc, "top level", "must be an object");
    for (i = 0; rc == 0 && i < root.n; i++) {
        const struct jv *v = &root.items[i];
        for (mig = -1; mig < g->nmig; mig++)
            if (strcmp(root.keys[i], mig < 0 ? g->uuid : g->mig[mig].uuid) == 0)
                break;
        if (mig == g->nmig)
            continue; /* another card's */
        if (v->t == JT_STR || v->t == JT_NUM) {
            if ((mig < 0 ? NULL : &g->mig[mig]) != asked)
                continue; /* an error of another handle of this card */
            code = v->t == JT_NUM && !strpbrk(v->s, "-.eE") ? atoi(v->s) : 0;
            for (j = 0; v->t == JT_STR && j < (int)(sizeof(errors) / sizeof(errors[0])); j++)
                if (strcmp(v->s, errors[j].name) == 0)
                    code = errors[j].code;
            if (code <= 0)
                rc = sfail(&sc, root.keys[i], "must be not_supported, no_permission, unknown_error or an "
                           "nvmlReturn_t > 0");
            break;
        }
        if (v->t != JT_ARR) {
            rc = sfail(&sc, root.keys[i], "must be an array of processes or an error");
            break;
        }
        for (k = 0; k < v->n; k++) {
            snprintf(w, sizeof(w), "%s[%zu]", root.keys[i], k);
            if (n == max) {
                rc = sfail(&sc, w, "too many processes");
                break;
            }
            if (load_proc(&sc, &v->items[k], w, g->memory_total_mib, &out[n]) < 0) {
                rc = -1;
                break;
            }
            if (mig >= 0) { /* a MIG device's process runs on its GPU and compute instance */
                out[n].gpu_instance_id = g->mig[mig].gpu_instance_id;
                out[n].compute_instance_id = g->mig[mig].compute_instance_id;
            }
            n++;
        }
    }
    jfree(&root);
    if (rc == -1) {
        fprintf(stderr, "fakegpu: %s: %s\n", path, sc.err);
        return -999;
    }
    return code ? -code : n;
}
