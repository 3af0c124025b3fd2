/*
 * kvpool._kvsched: the KV connector's scheduler (include/kvpool/kv_connector.h,
 * kvp_kv_sched_*) for Python, reading vLLM's objects directly.
 *
 * Why C and not ctypes.  The scheduler hooks run on the engine's critical
 * path every step, for every running request.  Filling ctypes structs field
 * by field costs about a microsecond per request, more than the original
 * Python scheduler spends deciding; here one step with 64 running requests
 * is a few microseconds of attribute reads.  The extension holds no
 * scheduling logic: it turns vLLM's objects into the C views and calls the
 * C scheduler; every decision is the library's.
 *
 * Linking.  The module does not link libkvpool.so: kvpool/_lib.py loads the
 * library with RTLD_GLOBAL before importing this module, so the one library
 * the package found ($KVPOOL_LIB, the package copy or the system loader's)
 * provides the symbols.
 *
 * Request views.  The C scheduler keeps a pointer to the kvp_kv_request_t
 * given to update_state_after_alloc and reads it in later steps, so each
 * live request has one view_t here, owned by a capsule in self->views
 * (request id -> capsule).  A view copies what the scheduler reads: the
 * token ids and block hashes grow by appending, so a refresh copies only
 * what is new (a shrink, e.g. rejected speculative tokens, recopies).  Views
 * are refreshed whenever their request is handed to a hook, and dropped
 * after build_connector_meta has processed the request's id in
 * finished_req_ids.
 *
 * Objects read (duck-typed; vLLM 0.27..0.32 spellings):
 *   Request: request_id, num_computed_tokens, _all_token_ids (list) or
 *     all_token_ids, block_hashes (list of equal-length bytes).
 *   SchedulerOutput: finished_req_ids, preempted_req_ids (set or None),
 *     scheduled_new_reqs (req_id, num_computed_tokens, block_ids,
 *     prompt_token_ids, prefill_token_ids), scheduled_cached_reqs (req_ids,
 *     resumed_req_ids, new_block_ids, num_computed_tokens),
 *     num_scheduled_tokens (dict), partial_tail_offloads (dict, 0.27) or
 *     kv_connector_block_state.boundary_state_offloads (0.32).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool/kv_connector.h"

/* ------------------------------------------------------------------ arena */

/* Per-call scratch for the C views of one hook call, freed when it returns
 * (the scheduler copies what it keeps). */
typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk_t;

typedef struct arena {
    chunk_t *head;
} arena_t;

static void *arena_alloc(arena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        chunk_t *c = malloc(sizeof *c + cap);
        if (!c) {
            PyErr_NoMemory();
            return NULL;
        }
        c->next = a->head, c->used = 0, c->cap = cap;
        a->head = c;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

/* Empties the arena for the next call, keeping its newest chunk: a step's
 * views then cost no malloc once the arena has grown to a step's size. */
static void arena_reset(arena_t *a)
{
    chunk_t *keep = a->head;
    if (!keep)
        return;
    for (chunk_t *c = keep->next, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    keep->next = NULL;
    keep->used = 0;
}

static void arena_free(arena_t *a)
{
    while (a->head) {
        chunk_t *c = a->head;
        a->head = c->next;
        free(c);
    }
}

/* ------------------------------------------------------------------ values */

/* Attribute names, interned once (module init). */
#define ATTRS(X) X(num_tokens) X(num_computed_tokens) X(_all_token_ids) X(all_token_ids) X(block_hashes) X(request_id) X(req_id) X(block_ids) X(prompt_token_ids) X(prefill_token_ids) X(req_ids) X(resumed_req_ids) X(new_block_ids) X(finished_req_ids) X(preempted_req_ids) X(scheduled_new_reqs) X(scheduled_cached_reqs) X(num_scheduled_tokens) X(partial_tail_offloads) X(kv_connector_block_state) X(boundary_state_offloads)
#define DECL(n) static PyObject *A##n;
ATTRS(DECL)
#undef DECL
#define ATTR(o, n) PyObject_GetAttr((o), A##n)


static int int64_of(PyObject *o, int64_t *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int attr_int64(PyObject *o, PyObject *name, int64_t *out)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v)
        return -1;
    int rc = int64_of(v, out);
    Py_DECREF(v);
    return rc;
}

/* A list/tuple of ints into an arena array. */
static int ints_of(arena_t *a, PyObject *seq, const int64_t **ids_p, size_t *n_p)
{
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of ints");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int64_t *v = n ? arena_alloc(a, (size_t)n * sizeof *v) : NULL;
    if (n && !v) {
        Py_DECREF(fast);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++)
        if (int64_of(items[i], &v[i]) < 0) {
            Py_DECREF(fast);
            return -1;
        }
    Py_DECREF(fast);
    *ids_p = v;
    *n_p = (size_t)n;
    return 0;
}

/*
 * vLLM's tuple of block-id lists into a kvp_kv_blocks_t.  None or () is the
 * empty tuple.  proj (the connector's store group ids, n_proj of them) picks
 * and orders the groups; NULL takes every group.
 */
static int blocks_of(arena_t *a, PyObject *tup, const int *proj, int n_proj, kvp_kv_blocks_t *out)
{
    memset(out, 0, sizeof *out);
    if (tup == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(tup, "block ids: expected a tuple of lists");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n == 0) {
        Py_DECREF(fast);
        return 0;
    }
    Py_ssize_t ng = proj ? n_proj : n;
    kvp_kv_ids_t *g = arena_alloc(a, (size_t)ng * sizeof *g);
    if (!g) {
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t i = 0; i < ng; i++) {
        Py_ssize_t src = proj ? proj[i] : i;
        if (src >= n) {
            PyErr_Format(PyExc_ValueError, "block ids: %zd groups, store group %zd missing", n, src);
            Py_DECREF(fast);
            return -1;
        }
        if (ints_of(a, PySequence_Fast_GET_ITEM(fast, src), &g[i].ids, &g[i].n) < 0) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    out->groups = g;
    out->num_groups = (uint32_t)ng;
    return 0;
}

/* An iterable of str ids (a set, a list; None = empty) into an arena array.
 * The pointers are the str objects' UTF-8 caches: keep the container alive. */
static int ids_of(arena_t *a, PyObject *it, const char *const **ids_p, size_t *n_p)
{
    *ids_p = NULL, *n_p = 0;
    if (it == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(it, "expected an iterable of request ids");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    const char **v = n ? arena_alloc(a, (size_t)n * sizeof *v) : NULL;
    int rc = (n && !v) ? -1 : 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++)
        if (!(v[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i))))
            rc = -1;
    /* The strs live in the caller's container; fast may be a new list holding
     * the same objects, so the UTF-8 caches outlive it. */
    Py_DECREF(fast);
    *ids_p = v, *n_p = (size_t)n;
    return rc;
}

/* ------------------------------------------------------------------ views */

typedef struct view {
    kvp_kv_request_t req; /* what the scheduler reads */
    char *id;
    int64_t *toks;
    size_t tcap;
    uint8_t *hashes;
    size_t hcap;   /* bytes */
    PyObject *obj; /* the Request (a reference), refreshed from each step */
} view_t;

static void view_free(PyObject *cap)
{
    view_t *v = PyCapsule_GetPointer(cap, "kvpool.view");
    if (!v)
        return;
    Py_XDECREF(v->obj);
    free(v->id);
    free(v->toks);
    free(v->hashes);
    free(v);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q, *cap = c;
    return 0;
}

/* Copies the request's current counts, new tokens and new hashes. */
static int view_refresh(view_t *v, PyObject *req)
{
    if (attr_int64(req, Anum_computed_tokens, &v->req.num_computed_tokens) < 0)
        return -1;
    PyObject *toks = ATTR(req, _all_token_ids);
    if (!toks || !PyList_Check(toks)) {
        Py_XDECREF(toks);
        PyErr_Clear();
        PyObject *all = ATTR(req, all_token_ids);
        if (!all)
            return -1;
        toks = PySequence_List(all);
        Py_DECREF(all);
        if (!toks)
            return -1;
    }
    size_t n = (size_t)PyList_GET_SIZE(toks), have = v->req.num_all_token_ids;
    if (n < have)
        have = 0; /* shrank: recopy */
    if (grow((void **)&v->toks, &v->tcap, n, sizeof *v->toks) < 0) {
        Py_DECREF(toks);
        return -1;
    }
    for (size_t i = have; i < n; i++)
        if (int64_of(PyList_GET_ITEM(toks, (Py_ssize_t)i), &v->toks[i]) < 0) {
            Py_DECREF(toks);
            return -1;
        }
    Py_DECREF(toks);
    v->req.all_token_ids = v->toks;
    v->req.num_all_token_ids = n;
    v->req.num_tokens = (int64_t)n;

    PyObject *hl = ATTR(req, block_hashes);
    if (!hl)
        return -1;
    PyObject *fast = PySequence_Fast(hl, "block_hashes: expected a list of bytes");
    Py_DECREF(hl);
    if (!fast)
        return -1;
    size_t nh = (size_t)PySequence_Fast_GET_SIZE(fast), hh = v->req.num_block_hashes;
    if (nh < hh)
        hh = 0;
    int rc = 0;
    for (size_t i = hh; i < nh && rc == 0; i++) {
        char *b;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(fast, (Py_ssize_t)i), &b, &len) < 0) {
            rc = -1;
        } else if (len < 1 || len > KVP_HASH_MAX_LEN) {
            PyErr_Format(PyExc_ValueError, "block hash of %zd bytes (1..%d)", len, KVP_HASH_MAX_LEN);
            rc = -1;
        } else if (i > 0 && v->req.hash_len && (uint32_t)len != v->req.hash_len) {
            PyErr_Format(PyExc_ValueError, "block hashes of %u and %zd bytes", v->req.hash_len, len);
            rc = -1;
        } else {
            v->req.hash_len = (uint32_t)len;
            if ((rc = grow((void **)&v->hashes, &v->hcap, (i + 1) * (size_t)len, 1)) == 0)
                memcpy(v->hashes + i * (size_t)len, b, (size_t)len);
        }
    }
    Py_DECREF(fast);
    if (rc < 0)
        return -1;
    v->req.block_hashes = v->hashes;
    v->req.num_block_hashes = nh;
    if (nh == 0)
        v->req.hash_len = 0;
    return 0;
}

/* ------------------------------------------------------------------ the type */

typedef struct {
    PyObject_HEAD
    kvp_kv_sched_t *sched;
    kvp_kv_lookup_client_t client;
    PyObject *keep;  /* what owns the lookup client (kept alive) */
    PyObject *views; /* request id -> capsule(view_t) */
    int *proj;       /* store group ids, or NULL: all */
    int n_proj;
    bool token_ids;  /* ReqMetas carry their token ids (the original's); false: None */
    arena_t arena;   /* the C views of one hook call, reset after it */
} Sched;

static PyObject *ErrorFor(kvp_kv_err_kind_t kind)
{
    switch (kind) {
    case KVP_KV_ERR_ASSERTION:
        return PyExc_AssertionError;
    case KVP_KV_ERR_KEY:
        return PyExc_KeyError;
    case KVP_KV_ERR_VALUE:
        return PyExc_ValueError;
    case KVP_KV_ERR_TYPE:
        return PyExc_TypeError;
    default:
        return PyExc_RuntimeError;
    }
}

/* Raises what the original raises where the C call failed. */
static PyObject *sched_fail(Sched *self, kvp_status_t st)
{
    if (PyErr_Occurred())
        return NULL;
    const char *msg = NULL;
    kvp_kv_err_kind_t kind = kvp_kv_sched_last_error(self->sched, &msg);
    PyErr_Format(ErrorFor(kind), "kvpool scheduler: %s (%s)", msg && *msg ? msg : "failed",
                 kvp_status_name(st));
    return NULL;
}

static view_t *view_get(Sched *self, PyObject *req)
{
    PyObject *rid = ATTR(req, request_id);
    if (!rid)
        return NULL;
    if (!PyUnicode_Check(rid)) {
        Py_DECREF(rid);
        PyErr_SetString(PyExc_TypeError, "request.request_id must be a str");
        return NULL;
    }
    view_t *v = NULL;
    PyObject *cap = PyDict_GetItemWithError(self->views, rid);
    if (cap) {
        v = PyCapsule_GetPointer(cap, "kvpool.view");
    } else if (!PyErr_Occurred()) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(rid, &len);
        if (s && (v = calloc(1, sizeof *v)) && (v->id = malloc((size_t)len + 1))) {
            memcpy(v->id, s, (size_t)len + 1);
            v->req.req_id = v->id;
            cap = PyCapsule_New(v, "kvpool.view", view_free);
            if (!cap || PyDict_SetItem(self->views, rid, cap) < 0)
                v = NULL; /* freed with the capsule */
            Py_XDECREF(cap);
        } else if (s) {
            free(v);
            v = NULL;
            PyErr_NoMemory();
        }
    }
    Py_DECREF(rid);
    if (!v)
        return NULL;
    if (v->obj != req) {
        Py_XSETREF(v->obj, Py_NewRef(req));
    }
    return view_refresh(v, req) < 0 ? NULL : v;
}

/*
 * Refreshes every view from its Request, once per build_connector_meta,
 * before the C call.  Not only the step's scheduled ids: the original also
 * reads the live Request of ids it is not handed this step (K13's deferred
 * load metas and K14's offload-only metas take its block_hashes as they are
 * now), and the engine may have changed those Requests since their last
 * hook.  A view whose Request did not change costs three attribute reads.
 */
static int refresh_views(Sched *self)
{
    Py_ssize_t pos = 0;
    PyObject *id, *cap;
    while (PyDict_Next(self->views, &pos, &id, &cap)) {
        view_t *v = PyCapsule_GetPointer(cap, "kvpool.view");
        if (!v || (v->obj && view_refresh(v, v->obj) < 0))
            return -1;
    }
    return 0;
}

static int cfg_bool(PyObject *d, const char *k, bool *out)
{
    PyObject *v = PyDict_GetItemString(d, k);
    if (!v)
        return 0;
    int t = PyObject_IsTrue(v);
    if (t < 0)
        return -1;
    *out = t;
    return 0;
}

static int cfg_int(PyObject *d, const char *k, int64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, k);
    return v ? int64_of(v, out) : 0;
}

static int cfg_int32(PyObject *d, const char *k, int32_t *out)
{
    int64_t x = *out;
    if (cfg_int(d, k, &x) < 0)
        return -1;
    if (x < INT32_MIN || x > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s out of range", k);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

static int cfg_double(PyObject *d, const char *k, double *out)
{
    PyObject *v = PyDict_GetItemString(d, k);
    if (!v)
        return 0;
    double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* load_policy and its costs (rule F1; the C validate checks the values). */
static int cfg_load_policy(PyObject *d, kvp_kv_config_t *cfg)
{
    PyObject *pol = PyDict_GetItemString(d, "load_policy");
    if (pol) {
        const char *p = PyUnicode_AsUTF8(pol);
        if (!p)
            return -1;
        if (kvp_kv_load_policy_parse(p, &cfg->load_policy) != KVP_OK) {
            PyErr_Format(PyExc_ValueError, "load_policy %R: always or faster", pol);
            return -1;
        }
    }
    int64_t bpt = (int64_t)cfg->load_bytes_per_token;
    if (cfg_int(d, "load_bytes_per_token", &bpt) < 0)
        return -1;
    if (bpt < 0) {
        PyErr_SetString(PyExc_ValueError, "load_bytes_per_token must be >= 0");
        return -1;
    }
    cfg->load_bytes_per_token = (uint64_t)bpt;
    return cfg_double(d, "prefill_us_per_token", &cfg->prefill_us_per_token) < 0 ||
                   cfg_double(d, "load_bytes_per_s", &cfg->load_bytes_per_s) < 0 ||
                   cfg_double(d, "lookup_rtt_us", &cfg->lookup_rtt_us) < 0
               ? -1
               : 0;
}

static int Sched_init(Sched *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"config", "client_address", "keep", "store_groups", "token_ids", NULL};
    PyObject *cfgd, *keep = Py_None, *groups = Py_None;
    unsigned long long addr;
    int token_ids = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!K|OOp", kwlist, &PyDict_Type, &cfgd, &addr,
                                     &keep, &groups, &token_ids))
        return -1;
    self->token_ids = token_ids;
    if (self->sched) {
        PyErr_SetString(PyExc_RuntimeError, "Scheduler already initialised");
        return -1;
    }
    if (!addr) {
        PyErr_SetString(PyExc_ValueError, "client_address: the address of a kvp_kv_lookup_client_t");
        return -1;
    }
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    PyObject *role = PyDict_GetItemString(cfgd, "kv_role");
    if (role) {
        const char *r = PyUnicode_AsUTF8(role);
        if (!r)
            return -1;
        if (kvp_kv_role_parse(r, &cfg.kv_role) != KVP_OK) {
            PyErr_Format(PyExc_ValueError, "kv_role %R: kv_producer, kv_consumer or kv_both", role);
            return -1;
        }
    }
    PyObject *model = PyDict_GetItemString(cfgd, "model_name");
    PyObject *prefix = PyDict_GetItemString(cfgd, "cache_prefix");
    cfg.model_name = model && model != Py_None ? PyUnicode_AsUTF8(model) : NULL;
    cfg.cache_prefix = prefix && prefix != Py_None ? PyUnicode_AsUTF8(prefix) : NULL;
    bool use_mla = cfg.use_mla;
    if (PyErr_Occurred() || cfg_bool(cfgd, "load_async", &cfg.load_async) < 0 ||
        cfg_bool(cfgd, "lookup_async", &cfg.lookup_async) < 0 ||
        cfg_bool(cfgd, "enable_lookup", &cfg.enable_lookup) < 0 ||
        cfg_bool(cfgd, "partial_hits", &cfg.partial_hits) < 0 ||
        cfg_bool(cfgd, "use_mla", &use_mla) < 0 ||
        cfg_bool(cfgd, "fix_k12_save_without_new_blocks", &cfg.fix_k12_save_without_new_blocks) < 0 ||
        cfg_int(cfgd, "block_size", &cfg.block_size) < 0 ||
        cfg_int(cfgd, "hash_block_size", &cfg.hash_block_size) < 0 ||
        cfg_int32(cfgd, "tp_size", &cfg.tp_size) < 0 || cfg_int32(cfgd, "pp_size", &cfg.pp_size) < 0 ||
        cfg_int32(cfgd, "pcp_size", &cfg.pcp_size) < 0 ||
        cfg_int32(cfgd, "dcp_size", &cfg.dcp_size) < 0 ||
        cfg_int32(cfgd, "num_kv_heads", &cfg.num_kv_heads) < 0 || cfg_load_policy(cfgd, &cfg) < 0)
        return -1;
    cfg.use_mla = use_mla;
    if (groups != Py_None) {
        PyObject *fast = PySequence_Fast(groups, "store_groups: a sequence of group ids");
        if (!fast)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
        self->proj = n ? malloc((size_t)n * sizeof *self->proj) : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t g;
            if (!self->proj || int64_of(PySequence_Fast_GET_ITEM(fast, i), &g) < 0 || g < 0 ||
                g > 1 << 20) {
                Py_DECREF(fast);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "store_groups: bad group id");
                return -1;
            }
            self->proj[i] = (int)g;
        }
        self->n_proj = (int)n;
        Py_DECREF(fast);
    }
    self->client = *(const kvp_kv_lookup_client_t *)(uintptr_t)addr;
    kvp_status_t st = kvp_kv_sched_create(&cfg, self->client, &self->sched);
    if (st != KVP_OK) {
        PyErr_Format(PyExc_ValueError, "kvpool scheduler config refused: %s (see the log)",
                     kvp_status_name(st));
        return -1;
    }
    Py_INCREF(keep);
    self->keep = keep;
    if (!(self->views = PyDict_New()))
        return -1;
    return 0;
}

static void Sched_dealloc(Sched *self)
{
    if (self->sched)
        kvp_kv_sched_destroy(self->sched); /* before the views it points to */
    Py_XDECREF(self->views);
    Py_XDECREF(self->keep);
    arena_free(&self->arena);
    free(self->proj);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define NEED_SCHED(self)                                                                        \
    do {                                                                                        \
        if (!(self)->sched) {                                                                   \
            PyErr_SetString(PyExc_RuntimeError, "Scheduler not initialised");                   \
            return NULL;                                                                        \
        }                                                                                       \
    } while (0)

static PyObject *Sched_get_num_new_matched_tokens(Sched *self, PyObject *args)
{
    PyObject *req;
    long long computed;
    if (!PyArg_ParseTuple(args, "OL", &req, &computed))
        return NULL;
    NEED_SCHED(self);
    view_t *v = view_get(self, req);
    /* K2 and the lookup read the request's num_tokens (vLLM: the length of
     * its token list; a replay may say otherwise). */
    if (!v || attr_int64(req, Anum_tokens, &v->req.num_tokens) < 0)
        return NULL;
    int64_t num = 0;
    bool async = false;
    kvp_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = kvp_kv_sched_get_num_new_matched_tokens(self->sched, &v->req, computed, &num, &async);
    Py_END_ALLOW_THREADS
    if (st != KVP_OK)
        return sched_fail(self, st);
    if (num < 0)
        return Py_BuildValue("(OO)", Py_None, Py_False);
    return Py_BuildValue("(LO)", (long long)num, async ? Py_True : Py_False);
}

static PyObject *Sched_update_state_after_alloc(Sched *self, PyObject *args)
{
    PyObject *req, *blocks;
    long long ext;
    if (!PyArg_ParseTuple(args, "OOL", &req, &blocks, &ext))
        return NULL;
    NEED_SCHED(self);
    view_t *v = view_get(self, req);
    if (!v)
        return NULL;
    arena_t a = self->arena;
    kvp_kv_blocks_t b;
    PyObject *ret = NULL;
    if (blocks_of(&a, blocks, self->proj, self->n_proj, &b) == 0) {
        kvp_status_t st = kvp_kv_sched_update_state_after_alloc(self->sched, &v->req, &b, ext);
        ret = st == KVP_OK ? Py_NewRef(Py_None) : sched_fail(self, st);
    }
    arena_reset(&a);
    self->arena = a;
    return ret;
}

/* One (group_id, block_id, boundary_tokens) list of a step's tail offloads. */
static int tails_of(arena_t *a, PyObject *dict, const kvp_kv_tail_req_t **out, size_t *n_out)
{
    *out = NULL, *n_out = 0;
    if (!dict || dict == Py_None || !PyDict_Check(dict) || PyDict_GET_SIZE(dict) == 0)
        return 0;
    Py_ssize_t n = PyDict_GET_SIZE(dict), pos = 0, i = 0;
    kvp_kv_tail_req_t *t = arena_alloc(a, (size_t)n * sizeof *t);
    if (!t)
        return -1;
    PyObject *k, *val;
    while (PyDict_Next(dict, &pos, &k, &val)) {
        PyObject *fast = PySequence_Fast(val, "tail offloads: a list of tuples");
        if (!fast || !(t[i].req_id = PyUnicode_AsUTF8(k))) {
            Py_XDECREF(fast);
            return -1;
        }
        Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
        kvp_kv_tail_offload_t *o = m ? arena_alloc(a, (size_t)m * sizeof *o) : NULL;
        for (Py_ssize_t j = 0; j < m; j++) {
            long long g, blk, bt;
            if (!o || !PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, j), "LLL", &g, &blk, &bt)) {
                Py_DECREF(fast);
                return -1;
            }
            o[j].group_id = g, o[j].cow_block_id = blk, o[j].boundary_tokens = bt;
        }
        Py_DECREF(fast);
        t[i].offloads = o, t[i].num_offloads = (size_t)m;
        i++;
    }
    *out = t, *n_out = (size_t)n;
    return 0;
}

static int new_reqs_of(Sched *self, arena_t *a, PyObject *list, PyObject *nst,
                       kvp_kv_sched_output_t *so)
{
    PyObject *fast = PySequence_Fast(list, "scheduled_new_reqs: a list");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    kvp_kv_new_req_t *r = n ? arena_alloc(a, (size_t)n * sizeof *r) : NULL;
    int rc = n && !r ? -1 : 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        PyObject *nr = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *id = ATTR(nr, req_id);
        PyObject *blocks = ATTR(nr, block_ids);
        PyObject *prompt = ATTR(nr, prompt_token_ids);
        PyObject *prefill = ATTR(nr, prefill_token_ids);
        if (!prefill)
            PyErr_Clear(), prefill = Py_NewRef(Py_None);
        memset(&r[i], 0, sizeof r[i]);
        rc = -1;
        if (id && blocks && prompt && (r[i].req_id = PyUnicode_AsUTF8(id)) &&
            attr_int64(nr, Anum_computed_tokens, &r[i].num_computed_tokens) == 0 &&
            blocks_of(a, blocks, self->proj, self->n_proj, &r[i].block_ids) == 0 &&
            (prompt == Py_None ||
             ints_of(a, prompt, &r[i].prompt_token_ids, &r[i].num_prompt_token_ids) == 0) &&
            (prefill == Py_None ||
             ints_of(a, prefill, &r[i].prefill_token_ids, &r[i].num_prefill_token_ids) == 0)) {
            r[i].has_prefill_token_ids = prefill != Py_None;
            PyObject *ns = PyDict_GetItemWithError(nst, id);
            r[i].num_scheduled_tokens = KVP_KV_NO_ENTRY;
            rc = ns ? int64_of(ns, &r[i].num_scheduled_tokens) : (PyErr_Occurred() ? -1 : 0);
            /* the id's UTF-8 cache lives in the NewRequestData's str */
        }
        Py_XDECREF(id);
        Py_XDECREF(blocks);
        Py_XDECREF(prompt);
        Py_XDECREF(prefill);
    }
    Py_DECREF(fast);
    so->new_reqs = r, so->num_new_reqs = (size_t)n;
    return rc;
}

static int cached_reqs_of(Sched *self, arena_t *a, PyObject *cached, PyObject *nst,
                          kvp_kv_sched_output_t *so)
{
    PyObject *ids = ATTR(cached, req_ids);
    PyObject *resumed = ATTR(cached, resumed_req_ids);
    PyObject *nb = ATTR(cached, new_block_ids);
    PyObject *nc = ATTR(cached, num_computed_tokens);
    PyObject *fid = ids ? PySequence_Fast(ids, "req_ids: a list") : NULL;
    PyObject *fnb = nb ? PySequence_Fast(nb, "new_block_ids: a list") : NULL;
    PyObject *fnc = nc ? PySequence_Fast(nc, "num_computed_tokens: a list") : NULL;
    int rc = -1;
    if (!fid || !fnb || !fnc || !resumed)
        goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fid);
    if (PySequence_Fast_GET_SIZE(fnb) != n || PySequence_Fast_GET_SIZE(fnc) != n) {
        PyErr_SetString(PyExc_ValueError, "scheduled_cached_reqs: lists of different lengths");
        goto out;
    }
    kvp_kv_cached_req_t *c = n ? arena_alloc(a, (size_t)n * sizeof *c) : NULL;
    if (n && !c)
        goto out;
    bool any_resumed = resumed != Py_None && PyObject_Length(resumed) > 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PySequence_Fast_GET_ITEM(fid, i);
        memset(&c[i], 0, sizeof c[i]);
        if (!(c[i].req_id = PyUnicode_AsUTF8(id)) ||
            int64_of(PySequence_Fast_GET_ITEM(fnc, i), &c[i].num_computed_tokens) < 0 ||
            blocks_of(a, PySequence_Fast_GET_ITEM(fnb, i), self->proj, self->n_proj,
                      &c[i].new_block_ids) < 0)
            goto out;
        PyObject *ns = PyDict_GetItemWithError(nst, id);
        c[i].num_scheduled_tokens = KVP_KV_NO_ENTRY;
        if ((ns && int64_of(ns, &c[i].num_scheduled_tokens) < 0) || (!ns && PyErr_Occurred()))
            goto out;
        if (any_resumed) {
            int t = PySequence_Contains(resumed, id);
            if (t < 0)
                goto out;
            c[i].resumed = t;
        }
    }
    so->cached_reqs = c, so->num_cached_reqs = (size_t)n;
    rc = 0;
out:
    Py_XDECREF(fid);
    Py_XDECREF(fnb);
    Py_XDECREF(fnc);
    Py_XDECREF(ids);
    Py_XDECREF(resumed);
    Py_XDECREF(nb);
    Py_XDECREF(nc);
    return rc;
}

static PyObject *Sched_build_connector_meta(Sched *self, PyObject *args)
{
    PyObject *out;
    if (!PyArg_ParseTuple(args, "O", &out))
        return NULL;
    NEED_SCHED(self);
    arena_t a = self->arena;
    kvp_kv_sched_output_t so;
    memset(&so, 0, sizeof so);
    PyObject *fin = ATTR(out, finished_req_ids);
    PyObject *pre = ATTR(out, preempted_req_ids);
    PyObject *newr = ATTR(out, scheduled_new_reqs);
    PyObject *cached = ATTR(out, scheduled_cached_reqs);
    PyObject *nst = ATTR(out, num_scheduled_tokens);
    PyObject *tails = ATTR(out, partial_tail_offloads);
    PyObject *finl = NULL, *prel = NULL, *ret = NULL;
    if (!tails) {
        PyErr_Clear();
        PyObject *bs = ATTR(out, kv_connector_block_state);
        if (!bs)
            PyErr_Clear();
        else if (bs != Py_None && !(tails = ATTR(bs, boundary_state_offloads)))
            PyErr_Clear();
        Py_XDECREF(bs);
    }
    if (!fin || !pre || !newr || !cached || !nst)
        goto out;
    if (!PyDict_Check(nst)) {
        PyErr_SetString(PyExc_TypeError, "num_scheduled_tokens must be a dict");
        goto out;
    }
    /* Sets become lists once: the C side wants arrays, and the views of the
     * finished ids are dropped from the same list afterwards. */
    if (!(finl = PySequence_List(fin)) ||
        !(prel = pre == Py_None ? Py_NewRef(Py_None) : PySequence_List(pre)) ||
        ids_of(&a, finl, &so.finished_req_ids, &so.num_finished) < 0 ||
        ids_of(&a, prel, &so.preempted_req_ids, &so.num_preempted) < 0 ||
        refresh_views(self) < 0 ||
        new_reqs_of(self, &a, newr, nst, &so) < 0 || cached_reqs_of(self, &a, cached, nst, &so) < 0 ||
        tails_of(&a, tails, &so.partial_tails, &so.num_partial_tails) < 0)
        goto out;
    const kvp_kv_meta_t *meta = NULL;
    kvp_status_t st = kvp_kv_sched_build_connector_meta(self->sched, &so, &meta);
    if (st != KVP_OK) {
        ret = sched_fail(self, st);
    } else {
        uint8_t *buf = NULL;
        size_t len = 0;
        kvp_kv_meta_t lean;
        if (!self->token_ids && meta->num_requests) {
            /* The workers never read a ReqMeta's token ids (the original
             * keeps them for KV events): most of a prefill step's bytes. */
            kvp_kv_req_meta_t *r = arena_alloc(&a, meta->num_requests * sizeof *r);
            for (size_t i = 0; r && i < meta->num_requests; i++) {
                r[i] = meta->requests[i];
                r[i].token_ids = NULL, r[i].num_token_ids = 0, r[i].has_token_ids = false;
            }
            lean = *meta;
            lean.requests = r;
            meta = r ? &lean : NULL; /* NULL: out of memory (raised) */
        }
        st = meta ? kvp_kv_meta_encode(meta, &buf, &len) : KVP_ERR_NO_MEMORY;
        if (st != KVP_OK) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
        } else {
            ret = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
            kvp_kv_meta_buf_free(buf, len);
        }
    }
    /* The finished ids are processed (or the step failed where the original
     * fails, and the engine drops them too): their views go.  An exception
     * being raised is kept across the deletions. */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(finl); i++)
        if (PyDict_DelItem(self->views, PyList_GET_ITEM(finl, i)) < 0)
            PyErr_Clear(); /* never viewed */
    PyErr_Restore(et, ev, tb);
out:
    arena_reset(&a);
    self->arena = a;
    Py_XDECREF(finl);
    Py_XDECREF(prel);
    Py_XDECREF(fin);
    Py_XDECREF(pre);
    Py_XDECREF(newr);
    Py_XDECREF(cached);
    Py_XDECREF(nst);
    Py_XDECREF(tails);
    return ret;
}

static PyObject *Sched_request_finished(Sched *self, PyObject *args)
{
    const char *id;
    Py_ssize_t nblocks;
    if (!PyArg_ParseTuple(args, "sn", &id, &nblocks))
        return NULL;
    NEED_SCHED(self);
    if (nblocks < 0) {
        PyErr_SetString(PyExc_ValueError, "block count < 0");
        return NULL;
    }
    bool delay = false;
    kvp_status_t st = kvp_kv_sched_request_finished_all_groups(self->sched, id, (size_t)nblocks, &delay);
    if (st != KVP_OK)
        return sched_fail(self, st);
    return PyBool_FromLong(delay);
}

/* reset_cache: the connector's (pending load specs go, then reset_store);
 * reset_store: the original scheduler's K18 alone (load specs stay), which
 * is what a replay of the original calls. */
static PyObject *sched_reset(Sched *self, kvp_status_t (*reset)(kvp_kv_sched_t *, bool *))
{
    NEED_SCHED(self);
    bool ok = false;
    kvp_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = reset(self->sched, &ok);
    Py_END_ALLOW_THREADS
    if (st != KVP_OK)
        return sched_fail(self, st);
    return PyBool_FromLong(ok);
}

static PyObject *Sched_reset_cache(Sched *self, PyObject *noargs)
{
    (void)noargs;
    return sched_reset(self, kvp_kv_sched_reset_cache);
}

static PyObject *Sched_reset_store(Sched *self, PyObject *noargs)
{
    (void)noargs;
    return sched_reset(self, kvp_kv_sched_reset_store);
}

static PyObject *Sched_stats(Sched *self, PyObject *noargs)
{
    (void)noargs;
    NEED_SCHED(self);
    kvp_kv_sched_stats_t s;
    kvp_kv_sched_stats(self->sched, &s);
    return Py_BuildValue("{snsnsnsnsnsKsK}", "load_specs", (Py_ssize_t)s.num_load_specs,
                         "trackers", (Py_ssize_t)s.num_trackers, "unfinished",
                         (Py_ssize_t)s.num_unfinished, "unfinished_ids",
                         (Py_ssize_t)s.num_unfinished_ids, "views", PyDict_GET_SIZE(self->views),
                         "loads_declined", (unsigned long long)s.loads_declined,
                         "tokens_declined", (unsigned long long)s.tokens_declined);
}

static PyObject *Sched_set_load_bandwidth(Sched *self, PyObject *args)
{
    double bw;
    if (!PyArg_ParseTuple(args, "d", &bw))
        return NULL;
    NEED_SCHED(self);
    if (kvp_kv_sched_set_load_bandwidth(self->sched, bw) != KVP_OK) {
        PyErr_Format(PyExc_ValueError, "load bandwidth %R: a finite number of bytes/s >= 0",
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Sched_load_spec(Sched *self, PyObject *args)
{
    const char *id;
    if (!PyArg_ParseTuple(args, "s", &id))
        return NULL;
    NEED_SCHED(self);
    kvp_kv_load_spec_t ls;
    if (kvp_kv_sched_load_spec(self->sched, id, &ls) != KVP_OK)
        Py_RETURN_NONE;
    return Py_BuildValue("(LLO)", (long long)ls.vllm_cached_tokens,
                         (long long)ls.kvpool_cached_tokens, ls.can_load ? Py_True : Py_False);
}

static PyMethodDef Sched_methods[] = {
    {"get_num_new_matched_tokens", (PyCFunction)Sched_get_num_new_matched_tokens, METH_VARARGS,
     "(request, num_computed_tokens) -> (int | None, bool)"},
    {"update_state_after_alloc", (PyCFunction)Sched_update_state_after_alloc, METH_VARARGS,
     "(request, block_ids: tuple[list[int], ...], num_external_tokens)"},
    {"build_connector_meta", (PyCFunction)Sched_build_connector_meta, METH_VARARGS,
     "(scheduler_output) -> bytes (the msgpack metadata)"},
    {"request_finished", (PyCFunction)Sched_request_finished, METH_VARARGS,
     "(request_id, num_blocks) -> bool (delay freeing)"},
    {"reset_cache", (PyCFunction)Sched_reset_cache, METH_NOARGS, "() -> bool (ACK)"},
    {"reset_store", (PyCFunction)Sched_reset_store, METH_NOARGS,
     "() -> bool (ACK); load specs stay (the original's reset_store)"},
    {"stats", (PyCFunction)Sched_stats, METH_NOARGS, "() -> dict"},
    {"set_load_bandwidth", (PyCFunction)Sched_set_load_bandwidth, METH_VARARGS,
     "(bytes_per_s): the measured load bandwidth (load_policy faster; 0 = unknown)"},
    {"load_spec", (PyCFunction)Sched_load_spec, METH_VARARGS,
     "(request_id) -> (vllm_cached, kvpool_cached, can_load) | None"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SchedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpool._kvsched.Scheduler",
    .tp_basicsize = sizeof(Sched),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The C KV scheduler over vLLM's objects (see kvpool/kv.py: Scheduler).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sched_init,
    .tp_dealloc = (destructor)Sched_dealloc,
    .tp_methods = Sched_methods,
};

static struct PyModuleDef kvsched_module = {
    PyModuleDef_HEAD_INIT, "kvpool._kvsched", "The KV connector's scheduler over vLLM's objects.",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvsched(void)
{
#define INTERN(n)                                                                               \
    if (!(A##n = PyUnicode_InternFromString(#n)))                                               \
        return NULL;
    ATTRS(INTERN)
#undef INTERN
    if (PyType_Ready(&SchedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&kvsched_module);
    if (!m)
        return NULL;
    Py_INCREF(&SchedType);
    if (PyModule_AddObject(m, "Scheduler", (PyObject *)&SchedType) < 0) {
        Py_DECREF(&SchedType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
